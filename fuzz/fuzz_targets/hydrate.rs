//! Fuzzes the hydrate path: any bytes through the archive filter, and
//! whatever it accepts extracted into a fresh root. Nothing may ever appear
//! beside the root, and nothing may panic.
#![no_main]

use std::io::Cursor;

use berth::workspace::archive::{filter, unpack_into, ArchiveLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = ArchiveLimits {
        max_bytes: 16 << 20,
        max_entries: 10_000,
    };
    let mut clean = Vec::new();
    if filter(Cursor::new(data), Some(&mut clean), limits).is_err() {
        return;
    }
    let Ok(parent) = tempfile::tempdir() else { return };
    let root = parent.path().join("root");
    if std::fs::create_dir(&root).is_err() {
        return;
    }
    let _ = unpack_into(Cursor::new(clean), &root);
    let beside: Vec<_> = std::fs::read_dir(parent.path())
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(beside, vec![std::ffi::OsString::from("root")], "hydrate wrote outside the root");
});
