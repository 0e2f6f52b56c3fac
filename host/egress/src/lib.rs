//! Berth's egress policy and the checks its egress point makes.
//!
//! A sandbox with a policy reaches nothing but Berth's egress point, on the
//! host; every connection it asks for is checked here:
//!
//! - [`EgressPolicy::decide`]: the name (or IP literal) and port asked for,
//!   against the deny rules first, then the allow rules. Default deny.
//! - [`EgressPolicy::check_address`]: each address the host's resolver
//!   gives for an allowed name, so a name cannot lead into loopback,
//!   private, link-local or metadata addresses unless an `--allow-cidr`
//!   rule names them (DNS rebinding).
//! - [`client_hello_sni`]: the server name a TLS ClientHello carries, which
//!   must name the host the connection was allowed for.
//!
//! - Secrets by placeholder ([`SecretBinding`]): for the hosts a secret is
//!   bound to, and only those, the point ends the sandbox's TLS with a
//!   certificate from the sandbox's own CA and puts the secret's value in
//!   place of its placeholder in the request headers.
//!
//! Every refusal is a [`Denial`] that says which rule (or which missing
//! rule) refused it, for the [`ConnectionLog`], a bounded ring per sandbox.
//!
//! The checks are pure: no I/O, no resolver, no clock. [`EgressPoint`]
//! applies them: the HTTP proxy on the host a sandbox reaches instead of
//! the network.

mod address;
mod ca;
mod control;
mod daemon;
mod intercept;
mod log;
mod point;
mod policy;
mod resolve;
mod rules;
mod secrets;
mod sni;
mod streams;

pub use address::AddressClass;
pub use ca::CaError;
pub use control::{
    call, ControlError, ControlReply, ControlRequest, EgressStatus, CONTROL_DEADLINE,
    MAX_CONTROL_LINE,
};
pub use daemon::{
    serve, DaemonError, DaemonExit, EgressDir, CA_BUNDLE, CA_CERTIFICATE, MAX_OPEN_CONNECTIONS,
    POINT_SOCKET,
};
pub use log::{Connection, ConnectionLog, Verdict, DEFAULT_LOG_ENTRIES};
pub use point::{EgressPoint, Resolver, CLIENT_DEADLINE, CONNECT_DEADLINE, MAX_REQUEST_HEAD};
pub use policy::{Allowed, Denial, EgressPolicy, DEFAULT_PORTS};
pub use resolve::TestResolve;
pub use rules::{CidrRule, HostRule, RuleError};
pub use secrets::{
    check_unique, substitute, SecretBinding, SecretError, SecretValue, StoredSecret,
    MAX_SECRET_BYTES,
};
pub use sni::{client_hello_sni, Sni, MAX_CLIENT_HELLO};
