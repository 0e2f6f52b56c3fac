//! What can go wrong loading or calling a plugin.

use std::path::PathBuf;

use crate::registry::ReferenceError;

/// Errors of the plugin host. Each names the plugin and says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The manifest could not be read or is invalid.
    #[error("plugin manifest {path}")]
    Manifest {
        /// The manifest file (or `<inline>`).
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: ManifestError,
    },
    /// The component file could not be read or compiled.
    #[error("plugin {plugin}: cannot load component {path}: {message}")]
    Load {
        /// Plugin name.
        plugin: String,
        /// Component path.
        path: PathBuf,
        /// Why.
        message: String,
        /// The compiler's or the file system's own error, when one said
        /// why.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The component could not be fetched from its registry, or the
    /// artifact there is not one component of the manifest's world.
    #[error("plugin {plugin}")]
    Registry {
        /// Plugin name.
        plugin: String,
        /// What the registry or the plugin cache said.
        #[source]
        source: crate::registry::RegistryError,
    },
    /// The component does not implement the contract the manifest names
    /// (missing export, different contract version, unsatisfiable import).
    #[error("plugin {plugin} violates the berth:snapshot contract: {message}")]
    ContractViolation {
        /// Plugin name.
        plugin: String,
        /// Which clause or shape was broken, naming both versions for a
        /// version mismatch.
        message: String,
        /// The linker's or the bindings' own error, when one said why.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The guest trapped (panic, unreachable, stack overflow, ...).
    #[error("plugin {plugin} trapped during {operation}: {message} (RUST_LOG=berth=debug logs its wasm backtrace)")]
    Trap {
        /// Plugin name.
        plugin: String,
        /// The contract operation that was running.
        operation: &'static str,
        /// The trap message.
        message: String,
        /// The guest's wasm backtrace, as far as known (logged at debug
        /// level; not part of the message).
        backtrace: String,
    },
    /// The call ran past its deadline and was cut off.
    #[error("plugin {plugin} exceeded its {seconds:.1}s deadline during {operation}; raise grants.deadline_secs in its manifest if the work is legitimately slow")]
    DeadlineExceeded {
        /// Plugin name.
        plugin: String,
        /// The contract operation that was running.
        operation: &'static str,
        /// The deadline in seconds.
        seconds: f64,
    },
    /// The guest tried to grow memory past its grant.
    #[error("plugin {plugin} exceeded its memory limit of {limit} bytes during {operation}; raise grants.max_memory in its manifest if it really needs more")]
    MemoryLimit {
        /// Plugin name.
        plugin: String,
        /// The contract operation that was running.
        operation: &'static str,
        /// The limit in bytes.
        limit: u64,
    },
    /// The guest asked for a capability it was not granted.
    #[error("plugin {plugin} was denied {what} during {operation}: not granted in its manifest")]
    CapabilityDenied {
        /// Plugin name.
        plugin: String,
        /// The contract operation that was running.
        operation: &'static str,
        /// What it tried to reach.
        what: String,
    },
    /// A host-side failure around the call (resource table, linker, I/O).
    #[error("plugin {plugin}: host failure during {operation}: {message}")]
    Host {
        /// Plugin name.
        plugin: String,
        /// The contract operation that was running.
        operation: &'static str,
        /// What failed.
        message: String,
    },
}

/// Why a plugin manifest was refused; the source, when there is one, is
/// the parser's own error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The file could not be read.
    #[error("cannot read it")]
    Read(#[source] std::io::Error),
    /// The text is not TOML of a manifest's shape (an unknown key, a
    /// missing `component`, a world that does not exist, ...).
    #[error("it is not a plugin manifest")]
    Toml(#[source] Box<toml::de::Error>),
    /// `component` starts with `oci://` but is not a reference.
    #[error("component")]
    Component(#[source] ReferenceError),
    /// An entry of `grants.http_hosts` is not an origin.
    #[error("grants.http_hosts")]
    HttpHost(#[source] OriginError),
    /// A value breaks a rule of its field (named in the text): a relative
    /// guest path, a memory grant out of range, an unset `${VAR}`, ...
    #[error("{0}")]
    Invalid(String),
}

/// Why a text is not an HTTP origin (`http://host[:port]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct OriginError {
    /// The text given.
    pub given: String,
    /// What is wrong with it.
    pub reason: String,
}
