//! Tests that break shared infrastructure on purpose — dockerd restarted,
//! Garage nodes killed, stops killed mid-way, containers killed — in one
//! binary of their own, so they never run beside the other integration
//! tests. Within it, the daemon restart excludes the other Docker tests
//! (`berth_tests::DOCKERD`).

#[path = "crash_consistency.rs"]
mod crash_consistency;
#[path = "docker_daemon_restart.rs"]
mod docker_daemon_restart;
#[path = "docker_faults.rs"]
mod docker_faults;
#[path = "s3.rs"]
mod s3;
