//! The local backend's bounds on memory, processes and CPU: a control group of
//! the sandbox's own, which every command, helper call and background
//! process of the sandbox joins before it starts (it writes `0`, itself,
//! to the group's `cgroup.procs` between fork and exec, so nothing it
//! starts is ever outside the group).
//!
//! cgroup v2 (one hierarchy at `/sys/fs/cgroup`): the group is
//! `/sys/fs/cgroup/berth/<key>` with `memory.max`, `memory.swap.max` = 0,
//! `pids.max` and `cpu.max`. cgroup v1 (a hierarchy per controller, as on
//! hosts that still boot in hybrid mode): `berth/<key>` under this
//! process's own group in the `memory`, `pids` and `cpu` hierarchies, with
//! `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap
//! is accounted), `pids.max` and `cpu.cfs_quota_us`, written once, when
//! the group is made.
//! `<key>` names the sandbox's run
//! directory, so every process that opens the sandbox finds the same
//! group.
//!
//! Bounds fail closed like confinement: a sandbox with bounds whose group
//! cannot be made (not root, cgroups not delegated, a controller missing)
//! runs nothing, and the error names `memory=unlimited pids=unlimited`
//! as the explicit way out.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crate::backend::BackendError;

use super::BACKEND;

const ROOT: &str = "/sys/fs/cgroup";

/// A sandbox's bounds; `None`: that one is unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Bounds {
    /// Bytes of memory (swap included).
    pub memory: Option<u64>,
    /// Processes and threads at once.
    pub pids: Option<u64>,
    /// CPU time, in thousandths of a CPU.
    pub cpus_millis: Option<u64>,
}

impl Bounds {
    fn is_unbounded(&self) -> bool {
        self.memory.is_none() && self.pids.is_none() && self.cpus_millis.is_none()
    }
}

/// The scheduler period CPU quotas are given over (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// The quota in each period for `millis` thousandths of a CPU.
fn cpu_quota_us(millis: u64) -> u64 {
    (millis * CPU_PERIOD_US / 1000).max(1000)
}

/// One file to write in a group: name, value; `optional` files may be
/// absent (swap not accounted).
struct Limit {
    file: &'static str,
    value: String,
    optional: bool,
}

/// The groups a sandbox's processes join: a directory and the limits to
/// write there, per hierarchy.
fn groups(key: &str, bounds: Bounds) -> Result<Vec<(PathBuf, Vec<Limit>)>, String> {
    let memory = |file, optional, bytes: u64| Limit {
        file,
        value: bytes.to_string(),
        optional,
    };
    let pids = |n: u64| Limit {
        file: "pids.max",
        value: n.to_string(),
        optional: false,
    };
    if Path::new(ROOT).join("cgroup.controllers").exists() {
        let mut limits = Vec::new();
        if let Some(bytes) = bounds.memory {
            limits.push(memory("memory.max", false, bytes));
            limits.push(Limit {
                file: "memory.swap.max",
                value: "0".into(),
                optional: true,
            });
        }
        limits.extend(bounds.pids.map(pids));
        limits.extend(bounds.cpus_millis.map(|millis| Limit {
            file: "cpu.max",
            value: format!("{} {CPU_PERIOD_US}", cpu_quota_us(millis)),
            optional: false,
        }));
        return Ok(vec![(Path::new(ROOT).join("berth").join(key), limits)]);
    }
    // v1: under this process's own group in each hierarchy.
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let own_path = |controller: &str| {
        own.lines()
            .filter_map(|l| {
                let mut fields = l.splitn(3, ':').skip(1);
                fields.next().zip(fields.next())
            })
            .find(|(controllers, _)| controllers.split(',').any(|c| c == controller))
            .map(|(_, path)| path.trim_start_matches('/').to_string())
    };
    let mut out = Vec::new();
    if let Some(bytes) = bounds.memory {
        let path = own_path("memory").ok_or("no memory controller in /proc/self/cgroup")?;
        out.push((
            Path::new(ROOT)
                .join("memory")
                .join(path)
                .join("berth")
                .join(key),
            vec![
                memory("memory.limit_in_bytes", false, bytes),
                memory("memory.memsw.limit_in_bytes", true, bytes),
            ],
        ));
    }
    if let Some(n) = bounds.pids {
        let path = own_path("pids").ok_or("no pids controller in /proc/self/cgroup")?;
        out.push((
            Path::new(ROOT)
                .join("pids")
                .join(path)
                .join("berth")
                .join(key),
            vec![pids(n)],
        ));
    }
    if let Some(millis) = bounds.cpus_millis {
        let path = own_path("cpu").ok_or("no cpu controller in /proc/self/cgroup")?;
        // Mounted as `cpu` or as `cpu,cpuacct` (a link named `cpu` beside
        // it on most hosts).
        out.push((
            Path::new(ROOT)
                .join("cpu")
                .join(path)
                .join("berth")
                .join(key),
            vec![
                Limit {
                    file: "cpu.cfs_period_us",
                    value: CPU_PERIOD_US.to_string(),
                    optional: false,
                },
                Limit {
                    file: "cpu.cfs_quota_us",
                    value: cpu_quota_us(millis).to_string(),
                    optional: false,
                },
            ],
        ));
    }
    Ok(out)
}

/// The group's name for the sandbox whose run directory is `run_dir`.
pub(super) fn key(run_dir: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(run_dir.as_os_str().as_encoded_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn unbounded_error(cause: String) -> BackendError {
    BackendError::Unbounded {
        backend: BACKEND,
        cause: format!("its memory, processes and CPU: {cause}"),
        remedy: "run Berth as root, or where cgroups are delegated to its user; or give the sandbox \
                 `memory=unlimited`, `pids=unlimited` and `cpus=unlimited` (`-o memory=unlimited -o pids=unlimited -o cpus=unlimited`) to run it unbounded"
            .into(),
    }
}

/// Makes the sandbox's groups (again, after a reboot) with `bounds`, and
/// opens each `cgroup.procs` for a new process to join: what
/// the launch joins (`host_process`). Empty when nothing is bounded.
pub(super) fn prepare(key: &str, bounds: Bounds) -> Result<Vec<OwnedFd>, BackendError> {
    if bounds.is_unbounded() {
        return Ok(Vec::new());
    }
    let mut procs = Vec::new();
    for (dir, limits) in groups(key, bounds).map_err(unbounded_error)? {
        let open_procs = || {
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
        };
        // A group that exists got its limits when it was made (a group
        // whose limits could not be written is removed again), so a
        // command pays for one open, not for a mkdir and the writes.
        if let Ok(file) = open_procs() {
            procs.push(OwnedFd::from(file));
            continue;
        }
        if let Some(parent) = dir.parent() {
            enable_controllers(parent);
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| unbounded_error(format!("making {}: {e}", dir.display())))?;
        if let Err(e) = write_limits(&dir, &limits) {
            let _ = std::fs::remove_dir(&dir);
            return Err(e);
        }
        let file = open_procs()
            .map_err(|e| unbounded_error(format!("opening {}/cgroup.procs: {e}", dir.display())))?;
        procs.push(OwnedFd::from(file));
    }
    Ok(procs)
}

/// Writes `limits` into the group at `dir`.
fn write_limits(dir: &Path, limits: &[Limit]) -> Result<(), BackendError> {
    for limit in limits {
        let path = dir.join(limit.file);
        if limit.optional && !path.exists() {
            continue;
        }
        std::fs::write(&path, &limit.value).map_err(|e| {
            unbounded_error(format!(
                "writing {} to {}: {e}",
                limit.value,
                path.display()
            ))
        })?;
    }
    Ok(())
}

/// cgroup v2: lets `berth/` and its children use the memory, pids and
/// cpu controllers. Errors surface when the limits are written.
fn enable_controllers(parent: &Path) {
    if !Path::new(ROOT).join("cgroup.controllers").exists() {
        return;
    }
    for dir in [Path::new(ROOT), parent] {
        let _ = std::fs::create_dir_all(dir);
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.subtree_control"))
        {
            let _ = f.write_all(b"+memory +pids +cpu");
        }
    }
}

/// Removes the sandbox's groups once its processes are gone (a group
/// with a process left in it stays, and says so in the log).
pub(super) fn remove(key: &str) {
    let all = Bounds {
        memory: Some(1),
        pids: Some(1),
        cpus_millis: Some(1),
    };
    let Ok(groups) = groups(key, all) else {
        return;
    };
    for (dir, _) in groups {
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(group = %dir.display(), error = %e, "cannot remove the sandbox's control group")
            }
        }
    }
}
