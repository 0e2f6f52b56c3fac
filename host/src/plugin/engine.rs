//! The one wasmtime engine every plugin shares: async, pooling allocator,
//! epoch interruption driven by a background ticker.

use std::sync::OnceLock;
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::manifest::MAX_MEMORY_CEILING;

/// How often the epoch advances; deadlines are checked at this granularity.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

static SHARED: OnceLock<Result<Engine, String>> = OnceLock::new();

/// The process-wide engine, built (and its epoch ticker started) on first use.
pub(crate) fn shared_engine() -> Result<Engine, String> {
    SHARED
        .get_or_init(|| build_engine().map_err(|e| e.to_string()))
        .clone()
}

fn build_engine() -> wasmtime::Result<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    // Sized for dozens of concurrent calls of large (Python/JS) components on
    // a small machine; slots are virtual reservations, not resident memory.
    pool.total_component_instances(256)
        .total_core_instances(2048)
        .total_memories(512)
        .total_tables(1024)
        .total_stacks(256)
        .max_core_instances_per_component(128)
        .max_memories_per_component(32)
        .max_tables_per_component(64)
        .table_elements(200_000)
        .max_memory_size(MAX_MEMORY_CEILING as usize)
        .max_component_instance_size(4 << 20)
        .max_core_instance_size(8 << 20);

    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    let engine = Engine::new(&config)?;

    let weak = engine.weak();
    std::thread::Builder::new()
        .name("berth-epoch".into())
        .spawn(move || loop {
            std::thread::sleep(EPOCH_TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => break,
            }
        })
        .map_err(|e| wasmtime::format_err!("cannot start the epoch ticker thread: {e}"))?;
    Ok(engine)
}
