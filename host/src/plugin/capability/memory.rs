//! Memory: the sum of all the guest's linear memories is capped at the
//! grant; growing past it traps, and the trap is reported as a memory-limit
//! error rather than a generic crash.

use wasmtime::ResourceLimiter;

/// Tables may not grow past this many elements.
const MAX_TABLE_ELEMENTS: usize = 1_000_000;

pub(crate) struct MemoryCap {
    limit: u64,
    used: u64,
    /// Set when the guest was refused memory, so the resulting trap can be
    /// classified.
    pub(crate) exceeded: bool,
}

impl MemoryCap {
    pub(crate) fn new(limit: u64) -> Self {
        MemoryCap {
            limit,
            used: 0,
            exceeded: false,
        }
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current) as u64;
        if self.used.saturating_add(growth) > self.limit {
            self.exceeded = true;
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes exceeded (in use {}, asked for {} more)",
                self.limit,
                self.used,
                growth
            ));
        }
        self.used += growth;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}
