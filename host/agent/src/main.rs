//! `berth-agent`: runs a sandbox's commands inside its container, for the
//! host at the other end of one long-lived exec session (see the crate's
//! protocol). It runs with the container's user and capabilities, and
//! exits, killing what it runs, when the host goes away.
//!
//! Each command runs under `sh -c` in a process group of its own. On its
//! timeout (or the host's kill) the agent stops, then kills, the group and
//! every descendant it can find, round after round until none is left, so
//! fork bombs and children that ignore SIGTERM go too.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_agent::{ExitReport, Frame, Kind, RunRequest, CHUNK, VERSION};

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

/// A running command.
struct Job {
    pid: i32,
    killed: AtomicBool,
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
        kill_tree(job.pid);
    }
    std::process::exit(code)
}

fn main() {
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
                    let out = out.clone();
                    let sessions = sessions.clone();
                    std::thread::spawn(move || run(&out, &sessions, frame.id, request));
                }
                Err(e) => {
                    eprintln!("berth-agent: {e}; stopping");
                    kill_all_and_exit(2)
                }
            },
            Kind::Kill => {
                if let Some(job) = jobs(|j| j.get(&frame.id).cloned()) {
                    job.killed.store(true, Ordering::SeqCst);
                    kill_tree(job.pid);
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

fn run(out: &Out, sessions: &Mutex<HashMap<String, Session>>, id: u32, request: RunRequest) {
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
    let mut cmd = Command::new("sh");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
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
    match &session {
        None => {
            cmd.arg("-c")
                .arg(&request.command)
                .current_dir(&request.cwd);
        }
        Some(s) => {
            let (reader, writer) = match pipe() {
                Ok(p) => p,
                Err(e) => {
                    out.send(
                        Kind::Error,
                        id,
                        format!("cannot make a pipe: {e}").into_bytes(),
                    );
                    return;
                }
            };
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
    let job = Arc::new(Job {
        pid,
        killed: AtomicBool::new(false),
    });
    jobs(|j| j.insert(id, job.clone()));
    let (events, inbox) = mpsc::channel();
    let streams = [
        (
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            Kind::Stdout,
            request.stdout_cap,
        ),
        (
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            Kind::Stderr,
            request.stderr_cap,
        ),
    ];
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
        let deadline = started + Duration::from_millis(request.timeout_ms);
        let mut status = None;
        let mut done = 0;
        let mut timed_out = false;
        let mut dropped = (0u64, 0u64);
        while status.is_none() || done < 2 {
            let wait = if timed_out {
                Duration::from_secs(10)
            } else {
                deadline.saturating_duration_since(Instant::now())
            };
            match inbox.recv_timeout(wait) {
                Ok(Event::Exited(s)) => status = Some(s),
                Ok(Event::StreamDone(kind, n)) => {
                    done += 1;
                    if kind == Kind::Stdout {
                        dropped.0 = n;
                    } else {
                        dropped.1 = n;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) if !timed_out => {
                    timed_out = true;
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
        let timed_out = timed_out || job.killed.load(Ordering::SeqCst);
        let code = if timed_out {
            TIMEOUT_EXIT_CODE
        } else {
            match status {
                Some(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
                None => -1,
            }
        };
        if let (Some(reader), Some(name)) =
            (state_reader, session.as_ref().map(|_| &request.session))
        {
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
        jobs(|j| j.remove(&id));
        out.send(
            Kind::Exit,
            id,
            ExitReport {
                code,
                timed_out,
                stdout_dropped: dropped.0,
                stderr_dropped: dropped.1,
            }
            .encode(),
        );
    });
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

/// A process as `/proc/N/stat` describes it.
struct Proc {
    pid: i32,
    ppid: i32,
    pgrp: i32,
    zombie: bool,
}

fn processes() -> Vec<Proc> {
    let mut all = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return all;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may hold anything up to the last ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() < 3 {
            continue;
        }
        all.push(Proc {
            pid,
            ppid: fields[1].parse().unwrap_or(0),
            pgrp: fields[2].parse().unwrap_or(0),
            zombie: fields[0] == "Z",
        });
    }
    all
}

/// Stops, then kills, the command's process group and every descendant
/// of its shell, round after round until none is left.
fn kill_tree(pid: i32) {
    let me = std::process::id() as i32;
    for _ in 0..500 {
        let all = processes();
        let mut victims: HashSet<i32> = all
            .iter()
            .filter(|p| p.pgrp == pid || p.pid == pid)
            .map(|p| p.pid)
            .collect();
        loop {
            let more: Vec<i32> = all
                .iter()
                .filter(|p| victims.contains(&p.ppid) && !victims.contains(&p.pid))
                .map(|p| p.pid)
                .collect();
            if more.is_empty() {
                break;
            }
            victims.extend(more);
        }
        let living: Vec<i32> = all
            .iter()
            .filter(|p| victims.contains(&p.pid) && !p.zombie && p.pid != me && p.pid > 1)
            .map(|p| p.pid)
            .collect();
        if living.is_empty() {
            return;
        }
        for &v in &living {
            // SAFETY: kill sends a signal; no memory is involved.
            unsafe { libc::kill(v, libc::SIGSTOP) };
        }
        for &v in &living {
            // SAFETY: as above.
            unsafe { libc::kill(v, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = writeln!(
        io::stderr(),
        "berth-agent: some processes of command {pid} survived 500 rounds of SIGKILL"
    );
}
