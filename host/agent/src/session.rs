//! The agent's session: runs a sandbox's commands inside its container,
//! for the host at the other end of one long-lived exec session (see the
//! crate's protocol). It runs with the container's user and capabilities,
//! and exits, killing what it runs, when the host goes away.
//!
//! Each command runs under `sh -c` in a process group of its own. On its
//! timeout (or the host's kill) the agent stops, then kills, the group and
//! every descendant it can find, round after round until none is left, so
//! fork bombs and children that ignore SIGTERM go too.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_agent::{ExitReport, Frame, Kind, RunRequest, CHUNK, STDIN_WINDOW, VERSION};

use crate::tree::kill_tree;

/// Exit code of a command its timeout killed (as `timeout(1)`).
const TIMEOUT_EXIT_CODE: i32 = 124;

/// The cap on what a session command reports of its state.
const SESSION_STATE_CAP: u64 = 1 << 20;

/// Runs a session's command, then reports its working directory and
/// exported variables on fd 3.
const SESSION_WRAPPER: &str = "__berth_cmd=$1; shift; eval \"$__berth_cmd\"; __berth_rc=$?; \
     { pwd; printf '\\0'; cat /proc/self/environ; } >&3 2>/dev/null; exit $__berth_rc";

/// Frames to the host, one writer at a time.
struct Out(Mutex<io::Stdout>);

impl Out {
    fn send(&self, kind: Kind, id: u32, payload: Vec<u8>) {
        let frame = Frame::new(kind, id, payload);
        let mut out = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if frame.write_to(&mut *out).is_err() {
            // The host is gone: nobody will read what runs here.
            kill_all_and_exit(0);
        }
    }
}

/// A running command, registered before it starts so that its stdin,
/// signals and resizes are never lost.
#[derive(Default)]
struct Job {
    /// The command's process group (its shell's pid); 0 until it runs.
    pid: AtomicI32,
    killed: AtomicBool,
    /// Where stdin chunks go; `None` when the command takes none.
    stdin: Mutex<Option<mpsc::SyncSender<Vec<u8>>>>,
    /// The terminal's controlling side, for resizes; -1 without one.
    pty: AtomicI32,
}

impl Job {
    fn pid(&self) -> i32 {
        self.pid.load(Ordering::SeqCst)
    }
}

/// A persistent shell session's state.
#[derive(Clone)]
struct Session {
    cwd: String,
    env: Vec<(String, String)>,
}

static JOBS: Mutex<Option<HashMap<u32, Arc<Job>>>> = Mutex::new(None);

fn jobs<R>(f: impl FnOnce(&mut HashMap<u32, Arc<Job>>) -> R) -> R {
    let mut guard = JOBS.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

fn kill_all_and_exit(code: i32) -> ! {
    let running: Vec<Arc<Job>> = jobs(|j| j.values().cloned().collect());
    for job in running {
        if job.pid() > 0 {
            kill_tree(job.pid());
        }
    }
    std::process::exit(code)
}

/// Serves the host until it goes away.
pub(crate) fn serve() {
    let out = Arc::new(Out(Mutex::new(io::stdout())));
    let sessions: Arc<Mutex<HashMap<String, Session>>> = Arc::default();
    out.send(Kind::Hello, 0, VERSION.to_be_bytes().to_vec());
    let mut stdin = io::stdin().lock();
    loop {
        let frame = match berth_agent::read_frame(&mut stdin) {
            Ok(Some(f)) => f,
            Ok(None) => kill_all_and_exit(0),
            Err(e) => {
                eprintln!("berth-agent: the host's stream is broken ({e}); stopping");
                kill_all_and_exit(2)
            }
        };
        match frame.kind {
            Kind::Run => match RunRequest::decode(&frame.payload) {
                Ok(request) => {
                    let job = Arc::new(Job {
                        pty: AtomicI32::new(-1),
                        ..Job::default()
                    });
                    let stdin = (request.stdin || request.pty != (0, 0)).then(|| {
                        // The host keeps at most STDIN_WINDOW chunks
                        // unacknowledged, so this never fills.
                        let (tx, rx) = mpsc::sync_channel(STDIN_WINDOW + 1);
                        if let Ok(mut s) = job.stdin.lock() {
                            *s = Some(tx);
                        }
                        rx
                    });
                    jobs(|j| j.insert(frame.id, job.clone()));
                    let out = out.clone();
                    let sessions = sessions.clone();
                    std::thread::spawn(move || {
                        run(&out, &sessions, frame.id, request, &job, stdin);
                        jobs(|j| j.remove(&frame.id));
                    });
                }
                Err(e) => {
                    eprintln!("berth-agent: {e}; stopping");
                    kill_all_and_exit(2)
                }
            },
            Kind::Kill => {
                if let Some(job) = jobs(|j| j.get(&frame.id).cloned()) {
                    job.killed.store(true, Ordering::SeqCst);
                    if job.pid() > 0 {
                        kill_tree(job.pid());
                    }
                }
            }
            Kind::Stdin => {
                let Some(job) = jobs(|j| j.get(&frame.id).cloned()) else {
                    continue;
                };
                let mut slot = job.stdin.lock().unwrap_or_else(|p| p.into_inner());
                let end = frame.payload.is_empty();
                if let Some(tx) = slot.as_ref() {
                    if tx.try_send(frame.payload).is_err() {
                        eprintln!(
                            "berth-agent: the host sent more stdin than its window; stopping"
                        );
                        kill_all_and_exit(2)
                    }
                }
                if end {
                    *slot = None;
                }
            }
            Kind::Resize => {
                let Ok((rows, cols)) = berth_agent::decode_size(&frame.payload) else {
                    eprintln!("berth-agent: an unreadable resize; stopping");
                    kill_all_and_exit(2)
                };
                if let Some(job) = jobs(|j| j.get(&frame.id).cloned()) {
                    set_size(job.pty.load(Ordering::SeqCst), rows, cols);
                }
            }
            Kind::Signal => {
                let Ok(signal) = berth_agent::decode_signal(&frame.payload) else {
                    eprintln!("berth-agent: an unreadable signal; stopping");
                    kill_all_and_exit(2)
                };
                if let Some(job) = jobs(|j| j.get(&frame.id).cloned()) {
                    if job.pid() > 0 {
                        // SAFETY: kill sends a signal; no memory is involved.
                        unsafe { libc::kill(-job.pid(), signal) };
                    }
                }
            }
            other => {
                eprintln!("berth-agent: the host sent a {other:?} frame; stopping");
                kill_all_and_exit(2)
            }
        }
    }
}

enum Event {
    Exited(std::process::ExitStatus),
    /// A stream ended; how many bytes it had over its cap.
    StreamDone(Kind, u64),
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets a terminal's size; a no-op without one.
fn set_size(fd: RawFd, rows: u16, cols: u16) {
    if fd < 0 {
        return;
    }
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize we own.
    unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &size) };
}

/// A new terminal: its controlling side and the command's side.
fn open_pty(rows: u16, cols: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    let (mut master, mut slave) = (-1, -1);
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors into locals we own and reads
    // the size; the name and termios pointers may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just opened and belong to nobody else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&master, &slave] {
        // SAFETY: sets close-on-exec on a descriptor we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok((master, slave))
}

/// Runs one command and reports it to the host: its output as it comes
/// (each stream capped), stdin as the host sends it, then its exit. In
/// steps: the command (`prepare`), its stdin (`forward_stdin`), its output
/// and exit (`collect`), and a session's new state.
fn run(
    out: &Arc<Out>,
    sessions: &Mutex<HashMap<String, Session>>,
    id: u32,
    request: RunRequest,
    job: &Arc<Job>,
    stdin: Option<mpsc::Receiver<Vec<u8>>>,
) {
    let started = Instant::now();
    let session = (!request.session.is_empty()).then(|| {
        let mut all = sessions.lock().unwrap_or_else(|p| p.into_inner());
        all.entry(request.session.clone())
            .or_insert_with(|| Session {
                cwd: request.cwd.clone(),
                env: std::env::vars().collect(),
            })
            .clone()
    });
    let Prepared {
        mut cmd,
        pty_master,
        state_pipe,
    } = match prepare(&request, session.as_ref(), job, stdin.is_some()) {
        Ok(p) => p,
        Err(why) => {
            out.send(Kind::Error, id, why.into_bytes());
            return;
        }
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            out.send(
                Kind::Error,
                id,
                format!("cannot run sh in {}: {e}", request.cwd).into_bytes(),
            );
            return;
        }
    };
    // The terminal's command side must close here, or its output never
    // ends.
    drop(cmd);
    let state_reader = state_pipe.map(|(reader, writer)| {
        drop(writer);
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = std::fs::File::from(reader)
                .take(SESSION_STATE_CAP)
                .read_to_end(&mut text);
            text
        })
    });
    let pid = child.id() as i32;
    job.pid.store(pid, Ordering::SeqCst);
    // Stdin: to the pipe, or to the terminal.
    let stdin_sink: Option<Box<dyn Write + Send>> = match (&pty_master, child.stdin.take()) {
        (Some(master), _) => master
            .try_clone()
            .ok()
            .map(|fd| Box::new(std::fs::File::from(fd)) as Box<dyn Write + Send>),
        (None, Some(pipe)) => Some(Box::new(pipe)),
        (None, None) => None,
    };
    if let (Some(sink), Some(inbox)) = (stdin_sink, stdin) {
        forward_stdin(Arc::clone(out), id, sink, inbox);
    }
    let terminal_output = pty_master
        .as_ref()
        .and_then(|m| m.try_clone().ok())
        .map(|fd| Box::new(std::fs::File::from(fd)) as Box<dyn Read + Send>);
    let stdout = match terminal_output {
        Some(t) => Some(t),
        None => child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    };
    let stderr = child
        .stderr
        .take()
        .map(|s| Box::new(s) as Box<dyn Read + Send>);
    let deadline = started + Duration::from_millis(request.timeout_ms);
    let ended = collect(
        out,
        id,
        child,
        [
            (stdout, Kind::Stdout, request.stdout_cap),
            (stderr, Kind::Stderr, request.stderr_cap),
        ],
        deadline,
    );
    let timed_out = ended.timed_out || job.killed.load(Ordering::SeqCst);
    let code = if timed_out {
        TIMEOUT_EXIT_CODE
    } else {
        match ended.status {
            Some(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
            None => -1,
        }
    };
    if let (Some(reader), Some(name)) = (state_reader, session.as_ref().map(|_| &request.session)) {
        let text = reader.join().unwrap_or_default();
        if !timed_out {
            if let Some(state) = parse_session_state(&text) {
                sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.clone(), state);
            }
        }
    }
    job.pty.store(-1, Ordering::SeqCst);
    drop(pty_master);
    out.send(
        Kind::Exit,
        id,
        ExitReport {
            code,
            timed_out,
            stdout_dropped: ended.dropped.0,
            stderr_dropped: ended.dropped.1,
        }
        .encode(),
    );
}

/// A command ready to spawn, with what must outlive the spawn: the
/// terminal's host side, and a session's state pipe (read end, write end).
struct Prepared {
    cmd: Command,
    pty_master: Option<OwnedFd>,
    state_pipe: Option<(OwnedFd, OwnedFd)>,
}

/// The `sh -c` (or `berth-agent exec`, for argv) for `request`: on a terminal of its own (a new session that
/// takes it as its controlling terminal) or on pipes in a process group of
/// its own; the first the out-of-memory killer takes; in `session`'s
/// directory and environment, its state written to fd 3 when it ends.
/// `Err` is the line the host gets.
fn prepare(
    request: &RunRequest,
    session: Option<&Session>,
    job: &Job,
    has_stdin: bool,
) -> Result<Prepared, String> {
    // A command given as words runs through `berth-agent exec` (this very
    // binary): no shell, and a missing program ends as a shell reports it.
    let mut cmd = if request.argv.is_empty() {
        Command::new("sh")
    } else if session.is_some() {
        return Err("a shell session runs command lines, not argv".into());
    } else {
        let agent = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
        let mut cmd = Command::new(agent);
        cmd.arg("exec").arg("--").args(&request.argv);
        cmd
    };
    let mut pty_master = None;
    if request.pty != (0, 0) {
        let (master, slave) = open_pty(request.pty.0, request.pty.1)
            .map_err(|e| format!("cannot open a terminal: {e}"))?;
        let (Ok(a), Ok(b)) = (slave.try_clone(), slave.try_clone()) else {
            return Err("cannot duplicate the terminal".into());
        };
        cmd.stdin(Stdio::from(slave))
            .stdout(Stdio::from(a))
            .stderr(Stdio::from(b));
        // SAFETY: setsid and ioctl are async-signal-safe; the new session
        // takes the terminal (now fd 0) as its controlling one.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.env(
            "TERM",
            std::env::var("TERM").unwrap_or_else(|_| "xterm".into()),
        );
        job.pty.store(master.as_raw_fd(), Ordering::SeqCst);
        pty_master = Some(master);
    } else {
        cmd.stdin(if has_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    }
    // The out-of-memory killer takes the command before the agent (raising
    // one's own score needs no privilege).
    // SAFETY: open, write and close are async-signal-safe; nothing is
    // allocated between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
            if fd >= 0 {
                libc::write(fd, b"1000".as_ptr().cast(), 4);
                libc::close(fd);
            }
            Ok(())
        });
    }
    let mut state_pipe = None;
    match session {
        None => {
            if request.argv.is_empty() {
                cmd.arg("-c").arg(&request.command);
            }
            cmd.current_dir(&request.cwd);
        }
        Some(s) => {
            let (reader, writer) = pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
            let fd = writer.as_raw_fd();
            // SAFETY: dup2 is async-signal-safe; it runs between fork and
            // exec and only makes the pipe's write end fd 3.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::dup2(fd, 3) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            cmd.env_clear()
                .envs(s.env.iter().map(|(k, v)| (k, v)))
                .current_dir(&s.cwd)
                .arg("-c")
                .arg(SESSION_WRAPPER)
                .arg("berth-session")
                .arg(&request.command);
            state_pipe = Some((reader, writer));
        }
    }
    cmd.envs(request.env.iter().map(|(k, v)| (k, v)));
    Ok(Prepared {
        cmd,
        pty_master,
        state_pipe,
    })
}

/// Hands the host's stdin chunks to `sink`, acknowledging each once it is
/// handed over; an empty chunk ends stdin (closing the pipe).
fn forward_stdin(
    out: Arc<Out>,
    id: u32,
    mut sink: Box<dyn Write + Send>,
    inbox: mpsc::Receiver<Vec<u8>>,
) {
    std::thread::spawn(move || {
        let mut broken = false;
        while let Ok(chunk) = inbox.recv() {
            if chunk.is_empty() {
                break;
            }
            if !broken && sink.write_all(&chunk).is_err() {
                // The command closed its stdin: the rest is dropped.
                broken = true;
            }
            out.send(Kind::StdinAck, id, Vec::new());
        }
    });
}

/// One of a command's output streams (none when it has no such stream),
/// its kind on the wire and its cap in bytes.
type Stream = (Option<Box<dyn Read + Send>>, Kind, u64);

/// How a command ended, as far as `collect` saw it.
struct Ended {
    status: Option<std::process::ExitStatus>,
    timed_out: bool,
    /// Bytes of stdout and stderr past their caps.
    dropped: (u64, u64),
}

/// Sends each stream to the host as it is read (up to its cap; the rest
/// is counted), waits for the exit, and past `deadline` kills the
/// command's tree — and once more, ten seconds on, gives up on streams
/// that something outside the tree still holds open.
fn collect(
    out: &Arc<Out>,
    id: u32,
    mut child: std::process::Child,
    streams: [Stream; 2],
    deadline: Instant,
) -> Ended {
    let pid = child.id() as i32;
    let (events, inbox) = mpsc::channel();
    std::thread::scope(|scope| {
        for (stream, kind, cap) in streams {
            let Some(mut stream) = stream else {
                let _ = events.send(Event::StreamDone(kind, 0));
                continue;
            };
            let events = events.clone();
            scope.spawn(move || {
                let mut buf = vec![0u8; CHUNK];
                let mut sent = 0u64;
                let mut dropped = 0u64;
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let room = cap.saturating_sub(sent).min(n as u64) as usize;
                            if room > 0 {
                                out.send(kind, id, buf[..room].to_vec());
                                sent += room as u64;
                            }
                            dropped += (n - room) as u64;
                        }
                    }
                }
                let _ = events.send(Event::StreamDone(kind, dropped));
            });
        }
        let waiter = events.clone();
        scope.spawn(move || {
            if let Ok(status) = child.wait() {
                let _ = waiter.send(Event::Exited(status));
            }
        });
        drop(events);
        let mut ended = Ended {
            status: None,
            timed_out: false,
            dropped: (0, 0),
        };
        let mut done = 0;
        while ended.status.is_none() || done < 2 {
            let wait = if ended.timed_out {
                Duration::from_secs(10)
            } else {
                deadline.saturating_duration_since(Instant::now())
            };
            match inbox.recv_timeout(wait) {
                Ok(Event::Exited(s)) => ended.status = Some(s),
                Ok(Event::StreamDone(kind, n)) => {
                    done += 1;
                    if kind == Kind::Stdout {
                        ended.dropped.0 = n;
                    } else {
                        ended.dropped.1 = n;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) if !ended.timed_out => {
                    ended.timed_out = true;
                    kill_tree(pid);
                }
                Err(_) => {
                    // Killed and still not done: something holds the
                    // pipes that no round could reach. Report what we have.
                    kill_tree(pid);
                    break;
                }
            }
        }
        ended
    })
}

/// `pwd`, a NUL, then `/proc/self/environ` (NUL-separated `K=V`).
fn parse_session_state(text: &[u8]) -> Option<Session> {
    let split = text.iter().position(|&b| b == 0)?;
    let cwd = String::from_utf8_lossy(&text[..split])
        .trim_end_matches('\n')
        .to_string();
    if cwd.is_empty() {
        return None;
    }
    let env = text[split + 1..]
        .split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            (!k.is_empty() && k != "_" && k != "__berth_cmd")
                .then(|| (k.to_string(), v.to_string()))
        })
        .collect();
    Some(Session { cwd, env })
}
