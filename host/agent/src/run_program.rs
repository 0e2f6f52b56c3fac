//! `berth-agent exec PROGRAM [ARG…]`: runs a command given as words, with
//! no shell, as `execvp(3)` does — found on `PATH` (or taken as a path
//! when it holds a `/`), never a shell builtin or function of that name.
//! A program that cannot be started ends with the exit code a shell gives
//! it — 127 when it is not found, 126 when it cannot be executed — and the
//! reason on stderr, so every backend reports it alike.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Exit code for a program that is not there (as `sh` reports it).
const NOT_FOUND: i32 = 127;
/// Exit code for a program that is there but cannot be executed.
const NOT_EXECUTABLE: i32 = 126;

/// Replaces this process with `args[0]` run with `args[1..]` (a leading
/// `--` is skipped); returns only when that fails, with the exit code.
pub(crate) fn main(args: &[String]) -> i32 {
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
    let Some((program, rest)) = args.split_first() else {
        eprintln!("berth-agent exec: no program given");
        return 2;
    };
    let error = Command::new(program).args(rest).exec();
    eprintln!("{program}: {}", describe(&error));
    match error.kind() {
        std::io::ErrorKind::NotFound => NOT_FOUND,
        _ => NOT_EXECUTABLE,
    }
}

/// The reason in the words a shell uses.
fn describe(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => "not found".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => error.to_string(),
    }
}
