//! Content-defined chunking of a workspace tar: FastCDC (v2020) cut points,
//! plus a cut forced at the start and at the end of every large file's data,
//! so a large file's chunks depend on its bytes alone, not on the headers and
//! small files around it.
//!
//! The chunker is fed the stream in pieces of any size and hands out chunks
//! through a callback; it holds at most about two maximum-size chunks.

use fastcdc::v2020::{self, Normalization};
use serde::{Deserialize, Serialize};

/// Chunk size bounds, recorded in every index (a restore does not need
/// them; a stop deduplicates best against a parent cut the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerParams {
    /// Smallest chunk FastCDC cuts (forced cuts may make smaller ones).
    pub min: u32,
    /// Average chunk size FastCDC aims for.
    pub avg: u32,
    /// Largest chunk.
    pub max: u32,
}

impl Default for ChunkerParams {
    /// 64 KiB / 256 KiB / 1 MiB.
    fn default() -> Self {
        ChunkerParams {
            min: 64 * 1024,
            avg: 256 * 1024,
            max: 1024 * 1024,
        }
    }
}

impl ChunkerParams {
    /// Whether FastCDC accepts these bounds.
    pub fn is_valid(&self) -> bool {
        let (min, avg, max) = (self.min as usize, self.avg as usize, self.max as usize);
        (v2020::MINIMUM_MIN..=v2020::MINIMUM_MAX).contains(&min)
            && (v2020::AVERAGE_MIN..=v2020::AVERAGE_MAX).contains(&avg)
            && (v2020::MAXIMUM_MIN..=v2020::MAXIMUM_MAX).contains(&max)
            && min <= avg
            && avg <= max
    }
}

/// Where the tar walker is: which bytes of the stream are headers and which
/// are a file's data, so forced cuts can be placed around large files.
#[derive(Debug)]
enum TarPosition {
    /// Collecting a 512-byte header block (bytes seen so far).
    Header(Vec<u8>),
    /// Inside an entry's data: bytes left, padding after, and whether the
    /// data is large enough to be cut on its own.
    Data {
        left: u64,
        padding: u64,
        large: bool,
    },
    /// Inside the padding after an entry's data.
    Padding(u64),
}

/// What the walker says about the next bytes.
enum Step {
    /// `n` bytes with nothing special at their end.
    Plain(usize),
    /// `n` bytes, then a forced cut.
    CutAfter(usize),
}

/// Walks the tar structure. Misparsing can only cost deduplication, never
/// correctness: the chunks always concatenate to the input.
struct TarWalker {
    position: TarPosition,
    large_from: u64,
}

impl TarWalker {
    fn new(large_from: u64) -> Self {
        TarWalker {
            position: TarPosition::Header(Vec::with_capacity(512)),
            large_from,
        }
    }

    /// How many of the next `available` bytes to take, and whether a cut
    /// follows them.
    fn step(&mut self, data: &[u8]) -> Step {
        match &mut self.position {
            TarPosition::Header(block) => {
                let take = (512 - block.len()).min(data.len());
                block.extend_from_slice(&data[..take]);
                if block.len() < 512 {
                    return Step::Plain(take);
                }
                let size = header_data_size(block);
                let padding = (512 - size % 512) % 512;
                let large = size >= self.large_from;
                self.position = if size == 0 {
                    TarPosition::Header(Vec::with_capacity(512))
                } else {
                    TarPosition::Data {
                        left: size,
                        padding,
                        large,
                    }
                };
                if large {
                    Step::CutAfter(take)
                } else {
                    Step::Plain(take)
                }
            }
            TarPosition::Data {
                left,
                padding,
                large,
            } => {
                let take = (*left).min(data.len() as u64) as usize;
                *left -= take as u64;
                if *left > 0 {
                    return Step::Plain(take);
                }
                let large = *large;
                self.position = if *padding > 0 {
                    TarPosition::Padding(*padding)
                } else {
                    TarPosition::Header(Vec::with_capacity(512))
                };
                if large {
                    Step::CutAfter(take)
                } else {
                    Step::Plain(take)
                }
            }
            TarPosition::Padding(left) => {
                let take = (*left).min(data.len() as u64) as usize;
                *left -= take as u64;
                if *left == 0 {
                    self.position = TarPosition::Header(Vec::with_capacity(512));
                }
                Step::Plain(take)
            }
        }
    }
}

/// The data size a header announces (0 for entries that carry none, and
/// for blocks that are not headers, such as the end-of-archive zeros).
fn header_data_size(block: &[u8]) -> u64 {
    match block[156] {
        b'1' | b'2' | b'3' | b'4' | b'5' | b'6' => return 0,
        _ => {}
    }
    let field = &block[124..136];
    if field[0] & 0x80 != 0 {
        // GNU base-256.
        let mut n: u64 = 0;
        for (i, b) in field.iter().enumerate() {
            let b = if i == 0 { b & 0x7f } else { *b };
            n = n.saturating_mul(256).saturating_add(b as u64);
        }
        return n;
    }
    field
        .iter()
        .skip_while(|b| **b == b' ')
        .take_while(|b| **b != 0 && **b != b' ')
        .fold(0u64, |n, b| {
            if (b'0'..=b'7').contains(b) {
                n.saturating_mul(8).saturating_add((b - b'0') as u64)
            } else {
                n
            }
        })
}

/// The streaming chunker.
pub(super) struct Chunker {
    params: ChunkerParams,
    mask_s: u64,
    mask_l: u64,
    pending: Vec<u8>,
    start: usize,
    /// `None` for one file's content (no headers to find).
    walker: Option<TarWalker>,
}

impl Chunker {
    /// A chunker with `params` (which must be valid).
    pub(super) fn new(params: ChunkerParams) -> Self {
        let (mask_s, mask_l) = v2020::select_masks(params.avg as usize, Normalization::Level1);
        Chunker {
            params,
            mask_s,
            mask_l,
            pending: Vec::with_capacity(2 * params.max as usize),
            start: 0,
            walker: Some(TarWalker::new(params.min as u64)),
        }
    }

    /// A chunker for one file's content: FastCDC cuts only (the caller
    /// finishes it at the file's end, which is a cut).
    pub(super) fn for_file(params: ChunkerParams) -> Self {
        Chunker {
            walker: None,
            ..Chunker::new(params)
        }
    }

    /// Feeds `data`; calls `emit` for every chunk completed.
    pub(super) fn push<E>(
        &mut self,
        mut data: &[u8],
        emit: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        while !data.is_empty() {
            let (n, cut) = match self.walker.as_mut().map(|w| w.step(data)) {
                None => (data.len(), false),
                Some(Step::Plain(n)) => (n, false),
                Some(Step::CutAfter(n)) => (n, true),
            };
            self.pending.extend_from_slice(&data[..n]);
            data = &data[n..];
            self.drain(false, emit)?;
            if cut {
                self.drain(true, emit)?;
            }
        }
        Ok(())
    }

    /// Emits what is left.
    pub(super) fn finish<E>(
        mut self,
        emit: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        self.drain(true, emit)
    }

    /// Cuts chunks off the pending bytes: while a full maximum is pending
    /// (the cut point is then final), or all of them when `all`.
    fn drain<E>(
        &mut self,
        all: bool,
        emit: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let max = self.params.max as usize;
        loop {
            let available = self.pending.len() - self.start;
            if available == 0 || (!all && available < max) {
                break;
            }
            let (_, cut) = v2020::cut(
                &self.pending[self.start..],
                self.params.min as usize,
                self.params.avg as usize,
                max,
                self.mask_s,
                self.mask_l,
                self.mask_s << 1,
                self.mask_l << 1,
            );
            let cut = cut.clamp(1, available);
            emit(&self.pending[self.start..self.start + cut])?;
            self.start += cut;
        }
        if self.start > 0 && (self.start >= max || self.start == self.pending.len()) {
            self.pending.drain(..self.start);
            self.start = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    fn chunks(params: ChunkerParams, data: &[u8], piece: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut c = Chunker::new(params);
        let mut emit = |b: &[u8]| -> Result<(), ()> {
            out.push(b.to_vec());
            Ok(())
        };
        for p in data.chunks(piece.max(1)) {
            c.push(p, &mut emit).unwrap();
        }
        c.finish(&mut emit).unwrap();
        out
    }

    fn small() -> ChunkerParams {
        ChunkerParams {
            min: 1024,
            avg: 4096,
            max: 16384,
        }
    }

    fn tar_of(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(1);
            b.append_data(&mut h, name, &data[..]).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn random(rng: &mut impl RngCore, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        rng.fill_bytes(&mut v);
        v
    }

    /// The chunks concatenate to the input, respect the maximum, and do not
    /// depend on how the input was split into pieces.
    #[test]
    fn chunks_concatenate_and_do_not_depend_on_feeding() {
        let seed: u64 = std::env::var("BERTH_CHUNKER_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(7);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for round in 0..20 {
            let n_files = rng.gen_range(0..12);
            let files: Vec<(String, Vec<u8>)> = (0..n_files)
                .map(|i| {
                    let size = match rng.gen_range(0..3) {
                        0 => rng.gen_range(0..600),
                        1 => rng.gen_range(0..5000),
                        _ => rng.gen_range(0..100_000),
                    };
                    (format!("f{i}"), random(&mut rng, size))
                })
                .collect();
            let refs: Vec<(&str, Vec<u8>)> =
                files.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
            let data = tar_of(&refs);
            let whole = chunks(small(), &data, data.len());
            assert_eq!(whole.concat(), data, "seed {seed} round {round}");
            assert!(whole.iter().all(|c| !c.is_empty() && c.len() <= 16384));
            for piece in [1, 7, 512, 4096, 100_000] {
                assert_eq!(
                    chunks(small(), &data, piece),
                    whole,
                    "seed {seed} round {round} piece {piece}"
                );
            }
        }
    }

    /// A large file's chunks are the same whatever comes before it.
    #[test]
    fn large_file_chunks_do_not_depend_on_neighbours() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let big = random(&mut rng, 200_000);
        let a = tar_of(&[("a", random(&mut rng, 777)), ("big", big.clone())]);
        let b = tar_of(&[
            ("a", random(&mut rng, 3000)),
            ("b", random(&mut rng, 50)),
            ("big", big.clone()),
        ]);
        let ca = chunks(small(), &a, 4096);
        let cb = chunks(small(), &b, 4096);
        // The file's data is cut the same way in both: every byte of it is
        // in a chunk both archives share.
        let shared: usize = ca.iter().filter(|c| cb.contains(c)).map(|c| c.len()).sum();
        assert!(
            shared >= big.len(),
            "{shared} of {} bytes shared",
            big.len()
        );
    }

    /// Appending to a large file changes only its last chunks.
    #[test]
    fn appending_changes_only_the_tail() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let big = random(&mut rng, 400_000);
        let mut longer = big.clone();
        longer.extend(random(&mut rng, 10_000));
        let a = chunks(small(), &tar_of(&[("big", big)]), 65536);
        let b = chunks(small(), &tar_of(&[("big", longer)]), 65536);
        // New: the header, the file's old last chunk and the 10 000 bytes
        // appended, and the end of the archive.
        let new: usize = b.iter().filter(|c| !a.contains(c)).map(|c| c.len()).sum();
        assert!(new <= 10_000 + 16384 + 2048, "{new} new bytes");
    }

    #[test]
    fn default_params_are_valid() {
        assert!(ChunkerParams::default().is_valid());
        assert!(small().is_valid());
        assert!(!ChunkerParams {
            min: 10,
            avg: 4096,
            max: 16384
        }
        .is_valid());
    }
}
