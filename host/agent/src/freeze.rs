//! `berth-agent fs ROOT walk [--freeze]`: the workspace walked with the
//! files cache (the request on stdin, the items on stdout; see
//! `berth_agent::walk`), with every other process of the sandbox stopped
//! while it runs when asked — the agent's own freeze, since a container
//! paused by its engine cannot run the walk.
//!
//! The freeze stops (SIGSTOP) every process in the sandbox's pid namespace
//! except this one and its ancestors (the agent session that started it),
//! round after round until no new one appears, and continues (SIGCONT)
//! exactly those afterwards, whatever the walk did. A process that was
//! already stopped is left as it was.
//!
//! A walk killed mid-freeze (SIGKILL runs no destructor) must not leave
//! the sandbox stopped: before it stops anything, the walk forks a thaw
//! guard, in a session of its own, and tells it each pid before stopping
//! it. The guard continues every one of them when its pipe ends without
//! the walk's word that it thawed them itself — that is, when the walk
//! died. (Should the fork fail, in a sandbox at its process limit, the
//! walk goes on unguarded rather than fail the stop.)

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::path::Path;

use berth_agent::walk::{self, ItemWriter, Timestamp};

/// A process as `/proc/N/stat` says: parent and state.
fn processes() -> HashMap<i32, (i32, char)> {
    let mut all = HashMap::new();
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
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() < 2 {
            continue;
        }
        let state = fields[0].chars().next().unwrap_or('?');
        all.insert(pid, (fields[1].parse().unwrap_or(0), state));
    }
    all
}

/// The processes this freeze stopped; continued when dropped.
struct Frozen {
    stopped: HashSet<i32>,
    guard: Option<ThawGuard>,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &pid in &self.stopped {
            // SAFETY: kill sends a signal; no memory is involved.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
        if let Some(guard) = self.guard.take() {
            guard.thawed();
        }
    }
}

/// The word that the walk thawed what it stopped itself.
const THAWED: i32 = 0;

/// The write end of the thaw guard's pipe (see the module's docs).
struct ThawGuard {
    pipe: std::fs::File,
    pid: i32,
}

impl ThawGuard {
    /// Forks the guard; `None` (the walk goes on unguarded, as before)
    /// when the pipe or the fork fails.
    fn start() -> Option<ThawGuard> {
        use std::os::fd::FromRawFd;
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 fills the two descriptors it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: fork in this process, single-threaded here (the walk has
        // not started); the child only reads, signals and exits.
        match unsafe { libc::fork() } {
            -1 => {
                // SAFETY: closing the descriptors pipe2 made.
                unsafe {
                    libc::close(fds[0]);
                    libc::close(fds[1]);
                }
                None
            }
            0 => {
                // SAFETY: closing this child's copy of the write end.
                unsafe { libc::close(fds[1]) };
                guard(fds[0])
            }
            pid => {
                // SAFETY: closing the parent's copy of the read end; the
                // write end is owned by the File from here on.
                unsafe { libc::close(fds[0]) };
                Some(ThawGuard {
                    // SAFETY: fds[1] is open and owned by nobody else.
                    pipe: unsafe { std::fs::File::from_raw_fd(fds[1]) },
                    pid,
                })
            }
        }
    }

    /// Tells the guard `pid` is about to be stopped; `false` when the
    /// guard is gone (then nothing more is stopped).
    fn will_stop(&mut self, pid: i32) -> bool {
        self.pipe.write_all(&pid.to_ne_bytes()).is_ok()
    }

    fn thawed(mut self) {
        let _ = self.pipe.write_all(&THAWED.to_ne_bytes());
    }
}

/// The guard's life: read pids until the walk's word or the pipe's end;
/// at the end without the word, continue them all.
fn guard(pipe: i32) -> ! {
    // SAFETY: a session of its own, so a kill of the walk's group spares
    // it; stdio pointed away so it holds none of the walk's pipes open.
    unsafe { libc::setsid() };
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let mut pids = Vec::new();
    let mut word = [0u8; 4];
    let thawed = loop {
        let mut got = 0;
        while got < 4 {
            // SAFETY: read into the rest of `word`.
            let n = unsafe { libc::read(pipe, word[got..].as_mut_ptr().cast(), 4 - got) };
            if n > 0 {
                got += n as usize;
            } else if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            } else {
                break;
            }
        }
        if got < 4 {
            break false;
        }
        match i32::from_ne_bytes(word) {
            THAWED => break true,
            pid => pids.push(pid),
        }
    };
    if !thawed {
        for pid in pids {
            // SAFETY: kill sends a signal; no memory is involved.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }
    // SAFETY: _exit ends this child without running the parent's atexit.
    unsafe { libc::_exit(0) }
}

fn freeze() -> Frozen {
    let me = std::process::id() as i32;
    let mut spared = HashSet::new();
    let all = processes();
    let mut at = me;
    while at > 0 && spared.insert(at) {
        at = all.get(&at).map(|p| p.0).unwrap_or(0);
    }
    let mut frozen = Frozen {
        stopped: HashSet::new(),
        guard: ThawGuard::start(),
    };
    if let Some(guard) = &frozen.guard {
        spared.insert(guard.pid);
    }
    for _ in 0..100 {
        let mut more = false;
        for (pid, (_, state)) in processes() {
            if spared.contains(&pid) || frozen.stopped.contains(&pid) {
                continue;
            }
            // Already stopped by someone else, a zombie, or dead: leave.
            if matches!(state, 'T' | 't' | 'Z' | 'X') {
                continue;
            }
            if let Some(guard) = &mut frozen.guard {
                if !guard.will_stop(pid) {
                    return frozen;
                }
            }
            // SAFETY: as above.
            if unsafe { libc::kill(pid, libc::SIGSTOP) } == 0 {
                frozen.stopped.insert(pid);
                more = true;
            }
        }
        if !more {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    frozen
}

/// Runs the walk; returns the exit code.
pub(crate) fn main(root: &str, args: &[String]) -> i32 {
    let freezing = args.iter().any(|a| a == "--freeze");
    let request = walk::decode_request(io::stdin().lock());
    let (exclude, known) = match request {
        Ok(r) => r,
        Err(e) => {
            eprintln!("berth-agent fs: walk: reading the request: {e}");
            return 2;
        }
    };
    let stdout = io::BufWriter::with_capacity(1 << 20, io::stdout().lock());
    let mut writer = ItemWriter::new(stdout);
    let started = Timestamp::now();
    let frozen = freezing.then(freeze);
    let walked = walk::walk(Path::new(root), &exclude, &known, started, &mut |item| {
        writer.item(&item)
    });
    drop(frozen);
    match walked {
        Ok(stats) => match writer.finish(&stats) {
            Ok(mut out) => {
                let _ = out.flush();
                0
            }
            Err(e) => {
                eprintln!("berth-agent fs: walk: {e}");
                1
            }
        },
        Err(e) => {
            let _ = writer.fail(&e.to_string());
            eprintln!("berth-agent fs: walk: {e}");
            1
        }
    }
}
