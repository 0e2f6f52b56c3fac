//! Random values for names that must not collide: temporary files, session
//! ids, exec pid files, conformance id prefixes. Not for secrets.

use std::hash::{BuildHasher, Hasher};

/// A random 64-bit value: std's randomly keyed hasher over the time and the
/// process id, so values differ between calls, processes and hosts.
pub fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    h.finish()
}
