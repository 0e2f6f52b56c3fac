//! Where Berth's per-user caches live.

/// `$XDG_CACHE_HOME/berth/NAME`, else `~/.cache/berth/NAME`: where the
/// plugin caches live unless their own variable names a directory. `None`
/// when neither variable is set.
pub fn user_cache_dir(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .map(|base| base.join("berth").join(name))
}
