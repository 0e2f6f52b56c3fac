//! Persist/hydrate agreement, over generated workspaces: whatever
//! [`write_tar`] produces from a workspace passes [`filter`], and extracting
//! the filtered copy gives back the same workspace (types, modes, sizes,
//! link targets, link counts, times, contents), with sparse files still
//! sparse. Seeded and replayable: `BERTH_ARCHIVE_SEED=N` runs seed N only.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// One entry of a workspace manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Dir {
        mode: u32,
        mtime: i64,
    },
    File {
        mode: u32,
        size: u64,
        nlink: u64,
        mtime: i64,
        digest: String,
    },
    Symlink {
        target: PathBuf,
    },
}

fn manifest(root: &Path) -> BTreeMap<PathBuf, Item> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Item>) {
        for entry in std::fs::read_dir(root.join(rel)).unwrap() {
            let entry = entry.unwrap();
            let rel = rel.join(entry.file_name());
            let full = root.join(&rel);
            let meta = std::fs::symlink_metadata(&full).unwrap();
            let item = if meta.file_type().is_symlink() {
                Item::Symlink {
                    target: std::fs::read_link(&full).unwrap(),
                }
            } else if meta.is_dir() {
                walk(root, &rel, out);
                Item::Dir {
                    mode: meta.mode() & 0o7777,
                    mtime: meta.mtime(),
                }
            } else {
                let bytes = std::fs::read(&full).unwrap();
                Item::File {
                    mode: meta.mode() & 0o7777,
                    size: meta.len(),
                    nlink: meta.nlink(),
                    mtime: meta.mtime(),
                    digest: blake3::hash(&bytes).to_hex().to_string(),
                }
            };
            out.insert(rel, item);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

const NAMES: &[&str] = &[
    "a",
    "b.txt",
    "with space",
    "ünïcødé",
    "日本語",
    ".hidden",
    "-dash",
    "x y z.tar.gz",
];

fn name(rng: &mut StdRng, taken: &mut std::collections::HashSet<PathBuf>, dir: &Path) -> PathBuf {
    loop {
        let base = if rng.gen_ratio(1, 12) {
            // A 255-byte component, the longest most filesystems allow.
            let mut n = format!("long{}-", rng.gen::<u16>());
            while n.len() < 255 {
                n.push('L');
            }
            n
        } else {
            format!(
                "{}{}",
                NAMES[rng.gen_range(0..NAMES.len())],
                rng.gen::<u8>()
            )
        };
        let path = dir.join(base);
        if taken.insert(path.clone()) {
            return path;
        }
    }
}

/// Builds a generated workspace under `root`; returns what was made.
fn generate(root: &Path, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut taken = std::collections::HashSet::new();
    let mut dirs = vec![PathBuf::new()];
    for _ in 0..rng.gen_range(0..8) {
        let parent = dirs[rng.gen_range(0..dirs.len())].clone();
        if parent.components().count() >= 6 {
            continue;
        }
        let d = name(&mut rng, &mut taken, &parent);
        std::fs::create_dir(root.join(&d)).unwrap();
        dirs.push(d);
    }
    let mut files = Vec::new();
    for _ in 0..rng.gen_range(0..14) {
        let dir = dirs[rng.gen_range(0..dirs.len())].clone();
        let f = name(&mut rng, &mut taken, &dir);
        let full = root.join(&f);
        let mut file = std::fs::File::create(&full).unwrap();
        match rng.gen_range(0..6) {
            0 => {} // empty
            1 => {
                let size = [1usize, 511, 512, 513, 4095, 4096, 4097, 65537][rng.gen_range(0..8)];
                let bytes: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
                file.write_all(&bytes).unwrap();
            }
            2 => {
                // Sparse: a hole, some data, maybe a trailing hole.
                let hole = rng.gen_range(1..64u64) * 65536;
                file.seek(SeekFrom::Start(hole)).unwrap();
                file.write_all(b"after the hole").unwrap();
                if rng.gen_bool(0.5) {
                    file.set_len(hole + rng.gen_range(1..32u64) * 65536)
                        .unwrap();
                }
            }
            3 => {
                // All hole.
                file.set_len(rng.gen_range(1..256u64) * 4096).unwrap();
            }
            4 => {
                // Zeros written out, then data: not sparse on disk.
                file.write_all(&vec![0u8; rng.gen_range(1..20) * 4096])
                    .unwrap();
                file.write_all(b"tail").unwrap();
            }
            _ => {
                let size = rng.gen_range(0..300_000usize);
                let bytes: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
                file.write_all(&bytes).unwrap();
            }
        }
        drop(file);
        let mode = [0o644, 0o600, 0o755, 0o700, 0o640, 0o444][rng.gen_range(0..6)];
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode)).unwrap();
        files.push(f);
    }
    // Hardlinks to files, anywhere.
    for _ in 0..rng.gen_range(0..4) {
        if files.is_empty() {
            break;
        }
        let target = files[rng.gen_range(0..files.len())].clone();
        let dir = dirs[rng.gen_range(0..dirs.len())].clone();
        let link = name(&mut rng, &mut taken, &dir);
        std::fs::hard_link(root.join(&target), root.join(&link)).unwrap();
    }
    // Symlinks: relative, absolute, dangling.
    for _ in 0..rng.gen_range(0..5) {
        let dir = dirs[rng.gen_range(0..dirs.len())].clone();
        let link = name(&mut rng, &mut taken, &dir);
        let target = match rng.gen_range(0..3) {
            0 if !files.is_empty() => {
                let t = &files[rng.gen_range(0..files.len())];
                let ups = "../".repeat(dir.components().count());
                PathBuf::from(format!("{ups}{}", t.display()))
            }
            1 => PathBuf::from("/etc/hostname"),
            _ => PathBuf::from("nowhere/at all"),
        };
        std::os::unix::fs::symlink(&target, root.join(&link)).unwrap();
    }
    // Old times on files, then on directories (children change them).
    for f in &files {
        let t = filetime::FileTime::from_unix_time(rng.gen_range(0..1_700_000_000), 0);
        filetime::set_file_times(root.join(f), t, t).unwrap();
    }
    for d in dirs.iter().skip(1).rev() {
        let t = filetime::FileTime::from_unix_time(rng.gen_range(0..1_700_000_000), 0);
        filetime::set_file_times(root.join(d), t, t).unwrap();
        let mode = [0o755, 0o700, 0o750][rng.gen_range(0..3)];
        std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

fn seeds() -> Vec<u64> {
    match std::env::var("BERTH_ARCHIVE_SEED") {
        Ok(s) => vec![s.parse().expect("BERTH_ARCHIVE_SEED must be a number")],
        Err(_) => (0..48).collect(),
    }
}

fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn whatever_write_tar_produces_the_filter_accepts_and_unpack_restores() {
    for seed in seeds() {
        let source = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        generate(source.path(), seed);
        let before = manifest(source.path());

        let mut tar = Vec::new();
        write_tar(source.path(), &[], &mut tar).unwrap();
        let mut clean = Vec::new();
        filter(&tar[..], Some(&mut clean), ArchiveLimits::default()).unwrap_or_else(|e| {
            panic!("seed {seed}: the filter refused what write_tar made: {e} (replay: BERTH_ARCHIVE_SEED={seed})")
        });
        unpack_into(&clean[..], target.path()).unwrap();
        let after = manifest(target.path());
        assert_eq!(
            before, after,
            "seed {seed}: the round trip changed the workspace (replay: BERTH_ARCHIVE_SEED={seed})"
        );
        // Holes stay holes: nothing takes much more room than it did.
        for (path, item) in &before {
            if let Item::File { .. } = item {
                let was = allocated(&source.path().join(path));
                let now = allocated(&target.path().join(path));
                assert!(
                    now <= was + 8192,
                    "seed {seed}: {} took {was} bytes on disk before and {now} after",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn a_large_sparse_file_round_trips_small() {
    let source = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let path = source.path().join("sparse.img");
    let mut f = std::fs::File::create(&path).unwrap();
    f.seek(SeekFrom::Start(512 << 20)).unwrap();
    f.write_all(b"middle").unwrap();
    f.set_len(1 << 30).unwrap();
    drop(f);
    let mut tar = Vec::new();
    write_tar(source.path(), &[], &mut tar).unwrap();
    assert!(
        tar.len() < 1 << 20,
        "the archive stores holes: {}",
        tar.len()
    );
    let (reader, mut writer) = std::io::pipe().unwrap();
    let tar_for_filter = tar.clone();
    let filtering = std::thread::spawn(move || {
        filter(
            &tar_for_filter[..],
            Some(&mut writer),
            ArchiveLimits::default(),
        )
    });
    unpack_into(reader, target.path()).unwrap();
    filtering.join().unwrap().unwrap();
    let restored = target.path().join("sparse.img");
    assert_eq!(std::fs::metadata(&restored).unwrap().len(), 1 << 30);
    assert!(allocated(&restored) < 1 << 20, "{}", allocated(&restored));
    let mut f = std::fs::File::open(&restored).unwrap();
    f.seek(SeekFrom::Start(512 << 20)).unwrap();
    let mut buf = [0u8; 6];
    std::io::Read::read_exact(&mut f, &mut buf).unwrap();
    assert_eq!(&buf, b"middle");
}

#[test]
fn hardlinks_are_archived_once_and_come_back_linked() {
    let source = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    std::fs::create_dir(source.path().join("d")).unwrap();
    std::fs::write(source.path().join("a"), vec![7u8; 100_000]).unwrap();
    std::fs::hard_link(source.path().join("a"), source.path().join("d/b")).unwrap();
    let mut tar = Vec::new();
    write_tar(source.path(), &[], &mut tar).unwrap();
    assert!(tar.len() < 150_000, "content stored once: {}", tar.len());
    let mut clean = Vec::new();
    filter(&tar[..], Some(&mut clean), ArchiveLimits::default()).unwrap();
    unpack_into(&clean[..], target.path()).unwrap();
    let a = std::fs::metadata(target.path().join("a")).unwrap();
    let b = std::fs::metadata(target.path().join("d/b")).unwrap();
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
}

#[test]
fn a_clean_copy_under_a_staging_directory_keeps_everything_and_its_links() {
    let source = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    std::fs::create_dir(source.path().join("d")).unwrap();
    std::fs::write(source.path().join("a"), b"content").unwrap();
    std::fs::hard_link(source.path().join("a"), source.path().join("d/b")).unwrap();
    std::os::unix::fs::symlink("../a", source.path().join("d/l")).unwrap();
    let mut tar = Vec::new();
    write_tar(source.path(), &[], &mut tar).unwrap();
    let mut clean = Vec::new();
    let stats = filter_under(
        &tar[..],
        Some(&mut clean),
        ArchiveLimits::default(),
        Some(Path::new(".stage")),
    )
    .unwrap();
    assert_eq!(
        stats,
        filter(&tar[..], None::<std::io::Sink>, ArchiveLimits::default()).unwrap()
    );
    unpack_into(&clean[..], target.path()).unwrap();
    let names: Vec<_> = std::fs::read_dir(target.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [".stage"], "nothing outside the staging directory");
    let staged = target.path().join(".stage");
    let a = std::fs::metadata(staged.join("a")).unwrap();
    let b = std::fs::metadata(staged.join("d/b")).unwrap();
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    assert_eq!(
        std::fs::read_link(staged.join("d/l")).unwrap(),
        Path::new("../a")
    );
    assert_eq!(std::fs::read(staged.join("d/l")).unwrap(), b"content");
}
