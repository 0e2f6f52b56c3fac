//! What every Berth crate below the lifecycle shares, with no heavy
//! dependency: the plugin contract's identity ([`contract`]), sizes and
//! durations as people write them ([`units`]), and where per-user caches
//! live ([`user_cache`]). The `berth` crate re-exports each at its old
//! path (`berth::units`, `berth::plugin::World`).
#![deny(missing_docs)]

pub mod contract;
pub mod units;
pub mod user_cache;
