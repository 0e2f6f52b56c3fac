//! Fuzzes the persist/hydrate pair: the input bytes are read as operations
//! that build a workspace (files with holes and data, directories,
//! symlinks, hardlinks, modes); `write_tar` archives it, and the archive
//! filter must accept whatever it wrote, and extraction must give back the
//! same tree. The promise: whatever stop writes, start restores.
#![no_main]

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use berth::workspace::archive::{filter, unpack_into, write_tar, ArchiveLimits};
use libfuzzer_sys::fuzz_target;

fn build(root: &Path, data: &[u8]) {
    let mut paths: Vec<PathBuf> = vec![PathBuf::new()];
    let mut files: Vec<PathBuf> = Vec::new();
    for (i, op) in data.chunks(4).enumerate() {
        let [kind, a, b, c] = [op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0), *op.get(3).unwrap_or(&0)];
        let parent = paths[a as usize % paths.len()].clone();
        let name = parent.join(format!("n{i}-{}", ["x", "a b", "é", "日"][b as usize % 4]));
        let full = root.join(&name);
        match kind % 5 {
            0 => {
                if std::fs::create_dir(&full).is_ok() {
                    paths.push(name);
                }
            }
            1 => {
                let Ok(mut f) = std::fs::File::create(&full) else { continue };
                let _ = f.seek(SeekFrom::Start(b as u64 * 4096));
                let _ = f.write_all(&vec![c; c as usize * 7]);
                let _ = f.set_len(b as u64 * 4096 + c as u64 * 13 + (a as u64 % 3) * 8192);
                let _ = std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o600 | (c as u32 & 0o177)));
                files.push(name);
            }
            2 if !files.is_empty() => {
                let _ = std::fs::hard_link(root.join(&files[c as usize % files.len()]), &full);
            }
            3 => {
                let _ = std::os::unix::fs::symlink(["../x", "/etc", "dangling", "."][c as usize % 4], &full);
            }
            _ => {}
        }
    }
}

fn manifest(root: &Path) -> Vec<(PathBuf, u32, u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(root.join(&rel)) else { continue };
        for e in rd.flatten() {
            let rel = rel.join(e.file_name());
            let full = root.join(&rel);
            let Ok(m) = std::fs::symlink_metadata(&full) else { continue };
            let content = if m.file_type().is_symlink() {
                std::fs::read_link(&full).map(|t| t.into_os_string().into_encoded_bytes()).unwrap_or_default()
            } else if m.is_file() {
                std::fs::read(&full).unwrap_or_default()
            } else {
                stack.push(rel.clone());
                Vec::new()
            };
            out.push((rel, m.mode(), if m.is_dir() { 0 } else { m.len() }, if m.is_file() { m.nlink() } else { 0 }, content));
        }
    }
    out.sort();
    out
}

fuzz_target!(|data: &[u8]| {
    let Ok(source) = tempfile::tempdir() else { return };
    let Ok(target) = tempfile::tempdir() else { return };
    build(source.path(), data);
    let mut tar = Vec::new();
    write_tar(source.path(), &[], &mut tar).expect("write_tar");
    let mut clean = Vec::new();
    filter(&tar[..], Some(&mut clean), ArchiveLimits::default()).expect("the filter refused what write_tar wrote");
    unpack_into(&clean[..], target.path()).expect("unpack");
    assert_eq!(manifest(source.path()), manifest(target.path()));
});
