//! Deterministic test archives of any size, generated and verified as
//! streams so the suite itself runs in constant memory.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A reproducible pseudo-random byte stream of a given length, hashing what
/// it emits.
pub struct PatternReader {
    state: u64,
    remaining: u64,
    fail_after: Option<u64>,
    emitted: u64,
    hasher: blake3::Hasher,
}

impl PatternReader {
    /// `len` bytes from `seed`.
    pub fn new(seed: u64, len: u64) -> Self {
        PatternReader {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            remaining: len,
            fail_after: None,
            emitted: 0,
            hasher: blake3::Hasher::new(),
        }
    }

    /// Like [`PatternReader::new`], but the read after `after` bytes fails:
    /// a producer that breaks part-way.
    pub fn failing(seed: u64, len: u64, after: u64) -> Self {
        let mut r = Self::new(seed, len);
        r.fail_after = Some(after);
        r
    }

    /// The BLAKE3 digest of the whole stream, computed without keeping it.
    pub fn digest_of(seed: u64, len: u64) -> blake3::Hash {
        let mut r = Self::new(seed, len);
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = r.fill(&mut buf);
            if n == 0 {
                return r.hasher.finalize();
            }
        }
    }

    fn fill(&mut self, out: &mut [u8]) -> usize {
        let n = (out.len() as u64).min(self.remaining) as usize;
        let mut i = 0;
        while i < n {
            // xorshift64*
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            let v = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            let take = (n - i).min(8);
            out[i..i + take].copy_from_slice(&v[..take]);
            i += take;
        }
        self.hasher.update(&out[..n]);
        self.remaining -= n as u64;
        self.emitted += n as u64;
        n
    }
}

impl AsyncRead for PatternReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut limit = buf.remaining();
        if let Some(after) = self.fail_after {
            if self.emitted >= after {
                return Poll::Ready(Err(io::Error::other(
                    "simulated producer failure (the archive stream broke mid-way)",
                )));
            }
            limit = limit.min((after - self.emitted) as usize);
        }
        // Keep chunks modest so a failing stream fails part-way.
        limit = limit.min(256 * 1024);
        let dst = buf.initialize_unfilled_to(limit);
        let n = self.fill(dst);
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// A sink that hashes and counts what it receives and keeps nothing.
#[derive(Default)]
pub struct DigestWriter {
    hasher: blake3::Hasher,
    len: u64,
}

impl DigestWriter {
    /// Digest and length of everything written.
    pub fn finish(&self) -> (blake3::Hash, u64) {
        (self.hasher.finalize(), self.len)
    }
}

impl AsyncWrite for DigestWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.hasher.update(buf);
        self.len += buf.len() as u64;
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn reproducible_and_failing() {
        let mut a = Vec::new();
        PatternReader::new(7, 100_003)
            .read_to_end(&mut a)
            .await
            .unwrap();
        assert_eq!(a.len(), 100_003);
        assert_eq!(blake3::hash(&a), PatternReader::digest_of(7, 100_003));
        let mut b = Vec::new();
        let err = PatternReader::failing(7, 100_003, 5000)
            .read_to_end(&mut b)
            .await
            .unwrap_err();
        assert_eq!(b.len(), 5000);
        assert!(err.to_string().contains("simulated"));
    }
}
