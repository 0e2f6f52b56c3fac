//! `berth-agent egress-bridge SOCKET ADDRESS …`: the sandbox's end of its
//! egress route. A sandbox with an egress policy has no network but its
//! loopback; its proxy variables name `ADDRESS` there (`127.0.0.1:3128`),
//! and this bridge carries each connection made to it, byte for byte, to
//! the host's egress point on the Unix socket `SOCKET` (bound into the
//! sandbox). It decides nothing: the egress point does, outside.
//!
//! - `… -- COMMAND ARGS…`: listens, then runs COMMAND in its own place
//!   (same process, so its exit status is the command's); a child process
//!   bridges until COMMAND's process ends. The local backend runs every
//!   command so, each in its own network namespace.
//! - `… --daemon`: listens and bridges in the background, detached, for a
//!   container whose commands share one network namespace (Docker). If the
//!   address is taken (a bridge already runs), it leaves quietly.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Command;

const USAGE: &str = "usage: berth-agent egress-bridge SOCKET ADDRESS (-- COMMAND ARGS… | --daemon)";

/// Runs the bridge as `args` (after `egress-bridge`) say.
pub fn main(args: &[String]) -> i32 {
    let (socket, address, rest) = match args {
        [socket, address, rest @ ..] if !rest.is_empty() => (socket, address, rest),
        _ => {
            eprintln!("{USAGE}");
            return 2;
        }
    };
    match rest {
        [flag] if flag == "--daemon" => daemon(socket, address),
        [dashes, command @ ..] if dashes == "--" && !command.is_empty() => {
            in_front_of(socket, address, command)
        }
        _ => {
            eprintln!("{USAGE}");
            2
        }
    }
}

/// Listens on `address`: `Ok(None)` when it is taken (a bridge already
/// serves this namespace), `Err(exit code)` after saying why it failed.
fn listen(address: &str) -> Result<Option<TcpListener>, i32> {
    match TcpListener::bind(address) {
        Ok(l) => Ok(Some(l)),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Ok(None),
        Err(e) => {
            eprintln!("berth-agent egress-bridge: listening on {address}: {e}");
            Err(1)
        }
    }
}

/// Forks: `Ok(true)` in the child, `Ok(false)` in the parent, `Err(exit
/// code)` after saying why it failed.
fn fork() -> Result<bool, i32> {
    // SAFETY: fork in a single-threaded process; the child only calls
    // async-signal-safe functions before it runs Rust again as the only
    // thread of its own process.
    match unsafe { libc::fork() } {
        -1 => {
            eprintln!(
                "berth-agent egress-bridge: fork: {}",
                io::Error::last_os_error()
            );
            Err(1)
        }
        0 => Ok(true),
        _ => Ok(false),
    }
}

fn daemon(socket: &str, address: &str) -> i32 {
    let listener = match listen(address) {
        Ok(Some(l)) => l,
        Ok(None) => return 0,
        Err(code) => return code,
    };
    match fork() {
        Ok(true) => {
            // SAFETY: setsid in the new child, which leads no group yet.
            unsafe { libc::setsid() };
            detach_stdio();
            serve(listener, socket);
            0
        }
        Ok(false) => 0,
        Err(code) => code,
    }
}

fn in_front_of(socket: &str, address: &str, command: &[String]) -> i32 {
    let mut run = Command::new(&command[0]);
    run.args(&command[1..]);
    let listener = match listen(address) {
        Ok(Some(l)) => l,
        // Someone bridges this namespace already: the command uses theirs.
        Ok(None) => return exec(run, &command[0]),
        Err(code) => return code,
    };
    match fork() {
        Ok(true) => {
            // The bridge ends when the command's process does.
            // SAFETY: prctl on this process.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            // SAFETY: getppid never fails.
            if unsafe { libc::getppid() } == 1 {
                std::process::exit(0);
            }
            detach_stdio();
            serve(listener, socket);
            0
        }
        Ok(false) => {
            drop(listener);
            exec(run, &command[0])
        }
        Err(code) => code,
    }
}

fn exec(mut run: Command, program: &str) -> i32 {
    let e = run.exec();
    eprintln!("berth-agent egress-bridge: running {program}: {e}");
    if e.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// Points stdin, stdout and stderr at /dev/null, so the bridge holds none
/// of the command's pipes open.
fn detach_stdio() {
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
}

fn serve(listener: TcpListener, socket: &str) {
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        // Small writes go at once (see the egress point's upstream side).
        let _ = client.set_nodelay(true);
        let socket = socket.to_string();
        std::thread::spawn(move || {
            // A point that does not answer: the client sees its connection
            // closed, at once.
            if let Ok(point) = UnixStream::connect(&socket) {
                carry(client, point);
            }
        });
    }
}

/// Copies both ways until each side has closed its half.
fn carry(client: TcpStream, point: UnixStream) {
    let (Ok(client_reader), Ok(point_writer)) = (client.try_clone(), point.try_clone()) else {
        return;
    };
    let upstream = std::thread::spawn(move || {
        copy(client_reader, &point_writer);
        let _ = point_writer.shutdown(Shutdown::Write);
    });
    copy(point, &client);
    let _ = client.shutdown(Shutdown::Write);
    let _ = upstream.join();
}

fn copy(mut from: impl Read, mut to: impl Write) {
    let mut buf = vec![0u8; 256 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
