//! Time of day: real only when granted (`grants.wall_clock`), otherwise
//! frozen at the Unix epoch so a plugin cannot observe when it runs.
//! Monotonic time stays real: plugins need it for timeouts and backoff.

use std::time::Duration;

use wasmtime_wasi::{HostWallClock, WasiCtxBuilder};

struct FrozenWallClock;

impl HostWallClock for FrozenWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

pub(super) fn apply(builder: &mut WasiCtxBuilder, granted: bool) {
    if !granted {
        builder.wall_clock(FrozenWallClock);
    }
}
