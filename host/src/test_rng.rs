//! Seeded pseudo-random numbers for the library's own tests: one
//! generator (xorshift64) and one way to vary its seed.

/// `BERTH_TEST_SEED` when set (a run's edits varied on purpose), else
/// `default`.
pub(crate) fn seed(default: u64) -> u64 {
    std::env::var("BERTH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A xorshift64 generator started at `seed` (made odd, so never zero).
pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
