//! `berth-agent`: Berth's helper inside a sandbox.
//!
//! - Without arguments it serves the host over its stdin and stdout (see
//!   the crate's protocol): it runs the sandbox's commands, with stdin, on
//!   a terminal when asked, and exits, killing what it runs, when the host
//!   goes away.
//! - `berth-agent fs ROOT OP …` reads and writes files confined to the
//!   workspace ROOT (see [`fs`]).
//! - `berth-agent proc DIR OP …` starts, lists, follows and kills
//!   background processes whose state and bounded logs live in DIR (see
//!   [`procs`]).
//! - `berth-agent exec PROGRAM [ARG…]` runs a command given as words,
//!   with no shell (see [`run_program`]).
//! - `berth-agent egress-bridge SOCKET ADDRESS …` carries the sandbox's
//!   proxy address to the host's egress point (see [`bridge`]).
//! - `berth-agent egress-tunnel ADDRESS` carries it over its own stdin and
//!   stdout instead, for a host that cannot bind the point's socket into
//!   the container (see [`tunnel`]).
//!
//! Each command runs under `sh -c` (or, given as words, through
//! `berth-agent exec`) in a process group of its own. On its
//! timeout (or the host's kill) the agent stops, then kills, the group and
//! every descendant it can find, round after round until none is left, so
//! fork bombs and children that ignore SIGTERM go too.

mod bridge;
mod freeze;
mod fs;
mod json;
mod procs;
mod run_program;
mod session;
mod staging;
mod tree;
mod tunnel;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        None => {
            session::serve();
            0
        }
        // `fs ROOT settle STAGING` moves a staged restore into place with
        // the file operations' own helpers (see [`staging`]).
        Some("fs") if args.get(2).map(String::as_str) == Some("settle") => {
            staging::main(&args[1], &args[3..])
        }
        Some("fs") => fs::main(&args[1..]),
        Some("proc") => procs::main(&args[1..]),
        Some("exec") => run_program::main(&args[1..]),
        Some("egress-bridge") => bridge::main(&args[1..]),
        Some("egress-tunnel") => tunnel::main(&args[1..]),
        Some("--help" | "-h" | "help") => {
            println!("{}", USAGE);
            0
        }
        Some(other) => {
            eprintln!("berth-agent: unknown command {other:?}\n{USAGE}");
            2
        }
    };
    std::process::exit(code)
}

const USAGE: &str = "usage:
  berth-agent                         serve the host on stdin/stdout
  berth-agent fs ROOT read PATH       a file's bytes on stdout
  berth-agent fs ROOT write PATH SIZE MODE   stdin (SIZE bytes) to PATH, atomically; MODE octal or -
  berth-agent fs ROOT stat PATH       one JSON line
  berth-agent fs ROOT ls PATH         a JSON line per entry
  berth-agent fs ROOT rm PATH [-r]    remove a file (or a tree)
  berth-agent fs ROOT mkdir PATH [-p] make a directory (and its parents)
  berth-agent fs ROOT settle STAGING  put a restore staged in ROOT/STAGING in place; ROOT takes STAGING's times
  berth-agent fs ROOT tar PATH        a tar of PATH on stdout
  berth-agent fs ROOT untar PATH CAP  a tar on stdin into directory PATH (at most CAP bytes)
  berth-agent fs ROOT walk [--freeze] the workspace's entries and changed files on stdout (a walk request on stdin),
                                      every other process stopped meanwhile with --freeze
  berth-agent proc DIR start ID RING CWD COMMAND   run COMMAND in the background
  berth-agent proc DIR list           a JSON line per process
  berth-agent proc DIR logs ID [--follow] [--tail N]
  berth-agent proc DIR kill ID SIGNAL | kill-all
  berth-agent proc DIR wait ID
  berth-agent proc DIR rm ID
  berth-agent exec PROGRAM [ARG…]     run PROGRAM with ARGs, no shell (127: not found, 126: not executable)
  berth-agent egress-bridge SOCKET ADDRESS -- COMMAND…   carry ADDRESS (TCP) to SOCKET (the host's egress point) while COMMAND runs
  berth-agent egress-bridge SOCKET ADDRESS --daemon      the same, in the background, for every command of a container
  berth-agent egress-tunnel ADDRESS   carry ADDRESS (TCP) to the host over stdin/stdout (tunnel frames) until stdin ends";
