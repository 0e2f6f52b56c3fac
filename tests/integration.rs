//! The integration tests, one binary (one link of wasmtime), each former
//! test file a module. Tests that restart shared daemons or kill store
//! nodes live in `faults.rs`, run as a binary of their own after this one.

#[path = "agent.rs"]
mod agent;
#[path = "bounds.rs"]
mod bounds;
#[path = "cli.rs"]
mod cli;
#[path = "cli_manners.rs"]
mod cli_manners;
#[path = "commands.rs"]
mod commands;
#[path = "conformance.rs"]
mod conformance;
#[path = "custom_backend.rs"]
mod custom_backend;
#[path = "dedup.rs"]
mod dedup;
#[path = "docker.rs"]
mod docker;
#[path = "egress.rs"]
mod egress;
#[path = "egress_docker.rs"]
mod egress_docker;
#[path = "egress_secrets.rs"]
mod egress_secrets;
#[path = "egress_support.rs"]
mod egress_support;
#[path = "egress_tools.rs"]
mod egress_tools;
#[path = "engines.rs"]
mod engines;
#[path = "escape.rs"]
mod escape;
#[path = "examples.rs"]
mod examples;
#[path = "hostile_archives.rs"]
mod hostile_archives;
#[path = "interruptions.rs"]
mod interruptions;
#[path = "lifecycle.rs"]
mod lifecycle;
#[path = "nothing_lost.rs"]
mod nothing_lost;
#[path = "plugin_host.rs"]
mod plugin_host;
#[path = "readme_api.rs"]
mod readme_api;
#[path = "registry.rs"]
mod registry;
#[path = "round_trip.rs"]
mod round_trip;
#[path = "server.rs"]
mod server;
