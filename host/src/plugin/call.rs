//! One guest call: a fresh store and instance per operation, bounded by the
//! plugin's deadline twice over (epoch interruption for guest code, a tokio
//! timeout for a guest blocked in a host call), with every failure mapped
//! to a typed error.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use wasmtime::component::Resource;
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream};

use super::capability::PluginState;
use super::stream_bridge::{self, alongside};
use super::LoadedPlugin;
use crate::plugin_error::PluginError;
use crate::store_error::{StorageError, StoreError};

/// A guest call's future: the trap layer outside, the contract's answer
/// inside.
pub(crate) type GuestCall<'a, R> =
    Pin<Box<dyn Future<Output = wasmtime::Result<Result<R, StorageError>>> + Send + 'a>>;

/// Marker error raised by the epoch callback when the deadline passes.
#[derive(Debug)]
struct DeadlineHit;

impl std::fmt::Display for DeadlineHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("plugin deadline exceeded")
    }
}

impl std::error::Error for DeadlineHit {}

/// Extra time the tokio timeout allows beyond the epoch deadline, so guest
/// code is normally stopped by the epoch (with a backtrace) first.
const TIMEOUT_GRACE: Duration = Duration::from_millis(250);

impl LoadedPlugin {
    fn new_store(&self, operation: &'static str) -> Result<Store<PluginState>, PluginError> {
        let state = PluginState::from_grants(&self.manifest.name, &self.manifest.grants)?;
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.memory);
        let deadline = Instant::now() + self.manifest.grants.deadline;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                Err(wasmtime::Error::new(DeadlineHit))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        tracing::trace!(plugin = %self.manifest.name, operation, "new plugin store");
        Ok(store)
    }

    fn deadline_exceeded(&self, operation: &'static str) -> PluginError {
        PluginError::DeadlineExceeded {
            plugin: self.manifest.name.clone(),
            operation,
            seconds: self.manifest.grants.deadline.as_secs_f64(),
        }
    }

    fn host_error(&self, operation: &'static str, message: impl ToString) -> PluginError {
        PluginError::Host {
            plugin: self.manifest.name.clone(),
            operation,
            message: message.to_string(),
        }
    }

    /// Maps a wasmtime-level failure to the most specific error.
    fn classify(
        &self,
        store: &Store<PluginState>,
        operation: &'static str,
        err: wasmtime::Error,
    ) -> PluginError {
        let plugin = self.manifest.name.clone();
        if err.downcast_ref::<DeadlineHit>().is_some() {
            return self.deadline_exceeded(operation);
        }
        if store.data().memory.exceeded {
            return PluginError::MemoryLimit {
                plugin,
                operation,
                limit: store.data().memory.limit(),
            };
        }
        let backtrace = err
            .downcast_ref::<wasmtime::WasmBacktrace>()
            .map(|b| b.to_string())
            .unwrap_or_else(|| "(none captured)".into());
        tracing::debug!(%plugin, operation, "plugin trapped; wasm backtrace:\n{backtrace}");
        if let Some(trap) = err.downcast_ref::<wasmtime::Trap>() {
            return PluginError::Trap {
                plugin,
                operation,
                message: trap.to_string(),
                backtrace,
            };
        }
        // One line for people: the chain's first line, without the
        // backtrace a context may carry.
        let message = format!("{err:#}")
            .lines()
            .next()
            .unwrap_or("unknown trap")
            .to_string();
        PluginError::Trap {
            plugin,
            operation,
            message,
            backtrace,
        }
    }

    /// Turns the guest's own error into a store error, preferring a
    /// capability denial the host observed during the call.
    fn guest_error(
        &self,
        store: &Store<PluginState>,
        operation: &'static str,
        err: StorageError,
    ) -> StoreError {
        if let Some(what) = store.data().http_denials().into_iter().next() {
            return PluginError::CapabilityDenied {
                plugin: self.manifest.name.clone(),
                operation,
                what,
            }
            .into();
        }
        err.into()
    }

    fn timeout(&self) -> Duration {
        self.manifest.grants.deadline + TIMEOUT_GRACE
    }

    /// Runs a call that takes no stream.
    pub(crate) async fn call<R, F>(&self, operation: &'static str, body: F) -> Result<R, StoreError>
    where
        F: for<'a> FnOnce(&'a mut Store<PluginState>) -> GuestCall<'a, R>,
    {
        let mut store = self.new_store(operation)?;
        let outcome = tokio::time::timeout(self.timeout(), body(&mut store)).await;
        match outcome {
            Err(_) => Err(self.deadline_exceeded(operation).into()),
            Ok(Err(trap)) => Err(self.classify(&store, operation, trap).into()),
            Ok(Ok(Err(e))) => Err(self.guest_error(&store, operation, e)),
            Ok(Ok(Ok(r))) => Ok(r),
        }
    }

    /// Runs a call that consumes `source` through a guest `input-stream`.
    /// Enforces the stream clauses: a call that succeeds must have read the
    /// stream to its end, and must not succeed if the stream failed.
    pub(crate) async fn call_reading<F>(
        &self,
        operation: &'static str,
        source: &mut (dyn AsyncRead + Unpin + Send),
        body: F,
    ) -> Result<(), StoreError>
    where
        F: for<'a> FnOnce(
            &'a mut Store<PluginState>,
            Resource<DynInputStream>,
        ) -> GuestCall<'a, ()>,
    {
        let mut store = self.new_store(operation)?;
        let (tx, input, report) = stream_bridge::host_to_guest();
        let stream = store
            .data_mut()
            .table
            .push(Box::new(input) as DynInputStream)
            .map_err(|e| self.host_error(operation, e))?;
        let pump = stream_bridge::pump(source, tx, report.clone());
        let outcome =
            tokio::time::timeout(self.timeout(), alongside(body(&mut store, stream), pump)).await;
        let source_error = report.take_error();
        match outcome {
            Err(_) => Err(self.deadline_exceeded(operation).into()),
            Ok((Err(trap), _)) => Err(self.classify(&store, operation, trap).into()),
            Ok((Ok(Err(e)), _)) => match source_error {
                Some(io) => Err(StoreError::Source(io)),
                None => Err(self.guest_error(&store, operation, e)),
            },
            Ok((Ok(Ok(())), _)) => {
                if let Some(io) = source_error {
                    return Err(PluginError::ContractViolation {
                        plugin: self.manifest.name.clone(),
                        message: format!(
                            "{operation} reported success although its input stream failed ({io}); \
                             it must discard the archive (clause 2)"
                        ),
                        source: None,
                    }
                    .into());
                }
                if !report.guest_saw_end() {
                    return Err(PluginError::ContractViolation {
                        plugin: self.manifest.name.clone(),
                        message: format!(
                            "{operation} returned success before reading its input stream to the end (clause 5)"
                        ),
                        source: None,
                    }
                    .into());
                }
                Ok(())
            }
        }
    }

    /// Runs a call that produces bytes through a guest `output-stream`,
    /// copying them into `sink` as they come.
    pub(crate) async fn call_writing<F>(
        &self,
        operation: &'static str,
        sink: &mut (dyn AsyncWrite + Unpin + Send),
        body: F,
    ) -> Result<(), StoreError>
    where
        F: for<'a> FnOnce(
            &'a mut Store<PluginState>,
            Resource<DynOutputStream>,
        ) -> GuestCall<'a, ()>,
    {
        let mut store = self.new_store(operation)?;
        let (output, rx) = stream_bridge::guest_to_host();
        let stream = store
            .data_mut()
            .table
            .push(Box::new(output) as DynOutputStream)
            .map_err(|e| self.host_error(operation, e))?;
        let drain = stream_bridge::drain(rx, sink);
        tokio::pin!(drain);
        let outcome = tokio::time::timeout(
            self.timeout(),
            alongside(body(&mut store, stream), &mut drain),
        )
        .await;
        let (guest, drained) = match outcome {
            Err(_) => return Err(self.deadline_exceeded(operation).into()),
            Ok(pair) => pair,
        };
        let guest = match guest {
            Err(trap) => Err(StoreError::from(self.classify(&store, operation, trap))),
            Ok(Err(e)) => Err(self.guest_error(&store, operation, e)),
            Ok(Ok(())) => Ok(()),
        };
        // Dropping the store drops the guest's end of the channel, which
        // lets the drain finish delivering what the guest wrote.
        drop(store);
        let drained = match drained {
            Some(done) => done,
            None => match tokio::time::timeout(self.timeout(), &mut drain).await {
                Ok(done) => done,
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the destination did not accept the restored archive in time",
                )),
            },
        };
        match (guest, drained) {
            // A broken destination explains the guest's failure best.
            (_, Err(io)) => Err(StoreError::Sink(io)),
            (Err(e), Ok(_)) => Err(e),
            (Ok(()), Ok(_)) => Ok(()),
        }
    }
}
