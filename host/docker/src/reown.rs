//! Gives every entry of a tar stream one owner, on the way to the engine:
//! for a container whose user is a numeric `UID[:GID]` the image's user
//! database does not list, where the engine's `copyUIDGID` (which looks
//! the user up by name) fails. Berth's clean archives carry no owners of
//! their own (uid 0), so without this a restore would leave the workspace
//! unwritable to its user, who has no capability to change it.
//!
//! Tar is a sequence of 512-byte blocks: a header (whose size field says
//! how many data blocks follow), its data, the next header. Each header's
//! uid and gid fields are rewritten and its checksum recomputed; data
//! blocks and the zero blocks that end the archive pass unchanged.

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

const BLOCK: usize = 512;

/// The state of one pass over a tar stream.
struct Reowner {
    uid: u32,
    gid: u32,
    /// Data blocks still to come before the next header.
    data_blocks: u64,
    pending: BytesMut,
}

/// An octal field of `width` bytes, NUL-terminated, as tar writes it.
fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(&text.as_bytes()[text.len() - digits..]);
    field[digits] = 0;
}

/// A numeric field: octal text, or base-256 (high bit set) for large
/// values.
fn numeric(field: &[u8]) -> u64 {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        return field[1..]
            .iter()
            .fold(u64::from(field[0] & 0x7f), |n, b| (n << 8) | u64::from(*b));
    }
    let text = std::str::from_utf8(field).unwrap_or("");
    u64::from_str_radix(text.trim_matches(|c: char| c == '\0' || c == ' '), 8).unwrap_or(0)
}

impl Reowner {
    fn block(&mut self, block: &mut [u8]) {
        if self.data_blocks > 0 {
            self.data_blocks -= 1;
            return;
        }
        if block.iter().all(|b| *b == 0) {
            return;
        }
        octal(&mut block[108..116], u64::from(self.uid));
        octal(&mut block[116..124], u64::from(self.gid));
        block[148..156].fill(b' ');
        let sum: u64 = block.iter().map(|b| u64::from(*b)).sum();
        let text = format!("{sum:06o}\0 ");
        block[148..156].copy_from_slice(text.as_bytes());
        let size = numeric(&block[124..136]);
        // Hard links, symlinks, directories and the like have no data,
        // whatever their size field says.
        let has_data = matches!(
            block[156],
            0 | b'0' | b'7' | b'x' | b'g' | b'L' | b'K' | b'S'
        );
        if has_data {
            self.data_blocks = size.div_ceil(BLOCK as u64);
        }
    }

    /// The whole blocks of `chunk` and what came before it, re-owned; a
    /// partial block waits for the next chunk.
    fn feed(&mut self, chunk: &[u8]) -> Bytes {
        self.pending.extend_from_slice(chunk);
        let whole = self.pending.len() / BLOCK * BLOCK;
        let mut out = self.pending.split_to(whole);
        for block in out.chunks_mut(BLOCK) {
            self.block(block);
        }
        out.freeze()
    }
}

/// `stream`, every entry owned by `uid`:`gid`.
pub(crate) fn reown<S>(stream: S, uid: u32, gid: u32) -> impl Stream<Item = std::io::Result<Bytes>>
where
    S: Stream<Item = std::io::Result<Bytes>>,
{
    let mut state = Reowner {
        uid,
        gid,
        data_blocks: 0,
        pending: BytesMut::new(),
    };
    let mut ended = false;
    stream
        .map(Some)
        .chain(futures::stream::once(async { None }))
        .filter_map(move |item| {
            let out = match item {
                Some(Ok(chunk)) => Some(Ok(state.feed(&chunk))),
                Some(Err(e)) => Some(Err(e)),
                None if ended => None,
                None => {
                    ended = true;
                    let rest = state.pending.split().freeze();
                    (!rest.is_empty()).then_some(Ok(rest))
                }
            };
            futures::future::ready(out)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(seed: u64) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut rng = seed;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for i in 0..(next() % 12 + 1) {
            let size = (next() % 3000) as usize;
            let data: Vec<u8> = (0..size).map(|j| (j as u64 ^ seed) as u8).collect();
            let mut h = tar::Header::new_gnu();
            h.set_size(size as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            // Long names need GNU extension blocks of their own.
            let name = format!("{}/f{i}", "d".repeat((next() % 150) as usize + 1));
            b.append_data(&mut h, name, data.as_slice()).unwrap();
            let mut d = tar::Header::new_gnu();
            d.set_entry_type(tar::EntryType::Directory);
            d.set_size(0);
            d.set_mode(0o755);
            b.append_data(&mut d, format!("dir{i}/"), std::io::empty())
                .unwrap();
        }
        b.into_inner().unwrap()
    }

    #[tokio::test]
    async fn every_entry_gets_the_owner_and_nothing_else_changes() {
        for seed in 1..40u64 {
            let tar = archive(seed * 7919);
            // Chunks of every size, so blocks straddle them.
            let cut = (seed as usize * 97) % 700 + 1;
            let chunks: Vec<std::io::Result<Bytes>> = tar
                .chunks(cut)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let out: Vec<u8> = reown(futures::stream::iter(chunks), 1000, 1001)
                .map(|c| c.unwrap())
                .collect::<Vec<_>>()
                .await
                .concat();
            assert_eq!(out.len(), tar.len());
            let mut before = tar::Archive::new(tar.as_slice());
            let mut after = tar::Archive::new(out.as_slice());
            let a: Vec<_> = before
                .entries()
                .unwrap()
                .map(|e| e.unwrap().path().unwrap().into_owned())
                .collect();
            let mut n = 0;
            for (entry, path) in after.entries().unwrap().zip(&a) {
                let mut entry = entry.unwrap();
                assert_eq!(&entry.path().unwrap().into_owned(), path);
                assert_eq!(entry.header().uid().unwrap(), 1000, "seed {seed}");
                assert_eq!(entry.header().gid().unwrap(), 1001);
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
                assert_eq!(data.len() as u64, entry.header().size().unwrap());
                n += 1;
            }
            assert_eq!(n, a.len(), "seed {seed}");
        }
    }
}
