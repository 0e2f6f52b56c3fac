//! `berth-agent proc DIR OP …`: background processes that outlive the
//! command (and the agent session) that started them.
//!
//! `start` launches a supervisor in a session of its own, which runs the
//! command under `sh -c` in its own process group and writes, under
//! `DIR/ID/`: `command`, `started` (Unix milliseconds), `supervisor` (its
//! pid and start time, which tell a live supervisor from a reused pid),
//! `pid` (the command's group), the logs, and at the end `exit` (the exit
//! code; 128+N for signal N). Each stream's log is a ring of two segment
//! files (`stdout.N`, `stdout.N+1`) of half the ring's size each, the
//! older removed when a third begins, so a chatty process keeps at most
//! the ring's size on disk per stream. A process whose supervisor is gone
//! without an `exit` (its container was restarted) is `lost`.
//!
//! Exit codes: 0 done; 1 failed (the reason on stderr); 3 no such
//! process; 5 a process of that id is still running.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::json;
use crate::tree::{kill_tree, start_time};

const NOT_FOUND: i32 = 3;
const RUNNING: i32 = 5;
/// The process has exited: there is nothing to signal.
const EXITED: i32 = 6;
const STREAMS: [&str; 2] = ["stdout", "stderr"];
const POLL: Duration = Duration::from_millis(50);

struct Failure(i32, String);

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure(
            if e.kind() == io::ErrorKind::NotFound {
                NOT_FOUND
            } else {
                1
            },
            e.to_string(),
        )
    }
}

pub(crate) fn main(args: &[String]) -> i32 {
    let (Some(dir), Some(op)) = (args.first(), args.get(1)) else {
        eprintln!("berth-agent proc: usage: proc DIR OP ARGS (see --help)");
        return 2;
    };
    match run(Path::new(dir), op, &args[2..]) {
        Ok(code) => code,
        Err(Failure(code, why)) => {
            eprintln!("berth-agent proc: {op}: {why}");
            code
        }
    }
}

// Kept as one function: one match arm per `proc` operation (start,
// supervise, list, logs, kill, wait, rm), each a few lines; its length is the
// list.
fn run(dir: &Path, op: &str, args: &[String]) -> Result<i32, Failure> {
    let arg = |i: usize, what: &str| {
        args.get(i)
            .map(String::as_str)
            .ok_or_else(|| Failure(2, format!("{what} is needed")))
    };
    match op {
        "start" => {
            let id = checked_id(arg(0, "ID")?)?;
            let ring: u64 = arg(1, "RING")?
                .parse()
                .map_err(|_| Failure(2, "RING must be a number of bytes".into()))?;
            start(dir, id, ring, arg(2, "CWD")?, arg(3, "COMMAND")?)
        }
        "supervise" => {
            let id = checked_id(arg(0, "ID")?)?;
            let ring: u64 = arg(1, "RING")?.parse().unwrap_or(1 << 20);
            supervise(&dir.join(id), ring, arg(2, "CWD")?, arg(3, "COMMAND")?);
            Ok(0)
        }
        "list" => {
            let mut out = io::stdout().lock();
            let mut ids: Vec<String> = match std::fs::read_dir(dir) {
                Ok(d) => d
                    .filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| checked_id(n).is_ok())
                    .collect(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            ids.sort();
            for id in ids {
                if let Some(line) = describe(&dir.join(&id), &id) {
                    writeln!(out, "{line}")?;
                }
            }
            Ok(0)
        }
        "logs" => {
            let id = checked_id(arg(0, "ID")?)?;
            let here = existing(dir, id)?;
            let follow = args.iter().any(|a| a == "--follow");
            let tail = args
                .iter()
                .position(|a| a == "--tail")
                .and_then(|i| args.get(i + 1))
                .map(|n| n.parse::<u64>())
                .transpose()
                .map_err(|_| Failure(2, "--tail takes a number of lines".into()))?;
            logs(&here, follow, tail)?;
            Ok(0)
        }
        "kill" => {
            let id = checked_id(arg(0, "ID")?)?;
            let here = existing(dir, id)?;
            let signal = signal_number(arg(1, "SIGNAL")?)?;
            if state(&here) != State::Running {
                return Err(Failure(EXITED, format!("{id} has exited")));
            }
            let pid = read_number(&here.join("pid"))
                .ok_or_else(|| Failure(1, format!("{id} has no process group yet")))?
                as i32;
            if signal == libc::SIGKILL {
                kill_tree(pid);
            } else {
                // SAFETY: killpg sends a signal; no memory is involved.
                if unsafe { libc::killpg(pid, signal) } != 0 {
                    return Err(io::Error::last_os_error().into());
                }
            }
            Ok(0)
        }
        "kill-all" => {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let here = entry.path();
                if state(&here) == State::Running {
                    if let Some(pid) = read_number(&here.join("pid")) {
                        kill_tree(pid as i32);
                    }
                }
            }
            Ok(0)
        }
        "wait" => {
            let id = checked_id(arg(0, "ID")?)?;
            let here = existing(dir, id)?;
            loop {
                match state(&here) {
                    State::Exited(code) => {
                        println!("{code}");
                        return Ok(0);
                    }
                    State::Lost => {
                        return Err(Failure(
                            1,
                            format!("{id} was lost (its sandbox restarted while it ran)"),
                        ))
                    }
                    State::Running => std::thread::sleep(POLL),
                }
            }
        }
        "rm" => {
            let id = checked_id(arg(0, "ID")?)?;
            let here = existing(dir, id)?;
            if state(&here) == State::Running {
                return Err(Failure(RUNNING, format!("{id} is running: kill it first")));
            }
            std::fs::remove_dir_all(&here)?;
            Ok(0)
        }
        other => Err(Failure(2, format!("unknown operation {other:?}"))),
    }
}

/// Ids are file names under DIR: letters, digits, `-`, `_`, `.`, not
/// starting with a dot, at most 64 bytes.
fn checked_id(id: &str) -> Result<&str, Failure> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(id)
    } else {
        Err(Failure(
            2,
            format!("{id:?} is not a process id (letters, digits, '-', '_', '.'; at most 64)"),
        ))
    }
}

fn existing(dir: &Path, id: &str) -> Result<PathBuf, Failure> {
    let here = dir.join(id);
    if here.join("command").is_file() {
        Ok(here)
    } else {
        Err(Failure(NOT_FOUND, format!("no background process {id:?}")))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Writes a small file whole: a reader sees it complete or not at all.
fn write_whole(path: &Path, text: &str) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Running,
    Exited(i32),
    Lost,
}

fn state(here: &Path) -> State {
    if let Some(code) = std::fs::read_to_string(here.join("exit"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
    {
        return State::Exited(code);
    }
    let supervisor = std::fs::read_to_string(here.join("supervisor")).unwrap_or_default();
    let mut parts = supervisor.split_whitespace();
    let (Some(pid), Some(started)) = (
        parts.next().and_then(|p| p.parse::<i32>().ok()),
        parts.next().and_then(|s| s.parse::<u64>().ok()),
    ) else {
        // Not written yet: a start in progress.
        return State::Running;
    };
    if start_time(pid) == Some(started) {
        State::Running
    } else {
        State::Lost
    }
}

fn describe(here: &Path, id: &str) -> Option<String> {
    let command = std::fs::read_to_string(here.join("command")).ok()?;
    let started = read_number(&here.join("started")).unwrap_or(0);
    let (state, code) = match state(here) {
        State::Running => ("running", "null".to_string()),
        State::Exited(c) => ("exited", c.to_string()),
        State::Lost => ("lost", "null".to_string()),
    };
    let pid = read_number(&here.join("pid"))
        .map(|p| p.to_string())
        .unwrap_or_else(|| "null".into());
    Some(json::object(&[
        ("id", json::string(id)),
        ("command", json::string(&command)),
        ("state", json::string(state)),
        ("started_ms", started.to_string()),
        ("exit_code", code),
        ("pid", pid),
    ]))
}

fn start(dir: &Path, id: &str, ring: u64, cwd: &str, command: &str) -> Result<i32, Failure> {
    let here = dir.join(id);
    if here.exists() {
        if state(&here) == State::Running {
            return Err(Failure(
                RUNNING,
                format!("a background process {id:?} is running: kill it or choose another name"),
            ));
        }
        std::fs::remove_dir_all(&here)?;
    }
    std::fs::create_dir_all(&here)?;
    std::fs::write(here.join("command"), command)?;
    std::fs::write(here.join("started"), now_ms().to_string())?;
    let exe = std::env::current_exe()?;
    let mut supervisor = Command::new(exe);
    supervisor
        .args(["proc"])
        .arg(dir)
        .args(["supervise", id, &ring.to_string(), cwd, command])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe: the supervisor leaves the
    // starting command's session and group, so nothing aimed at those
    // reaches it.
    unsafe {
        supervisor.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = supervisor.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !here.join("pid").exists() {
        if let Some(status) = child.try_wait()? {
            return Err(Failure(
                1,
                format!(
                    "the supervisor ended at once ({status}); see {}",
                    here.display()
                ),
            ));
        }
        if Instant::now() > deadline {
            return Err(Failure(
                1,
                "the supervisor did not start within 10 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if let Some(line) = describe(&here, id) {
        println!("{line}");
    }
    Ok(0)
}

/// `sh -c COMMAND`, confined as `DIR/confine/` says when the backend
/// wrote it there (the local backend's confined sandboxes): the program
/// and arguments in `argv` (NUL-separated) before `-- sh -c COMMAND`, and
/// each `fd.N` file open on descriptor N.
fn confined_shell(dir: &Path, command: &str) -> io::Result<Command> {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let confine = dir.join("confine");
    let argv = match std::fs::read(confine.join("argv")) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut shell = Command::new("sh");
            shell.arg("-c").arg(command);
            return Ok(shell);
        }
        Err(e) => return Err(e),
    };
    let mut words = argv
        .split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .map(std::ffi::OsStr::from_bytes);
    let program = words
        .next()
        .ok_or_else(|| io::Error::other("confine/argv is empty"))?;
    let mut shell = Command::new(program);
    shell.args(words).args(["--", "sh", "-c", command]);
    let mut placed: Vec<(OwnedFd, i32)> = Vec::new();
    for entry in std::fs::read_dir(&confine)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(fd) = name
            .to_str()
            .and_then(|n| n.strip_prefix("fd."))
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let file = OwnedFd::from(std::fs::File::open(entry.path())?);
        // Above every target, so one move never overwrites a file still
        // to be moved. SAFETY: F_DUPFD_CLOEXEC on a descriptor we own.
        let high = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 256) };
        if high < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: high was just made and belongs to nobody else.
        placed.push((unsafe { std::os::fd::FromRawFd::from_raw_fd(high) }, fd));
    }
    let moves: Vec<(i32, i32)> = placed.iter().map(|(f, n)| (f.as_raw_fd(), *n)).collect();
    // The files stay open in this supervisor until it exits; the child
    // gets its copies.
    std::mem::forget(placed);
    // SAFETY: only dup2, which is async-signal-safe.
    unsafe {
        shell.pre_exec(move || {
            for &(from, to) in &moves {
                if libc::dup2(from, to) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(shell)
}

fn supervise(here: &Path, ring: u64, cwd: &str, command: &str) {
    let me = std::process::id() as i32;
    let _ = write_whole(
        &here.join("supervisor"),
        &format!("{me} {}", start_time(me).unwrap_or(0)),
    );
    let spawned = confined_shell(here.parent().unwrap_or(here), command).and_then(|mut shell| {
        shell
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
    });
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::write(
                here.join("stderr.0"),
                format!("cannot run sh in {cwd}: {e}\n"),
            );
            let _ = write_whole(&here.join("pid"), "0");
            let _ = write_whole(&here.join("exit"), "127");
            return;
        }
    };
    let _ = write_whole(&here.join("pid"), &child.id().to_string());
    let pipes: Vec<(Box<dyn Read + Send>, &str)> = [
        child
            .stdout
            .take()
            .map(|p| (Box::new(p) as Box<dyn Read + Send>, "stdout")),
        child
            .stderr
            .take()
            .map(|p| (Box::new(p) as Box<dyn Read + Send>, "stderr")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let code = std::thread::scope(|scope| {
        for (mut pipe, stream) in pipes {
            scope.spawn(move || {
                let mut log = Ring::new(here, stream, ring);
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => log.write(&buf[..n]),
                    }
                }
            });
        }
        match child.wait() {
            Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
            Err(_) => -1,
        }
        // The scope joins the copiers: the logs are complete once the
        // pipes close (children that keep them open are the process's own).
    });
    let _ = write_whole(&here.join("exit"), &code.to_string());
}

/// A stream's log: two segments of half the ring each.
struct Ring {
    dir: PathBuf,
    stream: &'static str,
    segment: u64,
    seq: u64,
    written: u64,
    file: Option<std::fs::File>,
}

impl Ring {
    fn new(dir: &Path, stream: &'static str, ring: u64) -> Self {
        Ring {
            dir: dir.to_path_buf(),
            stream,
            segment: (ring / 2).max(4096),
            seq: 0,
            written: 0,
            file: None,
        }
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{}.{seq}", self.stream))
    }

    fn write(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.written == self.segment {
                self.seq += 1;
                self.written = 0;
                self.file = None;
                if self.seq >= 2 {
                    let _ = std::fs::remove_file(self.path(self.seq - 2));
                }
            }
            if self.file.is_none() {
                self.file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.path(self.seq))
                    .ok();
            }
            let n = (self.segment - self.written).min(bytes.len() as u64) as usize;
            if let Some(f) = self.file.as_mut() {
                let _ = f.write_all(&bytes[..n]);
            }
            self.written += n as u64;
            bytes = &bytes[n..];
        }
    }
}

/// The segment numbers of a stream's log, oldest first.
fn segments(here: &Path, stream: &str) -> Vec<u64> {
    let prefix = format!("{stream}.");
    let mut seqs: Vec<u64> = std::fs::read_dir(here)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix(&prefix)?.parse().ok())
        .collect();
    seqs.sort_unstable();
    seqs
}

/// Where the last `lines` lines of a stream's log begin: (segment,
/// offset). Streams the segments once, keeping `lines` positions.
fn tail_start(here: &Path, stream: &str, lines: u64) -> (u64, u64) {
    let seqs = segments(here, stream);
    let Some(&first) = seqs.first() else {
        return (0, 0);
    };
    let mut starts = std::collections::VecDeque::new();
    starts.push_back((first, 0u64));
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_byte_newline = false;
    for &seq in &seqs {
        let Ok(mut f) = std::fs::File::open(here.join(format!("{stream}.{seq}"))) else {
            continue;
        };
        let mut offset = 0u64;
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for (i, &b) in buf[..n].iter().enumerate() {
                if b == b'\n' {
                    starts.push_back((seq, offset + i as u64 + 1));
                    if starts.len() as u64 > lines + 1 {
                        starts.pop_front();
                    }
                }
            }
            last_byte_newline = buf[n - 1] == b'\n';
            offset += n as u64;
        }
    }
    // A final newline starts no line of its own.
    if last_byte_newline && starts.len() as u64 > lines {
        starts.pop_back();
        while starts.len() as u64 > lines {
            starts.pop_front();
        }
    } else {
        while starts.len() as u64 > lines {
            starts.pop_front();
        }
    }
    starts.front().copied().unwrap_or((first, 0))
}

fn logs(here: &Path, follow: bool, tail: Option<u64>) -> Result<(), Failure> {
    std::thread::scope(|scope| {
        for stream in STREAMS {
            scope.spawn(move || {
                let start = match tail {
                    Some(n) => tail_start(here, stream, n),
                    None => (segments(here, stream).first().copied().unwrap_or(0), 0),
                };
                let mut out: Box<dyn Write> = if stream == "stdout" {
                    Box::new(io::stdout().lock())
                } else {
                    Box::new(io::stderr().lock())
                };
                let _ = copy_log(here, stream, start, follow, &mut out);
            });
        }
    });
    Ok(())
}

/// Writes a stream's log from `from` on; with `follow`, goes on until the
/// process has exited and everything it wrote was read.
fn copy_log(
    here: &Path,
    stream: &str,
    from: (u64, u64),
    follow: bool,
    out: &mut dyn Write,
) -> io::Result<()> {
    let (mut seq, mut offset) = from;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let finished = !matches!(state(here), State::Running);
        let path = here.join(format!("{stream}.{seq}"));
        match std::fs::File::open(&path) {
            Ok(mut f) => {
                f.seek(SeekFrom::Start(offset))?;
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    out.write_all(&buf[..n])?;
                    offset += n as u64;
                }
                out.flush()?;
            }
            Err(_) => {
                // Rotated away under us: go on from the oldest kept.
                if let Some(&oldest) = segments(here, stream).iter().find(|&&s| s > seq) {
                    seq = oldest;
                    offset = 0;
                    continue;
                }
            }
        }
        if here.join(format!("{stream}.{}", seq + 1)).exists() {
            seq += 1;
            offset = 0;
            continue;
        }
        if !follow || finished {
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
}

fn signal_number(name: &str) -> Result<i32, Failure> {
    if let Ok(n) = name.parse::<i32>() {
        return Ok(n);
    }
    let bare = name.trim_start_matches("SIG").to_ascii_uppercase();
    Ok(match bare.as_str() {
        "TERM" => libc::SIGTERM,
        "KILL" => libc::SIGKILL,
        "INT" => libc::SIGINT,
        "HUP" => libc::SIGHUP,
        "QUIT" => libc::SIGQUIT,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "STOP" => libc::SIGSTOP,
        "CONT" => libc::SIGCONT,
        _ => return Err(Failure(2, format!("unknown signal {name:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_at_most_its_size_and_the_newest_bytes() {
        let dir = std::env::temp_dir().join(format!("berth-ring-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ring = Ring::new(&dir, "stdout", 8192);
        let mut all = Vec::new();
        for i in 0..10_000u32 {
            let line = format!("line {i}\n");
            ring.write(line.as_bytes());
            all.extend_from_slice(line.as_bytes());
        }
        let seqs = segments(&dir, "stdout");
        let kept: u64 = seqs
            .iter()
            .map(|s| {
                std::fs::metadata(dir.join(format!("stdout.{s}")))
                    .unwrap()
                    .len()
            })
            .sum();
        assert!(kept <= 8192, "{kept}");
        let mut out = Vec::new();
        copy_log(&dir, "stdout", (seqs[0], 0), false, &mut out).unwrap();
        assert!(all.ends_with(&out));
        let mut last = Vec::new();
        copy_log(
            &dir,
            "stdout",
            tail_start(&dir, "stdout", 3),
            false,
            &mut last,
        )
        .unwrap();
        assert_eq!(last, b"line 9997\nline 9998\nline 9999\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
