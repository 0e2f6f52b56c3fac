//! The built-in backend kinds, registered once: the only file outside a
//! kind's own module that names it (the layering check holds it to that).

use std::sync::Arc;

use super::provider::{BackendSpec, Registry};

impl Registry {
    /// The local backend: the one kind the library carries (Docker and
    /// swarm are `berth-docker`'s, registered by whoever uses them).
    pub(crate) fn with_defaults() -> Self {
        let mut registry = Registry::default();
        registry.register(Arc::new(super::local::LocalProvider));
        registry
    }
}

impl BackendSpec {
    /// The local backend under the client's home.
    pub fn local() -> Self {
        BackendSpec::new(super::local::LocalOptions::default())
    }
}

impl Default for BackendSpec {
    /// The local backend under the client's home.
    fn default() -> Self {
        BackendSpec::local()
    }
}
