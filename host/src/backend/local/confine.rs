//! Confining the local backend's commands with bubblewrap.
//!
//! Each command (and each of Berth's file helpers) runs under `bwrap` in
//! new user, mount, pid, ipc, uts, network and cgroup namespaces, with no
//! capabilities, `no_new_privs`, nested user namespaces disabled and the
//! [`seccomp`](super::seccomp) filters. It sees:
//! - the workspace, read-write, at its host path (so paths in output and
//!   in the files API are the same inside and out);
//! - the manifest's bind mounts, each mounted by the kernel as declared (a
//!   read-only one is read-only);
//! - the system's directories (`/usr`, `/bin`, `/sbin`, `/lib*`, `/etc`,
//!   `/opt`) read-only, less every entry of `/etc` that not every user may
//!   read (`shadow`, private keys), which appears empty;
//! - its own `/proc` (its own processes), with `/proc/sys`,
//!   `/proc/sysrq-trigger` and the other kernel knobs Docker masks made
//!   read-only or empty; a minimal `/dev`; an empty `/tmp`;
//! - nothing else: not `$HOME`, `/root`, `/home`, `/run` (and so not the
//!   Docker socket or an ssh or gpg agent's), `/var`, `/mnt`, `/sys`,
//!   Berth's own state and server socket, nor the host's network
//!   (loopback included) or processes;
//! - an environment of its own: `PATH`, `HOME=/tmp` and the manifest's
//!   variables, never Berth's own (which may hold credentials).
//!
//! Why bubblewrap: it is the tool Flatpak, Anthropic's sandbox-runtime and
//! OpenAI's Codex use for exactly this, maintained and packaged everywhere,
//! and it sets the namespaces up in a separate process, so Berth (often a
//! multi-threaded server) never forks into half-built namespaces itself.
//! Where it cannot run (not installed, user namespaces disabled or
//! restricted by AppArmor, an unprivileged container), [`check`] fails
//! with the cause and the two ways out, and nothing runs unconfined.

use std::ffi::OsString;
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::super::BackendError;
use crate::workspace::spec::BindMount;

/// The program that confines commands.
pub(super) const BWRAP: &str = "bwrap";
/// Descriptor numbers the seccomp programs are handed to bubblewrap on.
const FIRST_SECCOMP_FD: i32 = 20;

/// How a local sandbox's commands are contained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// In namespaces of their own under bubblewrap, seeing only the
    /// workspace, its binds and the system read-only (the default; see the
    /// module docs). A host that cannot confine refuses to run them.
    #[default]
    Confined,
    /// As the user running Berth, with every right it has on this host:
    /// for trusted work only. Chosen explicitly, and warned about.
    None,
}

impl Isolation {
    /// `confined` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            Isolation::Confined => "confined",
            Isolation::None => "none",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An isolation name that is neither `confined` nor `none`.
#[derive(Debug, thiserror::Error)]
#[error("isolation {0:?}: use `confined` (the default) or `none` (trusted work only)")]
pub struct UnknownIsolation(pub String);

impl FromStr for Isolation {
    type Err = UnknownIsolation;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "confined" => Ok(Isolation::Confined),
            "none" => Ok(Isolation::None),
            other => Err(UnknownIsolation(other.to_string())),
        }
    }
}

/// What one confined command sees.
pub(super) struct View<'a> {
    /// The workspace, read-write at its own path.
    pub root: &'a Path,
    /// The manifest's binds.
    pub binds: &'a [BindMount],
    /// A host program the command may run (Berth's helper), read-only.
    pub helper: Option<&'a Path>,
    /// The host directory of the sandbox's egress point's socket, bound
    /// read-only at [`crate::egress::SANDBOX_EGRESS_DIR`].
    pub egress: Option<&'a Path>,
    /// Berth's home, hidden (an empty read-only directory in its place)
    /// when it lies under a system directory the command is shown: it
    /// holds every sandbox's state and secrets.
    pub home: Option<&'a Path>,
}

/// The host's directories a confined command is shown, read-only.
const SYSTEM_DIRS: [&str; 9] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// bubblewrap's arguments for `view`, up to (not including) the command,
/// and the seccomp programs to hand it on the descriptors the arguments
/// name.
pub(super) fn arguments(view: &View<'_>) -> Result<Vec<OsString>, BackendError> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |words: &[&dyn AsRef<std::ffi::OsStr>]| {
        a.extend(words.iter().map(|w| w.as_ref().to_os_string()));
    };
    push(&[
        &"--unshare-user",
        &"--unshare-pid",
        &"--unshare-ipc",
        &"--unshare-uts",
        &"--unshare-net",
        &"--unshare-cgroup-try",
        &"--disable-userns",
        &"--die-with-parent",
        &"--cap-drop",
        &"ALL",
        &"--hostname",
        &"berth",
    ]);
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    push(&[&"--symlink", &target, &path]);
                }
            }
            Ok(m) if m.is_dir() => push(&[&"--ro-bind", &path, &path]),
            _ => {}
        }
    }
    for hidden in private_etc_entries() {
        if hidden.is_dir {
            push(&[&"--tmpfs", &hidden.path, &"--remount-ro", &hidden.path]);
        } else {
            push(&[&"--ro-bind", &"/dev/null", &hidden.path]);
        }
    }
    push(&[&"--proc", &"/proc", &"--dev", &"/dev", &"--tmpfs", &"/tmp"]);
    // What Docker makes read-only or empty in a container's /proc.
    for knob in [
        "/proc/sys",
        "/proc/sysrq-trigger",
        "/proc/irq",
        "/proc/bus",
        "/proc/fs",
    ] {
        push(&[&"--ro-bind-try", &knob, &knob]);
    }
    for secret in [
        "/proc/kcore",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/sched_debug",
        "/proc/latency_stats",
    ] {
        // Only what this kernel has (bubblewrap cannot make a file in
        // /proc to mount over).
        if Path::new(secret).exists() {
            push(&[&"--ro-bind", &"/dev/null", &secret]);
        }
    }
    // What is bound below (the workspace, which may lie in the home) is
    // mounted over the hiding directory, which is made read-only last.
    let hidden_home = view
        .home
        .filter(|home| home.is_dir() && SYSTEM_DIRS.iter().any(|dir| home.starts_with(dir)));
    if let Some(home) = hidden_home {
        push(&[&"--tmpfs", &home]);
    }
    push(&[&"--bind", &view.root, &view.root]);
    for bind in view.binds {
        let at = view.root.join(&bind.relative);
        let how = if bind.read_only {
            "--ro-bind"
        } else {
            "--bind"
        };
        push(&[&how, &bind.host, &at]);
    }
    if let Some(helper) = view.helper {
        push(&[&"--ro-bind", &helper, &helper]);
    }
    if let Some(egress) = view.egress {
        push(&[&"--ro-bind", &egress, &crate::egress::SANDBOX_EGRESS_DIR]);
    }
    if let Some(home) = hidden_home {
        push(&[&"--remount-ro", &home]);
    }
    push(&[&"--chdir", &view.root]);
    for n in 0..seccomp_programs()?.len() {
        push(&[
            &"--add-seccomp-fd",
            &(FIRST_SECCOMP_FD + n as i32).to_string(),
        ]);
    }
    Ok(a)
}

/// The environment a confined command starts from, before the manifest's.
pub(super) fn base_environment() -> [(&'static str, &'static str); 2] {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/tmp"),
    ]
}

fn seccomp_programs() -> Result<&'static [Vec<u8>], BackendError> {
    static PROGRAMS: OnceLock<Result<Vec<Vec<u8>>, String>> = OnceLock::new();
    PROGRAMS
        .get_or_init(|| super::seccomp::programs().map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|e| BackendError::Unsupported {
            backend: super::BACKEND,
            what: "confine commands",
            why: e.clone(),
        })
}

/// The seccomp programs with the descriptor [`arguments`] names for each.
pub(super) fn seccomp_programs_by_fd() -> Result<Vec<(i32, &'static Vec<u8>)>, BackendError> {
    Ok(seccomp_programs()?
        .iter()
        .enumerate()
        .map(|(n, p)| (FIRST_SECCOMP_FD + n as i32, p))
        .collect())
}

/// The seccomp programs, each in an in-memory file at offset 0, to
/// be placed at the descriptors [`arguments`] names ([`place_fds`]).
pub(super) fn seccomp_files() -> Result<Vec<OwnedFd>, BackendError> {
    use std::io::{Seek, Write};
    let mut out = Vec::new();
    for program in seccomp_programs()? {
        // SAFETY: memfd_create takes a NUL-terminated name and flags and
        // returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"berth-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(failed(std::io::Error::last_os_error()));
        }
        // SAFETY: fd was just created and belongs to nobody else.
        let created = unsafe { OwnedFd::from_raw_fd(fd) };
        // Above every descriptor place_fds writes to, so moving one file
        // into place never overwrites another that is still to be moved.
        // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor from one we own.
        let high = unsafe {
            libc::fcntl(
                created.as_raw_fd(),
                libc::F_DUPFD_CLOEXEC,
                FIRST_SECCOMP_FD + 64,
            )
        };
        if high < 0 {
            return Err(failed(std::io::Error::last_os_error()));
        }
        drop(created);
        // SAFETY: high was just made and belongs to nobody else.
        let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(high) });
        file.write_all(program).map_err(failed)?;
        file.rewind().map_err(failed)?;
        out.push(OwnedFd::from(file));
    }
    Ok(out)
}

fn failed(e: std::io::Error) -> BackendError {
    BackendError::Operation {
        backend: super::BACKEND,
        operation: "preparing the seccomp filter",
        source: Box::new(e),
    }
}

/// In the child, before exec: moves each of `fds` to the descriptor
/// [`arguments`] named for it (`dup2` clears close-on-exec on the copy).
///
/// # Safety
/// Only async-signal-safe calls: for `pre_exec`.
pub(super) unsafe fn place_fds(fds: &[i32]) -> std::io::Result<()> {
    for (n, &fd) in fds.iter().enumerate() {
        // SAFETY: dup2 on descriptors this process owns.
        if unsafe { libc::dup2(fd, FIRST_SECCOMP_FD + n as i32) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The raw numbers of `files`, for [`place_fds`].
pub(super) fn raw(files: &[OwnedFd]) -> Vec<i32> {
    files.iter().map(AsRawFd::as_raw_fd).collect()
}

/// An entry of `/etc` not every user may read, hidden from commands.
struct Hidden {
    path: PathBuf,
    is_dir: bool,
}

/// Every entry under `/etc` whose mode denies other users reading it (a
/// directory: reading or searching it), not looking inside those. Read
/// once per process.
fn private_etc_entries() -> &'static [Hidden] {
    static HIDDEN: OnceLock<Vec<Hidden>> = OnceLock::new();
    HIDDEN.get_or_init(|| {
        let mut out = Vec::new();
        collect_private(Path::new("/etc"), 0, &mut out);
        out
    })
}

fn collect_private(dir: &Path, depth: usize, out: &mut Vec<Hidden>) {
    use std::os::unix::fs::PermissionsExt;
    if depth > 8 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        let mode = meta.permissions().mode();
        let path = entry.path();
        if meta.is_dir() {
            if mode & 0o005 != 0o005 {
                out.push(Hidden { path, is_dir: true });
            } else {
                collect_private(&path, depth + 1, out);
            }
        } else if meta.is_file() && mode & 0o004 == 0 {
            out.push(Hidden {
                path,
                is_dir: false,
            });
        }
    }
}

/// Whether commands can be confined on this host: runs `true` under the
/// same confinement once per process (a success is remembered; a failure
/// is tried again next time). The error names the cause and the two ways
/// out.
pub(super) async fn check() -> Result<(), BackendError> {
    static CONFINES: OnceLock<()> = OnceLock::new();
    if CONFINES.get().is_some() {
        return Ok(());
    }
    let scratch = tempfile::tempdir().map_err(|e| BackendError::Operation {
        backend: super::BACKEND,
        operation: "checking that commands can be confined",
        source: Box::new(e),
    })?;
    let view = View {
        root: scratch.path(),
        binds: &[],
        helper: None,
        egress: None,
        home: None,
    };
    let args = arguments(&view)?;
    let files = seccomp_files()?;
    let fds = raw(&files);
    let mut command = tokio::process::Command::new(BWRAP);
    command
        .args(&args)
        .args(["--", "true"])
        .env_clear()
        .envs(base_environment())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: place_fds only calls dup2.
    unsafe {
        command.pre_exec(move || place_fds(&fds));
    }
    let out = command.output().await;
    drop(files);
    let cause = match out {
        Ok(out) if out.status.success() => {
            let _ = CONFINES.set(());
            return Ok(());
        }
        Ok(out) => {
            let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
            format!(
                "bubblewrap could not set the sandbox up ({}){}",
                out.status,
                if said.is_empty() {
                    String::new()
                } else {
                    format!(": {said}")
                }
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            "bubblewrap is not installed (`apt-get install bubblewrap`, `dnf install bubblewrap`)"
                .to_string()
        }
        Err(e) => format!("bubblewrap could not be run: {e}"),
    };
    Err(BackendError::Unconfined {
        backend: super::BACKEND,
        cause,
        remedy: "fix the host (install bubblewrap; allow unprivileged user namespaces: \
                 sysctl user.max_user_namespaces, kernel.apparmor_restrict_unprivileged_userns=0 \
                 or an AppArmor profile for bwrap; outside an unprivileged container), \
                 or, for trusted work only, create the sandbox with `--isolation none` \
                 (-o isolation=none; the API's \"isolation\": \"none\")"
            .to_string(),
    })
}
