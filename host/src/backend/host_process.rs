//! A command run as a process of this host, on pipes or on a new
//! terminal, driven as an [`ExecProcess`]: output as events, stdin with
//! back-pressure, signals and resizes, and the timeout or a dropped reader
//! killing its whole process group.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::exec::TIMEOUT_EXIT_CODE;
use super::{
    BackendError, ExecDriver, ExecEvent, ExecExit, ExecInput, ExecProcess, ExecRequest, PtySize,
};

/// How long output may go on after a kill before it is abandoned (what
/// escaped the group and still holds the pipes).
const KILL_GRACE: Duration = Duration::from_secs(2);
/// Stdin chunks queued for the command before input waits.
const STDIN_QUEUE: usize = 16;

fn failed(
    operation: &'static str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> BackendError {
    BackendError::Operation {
        backend: "local backend",
        operation,
        source: e.into(),
    }
}

/// A new terminal: its controlling side and the command's side.
fn open_pty(size: PtySize) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (mut master, mut slave) = (-1, -1);
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors into locals we own and reads
    // the size; name and termios may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened and belong to nobody else.
    let pair = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&pair.0, &pair.1] {
        // SAFETY: sets close-on-exec on a descriptor we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(pair)
}

fn set_size(fd: i32, size: PtySize) {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize we own.
    unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) };
}

fn kill_group(pgid: i32, signal: i32) {
    if pgid > 0 {
        // SAFETY: killpg only sends a signal; a stale id fails with ESRCH.
        unsafe { libc::killpg(pgid, signal) };
    }
}

/// Moves descriptors into place in a child before exec; only
/// async-signal-safe calls.
pub(crate) type PlaceFds = unsafe fn(&[i32]) -> std::io::Result<()>;

/// In the child between fork and exec: joins each control group whose
/// `cgroup.procs` is open at `procs`.
///
/// # Safety
/// Only async-signal-safe calls (`write`).
unsafe fn join_cgroups(procs: &[i32]) -> std::io::Result<()> {
    for &fd in procs {
        // SAFETY: write(2) on a descriptor this process holds.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// How to start a command on this host.
pub(crate) struct Launch {
    /// The program (`sh`, or `bwrap` confining `sh`).
    pub program: std::ffi::OsString,
    /// Its arguments.
    pub args: Vec<std::ffi::OsString>,
    /// When set, the program gets only these variables (then the
    /// request's), not this process's environment.
    pub clean_env: Option<Vec<(&'static str, &'static str)>>,
    /// Descriptors the child gets, each moved by `place` before exec.
    pub fds: Vec<OwnedFd>,
    /// Moves `fds` into place in the child (async-signal-safe).
    pub place: Option<PlaceFds>,
    /// `cgroup.procs` files the child joins before anything else (see
    /// `local::cgroup`).
    pub cgroups: Vec<OwnedFd>,
}

/// Starts `launch` in `dir` in a process group of its own (a session of
/// its own on a terminal) and drives it on a task of the current runtime.
pub(crate) fn spawn(
    dir: &Path,
    launch: Launch,
    request: &ExecRequest,
) -> Result<ExecProcess, BackendError> {
    let mut cmd = tokio::process::Command::new(&launch.program);
    cmd.args(&launch.args).current_dir(dir).kill_on_drop(true);
    if let Some(base) = &launch.clean_env {
        cmd.env_clear().envs(base.iter().copied());
    }
    cmd.envs(&request.env);
    if !launch.cgroups.is_empty() {
        let procs: Vec<i32> = launch.cgroups.iter().map(AsRawFd::as_raw_fd).collect();
        // SAFETY: `join` only writes to descriptors the child holds.
        unsafe {
            cmd.pre_exec(move || join_cgroups(&procs));
        }
    }
    if let Some(place) = launch.place {
        let fds: Vec<i32> = launch.fds.iter().map(AsRawFd::as_raw_fd).collect();
        // SAFETY: `place` is async-signal-safe by its contract.
        unsafe {
            cmd.pre_exec(move || place(&fds));
        }
    }
    let mut master = None;
    match request.pty {
        Some(size) => {
            let (m, slave) = open_pty(size).map_err(|e| failed("opening a terminal", e))?;
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| failed("opening a terminal", e));
            cmd.stdin(Stdio::from(dup(&slave)?))
                .stdout(Stdio::from(dup(&slave)?))
                .stderr(Stdio::from(slave))
                .env(
                    "TERM",
                    request.env.get("TERM").cloned().unwrap_or_else(|| {
                        std::env::var("TERM").unwrap_or_else(|_| "xterm".into())
                    }),
                );
            // SAFETY: setsid and ioctl are async-signal-safe; the new
            // session takes the terminal (fd 0) as its controlling one.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            master = Some(m);
        }
        None => {
            cmd.process_group(0)
                .stdin(if request.stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
        }
    }
    let mut child = cmd.spawn().map_err(|e| failed("starting the command", e))?;
    // The terminal's command side closes here, or its output never ends;
    // the child has its copies of the descriptors.
    drop(cmd);
    drop(launch.fds);
    drop(launch.cgroups);
    let pgid = child.id().unwrap_or(0) as i32;
    let (process, driver) = ExecProcess::channel();
    type Reader = Box<dyn AsyncRead + Send + Unpin>;
    type Writer = Box<dyn AsyncWrite + Send + Unpin>;
    let (out, err, stdin, pty_fd): (Option<Reader>, Option<Reader>, Option<Writer>, i32) =
        match master {
            Some(m) => {
                let fd = m.as_raw_fd();
                let reader = m.try_clone().map_err(|e| failed("opening a terminal", e))?;
                let writer = tokio::fs::File::from_std(std::fs::File::from(m));
                let reader = tokio::fs::File::from_std(std::fs::File::from(reader));
                (Some(Box::new(reader)), None, Some(Box::new(writer)), fd)
            }
            None => (
                child.stdout.take().map(|s| Box::new(s) as Reader),
                child.stderr.take().map(|s| Box::new(s) as Reader),
                child.stdin.take().map(|s| Box::new(s) as Writer),
                -1,
            ),
        };
    tokio::spawn(drive(
        child,
        pgid,
        driver,
        request.timeout,
        [out, err],
        stdin,
        pty_fd,
    ));
    Ok(process)
}

/// Reads one stream into events until it ends.
async fn pump(
    mut from: Box<dyn AsyncRead + Send + Unpin>,
    to: mpsc::Sender<Result<ExecEvent, BackendError>>,
    stdout: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // A terminal whose every command-side descriptor closed reads EIO:
        // that is its end.
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = Bytes::copy_from_slice(&buf[..n]);
        let event = if stdout {
            ExecEvent::Stdout(chunk)
        } else {
            ExecEvent::Stderr(chunk)
        };
        if to.send(Ok(event)).await.is_err() {
            return;
        }
    }
}

/// Writes stdin chunks in order; the end of the channel (or an empty
/// `None`) closes it.
async fn feed(mut to: Box<dyn AsyncWrite + Send + Unpin>, mut from: mpsc::Receiver<Option<Bytes>>) {
    let mut broken = false;
    while let Some(Some(chunk)) = from.recv().await {
        // After the command closed its stdin, the rest is dropped.
        if !broken && to.write_all(&chunk).await.is_err() {
            broken = true;
        }
    }
    let _ = to.shutdown().await;
}

#[allow(clippy::too_many_arguments)]
// Kept as one function: one select loop over the process's pipes, the caller's
// input and the deadline, like the Docker agent's `drive`.
async fn drive(
    mut child: tokio::process::Child,
    pgid: i32,
    driver: ExecDriver,
    timeout: Duration,
    streams: [Option<Box<dyn AsyncRead + Send + Unpin>>; 2],
    stdin: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    pty_fd: i32,
) {
    let started = Instant::now();
    let ExecDriver { events, mut input } = driver;
    let deadline = tokio::time::Instant::now() + timeout;
    let [out, err] = streams;
    let mut pumps = tokio::task::JoinSet::new();
    for (stream, is_stdout) in [(out, true), (err, false)] {
        if let Some(s) = stream {
            pumps.spawn(pump(s, events.clone(), is_stdout));
        }
    }
    let (stdin_tx, stdin_rx) = mpsc::channel::<Option<Bytes>>(STDIN_QUEUE);
    let mut stdin_tx = Some(stdin_tx);
    if let Some(s) = stdin {
        tokio::spawn(feed(s, stdin_rx));
    }
    let mut pending: Option<Option<Bytes>> = None;
    let mut status = None;
    let mut timed_out = false;
    let mut input_open = true;
    // Until the shell has exited and its output is closed (children holding
    // the pipes keep the command running), or the timeout.
    loop {
        if status.is_some() && pumps.is_empty() {
            break;
        }
        tokio::select! {
            s = child.wait(), if status.is_none() => {
                status = Some(s);
            }
            Some(_) = pumps.join_next(), if !pumps.is_empty() => {}
            msg = input.recv(), if input_open && pending.is_none() => match msg {
                None => input_open = false,
                Some(ExecInput::Stdin(b)) => pending = Some(Some(b)),
                Some(ExecInput::CloseStdin) => pending = Some(None),
                Some(ExecInput::Resize(size)) => {
                    if pty_fd >= 0 && status.is_none() {
                        set_size(pty_fd, size);
                    }
                }
                Some(ExecInput::Signal(sig)) => {
                    if status.is_none() {
                        kill_group(pgid, sig);
                    }
                }
            },
            permit = reserve(stdin_tx.clone()), if pending.is_some() => {
                let item = pending.take().flatten();
                let close = item.is_none();
                if let Some(p) = permit {
                    p.send(item);
                }
                if close {
                    stdin_tx = None;
                }
            }
            _ = events.closed() => {
                kill_group(pgid, libc::SIGKILL);
                let _ = child.kill().await;
                return;
            }
            _ = tokio::time::sleep_until(deadline) => {
                timed_out = true;
                break;
            }
        }
    }
    if timed_out {
        kill_group(pgid, libc::SIGKILL);
        let _ = child.kill().await;
        // What escaped the group and still holds the pipes gets a short
        // grace, then its output is abandoned.
        let _ = tokio::time::timeout(KILL_GRACE, async {
            while pumps.join_next().await.is_some() {}
        })
        .await;
        pumps.abort_all();
    }
    drop(stdin_tx);
    let code = match (&status, timed_out) {
        (_, true) => TIMEOUT_EXIT_CODE,
        (Some(Ok(s)), false) => s
            .code()
            .or_else(|| s.signal().map(|n| 128 + n))
            .unwrap_or(-1),
        (Some(Err(_)), false) | (None, false) => -1,
    };
    let mut exit = ExecExit::new(code, timed_out, started.elapsed());
    if timed_out {
        exit.notes.push(format!(
            "command timed out after {timeout:?} and was killed"
        ));
    }
    let last = match status {
        Some(Err(e)) => Err(failed("waiting for the command", e)),
        _ => Ok(ExecEvent::Exit(exit)),
    };
    let _ = events.send(last).await;
}

async fn reserve(
    tx: Option<mpsc::Sender<Option<Bytes>>>,
) -> Option<mpsc::OwnedPermit<Option<Bytes>>> {
    tx?.reserve_owned().await.ok()
}
