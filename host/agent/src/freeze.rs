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
struct Frozen(HashSet<i32>);

impl Drop for Frozen {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: kill sends a signal; no memory is involved.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }
}

fn freeze() -> Frozen {
    let me = std::process::id() as i32;
    let mut spared = HashSet::new();
    let all = processes();
    let mut at = me;
    while at > 0 && spared.insert(at) {
        at = all.get(&at).map(|p| p.0).unwrap_or(0);
    }
    let mut frozen = Frozen(HashSet::new());
    for _ in 0..100 {
        let mut more = false;
        for (pid, (_, state)) in processes() {
            if spared.contains(&pid) || frozen.0.contains(&pid) {
                continue;
            }
            // Already stopped by someone else, a zombie, or dead: leave.
            if matches!(state, 'T' | 't' | 'Z' | 'X') {
                continue;
            }
            // SAFETY: as above.
            if unsafe { libc::kill(pid, libc::SIGSTOP) } == 0 {
                frozen.0.insert(pid);
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
