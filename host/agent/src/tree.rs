//! Finding and killing a command's processes: its group and every
//! descendant, round after round, so forks cannot outrun one kill.

use std::collections::HashSet;
use std::io::{self, Write};
use std::time::Duration;

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
pub(crate) fn kill_tree(pid: i32) {
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

/// The start time (in clock ticks since boot) of a live, non-zombie
/// process: with its pid, what names one process across pid reuse.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    // Field 22 of stat; the 20th after the command name.
    fields.get(19)?.parse().ok()
}
