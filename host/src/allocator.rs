//! Process-wide allocator tuning, for programs built on Berth (its own
//! binaries call [`bound_allocator_retention`] first thing).
//!
//! glibc's malloc serves a large allocation with `mmap` and returns it to
//! the system on free, until a large block is freed: it then raises its
//! threshold (up to 32 MiB) and serves later large blocks from its heaps,
//! where freed memory stays with the process. Berth streams with 256 KiB
//! to 2 MiB buffers on several threads (chunks, output batches, pipes), so
//! a restore's resident memory grew with the workspace: 100 MiB at 1 GiB
//! deduplicated, while its live heap peaked at 30 MiB. A fixed threshold
//! of 256 KiB keeps it at 63 MiB (`berth-bench --rss-probe 1GiB
//! --rss-dedup`, 2026-12-07). A process's own `MALLOC_MMAP_THRESHOLD_`
//! setting wins.

/// Allocations of at least this many bytes are mapped, and unmapped on
/// free.
pub const MMAP_THRESHOLD: usize = 256 * 1024;

/// Fixes glibc malloc's mmap threshold at [`MMAP_THRESHOLD`], unless the
/// environment sets `MALLOC_MMAP_THRESHOLD_`. Returns whether it did (never
/// on other C libraries). Call it before the process starts threads.
pub fn bound_allocator_retention() -> bool {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        return false;
    }
    set_mmap_threshold()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_mmap_threshold() -> bool {
    // SAFETY: mallopt takes two integers and changes only malloc's own
    // parameters; it is safe to call at any time.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_mmap_threshold() -> bool {
    false
}
