//! The clause for commands given as words ([`ExecRequest::program`]): the
//! words reach the program as they are, over generated words that a shell
//! would change; a shell builtin never stands in for a program; a program
//! that cannot be started ends as a shell reports it; words that cannot
//! run are refused before anything starts.

use std::time::Duration;

use super::commands::{chain, run};
use crate::backend::{BackendError, ExecRequest, ExecResult};
use crate::sandbox::{Sandbox, SandboxError};

/// Generated word lists per run (seeded: the seed is in the report).
const ROUNDS: usize = 12;
/// Pieces words are made of: what `sh` would expand, split, glob, quote or
/// end a command at, and plain text.
const PIECES: &[&str] = &[
    "$HOME", "${PATH}", "$(id)", "`id`", "*", "?", "[a]", "~", ";", "&&", "|", "&", ">", "<", "'",
    "\"", "\\", " ", "\t", "\n", "#", "-", "--", "-e", "%s", "é", "日本", "a", "word", "=",
];

async fn exec_words(sandbox: &Sandbox, words: &[String]) -> Result<ExecResult, String> {
    sandbox
        .exec(ExecRequest::program(
            words.to_vec(),
            Duration::from_secs(60),
        ))
        .await
        .map_err(|e| chain("exec (argv)", &e))
}

/// A small seeded generator (xorshift), so a failing run can be repeated.
struct Words(u64);

impl Words {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A word of 0 to 4 pieces (the empty word included).
    fn word(&mut self) -> String {
        let pieces = self.next() % 5;
        (0..pieces)
            .map(|_| PIECES[(self.next() % PIECES.len() as u64) as usize])
            .collect()
    }
}

/// The clause's body, on a started sandbox.
pub(super) async fn words_reach_the_program(sandbox: &Sandbox) -> Result<String, String> {
    let seed = crate::random_id::random_u64() | 1;
    let mut words = Words(seed);
    for round in 0..ROUNDS {
        let count = 1 + (words.next() % 8) as usize;
        let given: Vec<String> = (0..count).map(|_| words.word()).collect();
        // `printf` the program prints each word and a NUL: exactly the
        // words, if nothing changed them on the way.
        let mut argv = vec!["printf".to_string(), "%s\\0".to_string()];
        argv.extend(given.iter().cloned());
        let r = exec_words(sandbox, &argv).await?;
        let want: String = given.iter().map(|w| format!("{w}\0")).collect();
        if r.exit_code != 0 || r.stdout != want {
            return Err(format!(
                "seed {seed:#x}, round {round}: words {given:?} came out as {:?} (exit {}, stderr {:?})",
                r.stdout, r.exit_code, r.stderr
            ));
        }
    }

    // `cd` is a shell builtin; a program of that name on PATH runs.
    let root = run(sandbox, "pwd").await?.trim_end().to_string();
    run(
        sandbox,
        "mkdir -p .berth-words && printf '#!/bin/sh\\necho the program\\n' > .berth-words/cd && chmod +x .berth-words/cd",
    )
    .await?;
    let path =
        format!("{root}/.berth-words:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    let program = sandbox
        .exec(ExecRequest::program(["cd"], Duration::from_secs(60)).env("PATH", path.clone()))
        .await
        .map_err(|e| chain("exec (argv)", &e))?;
    let line = sandbox
        .exec(ExecRequest::new("cd", Duration::from_secs(60)).env("PATH", path))
        .await
        .map_err(|e| chain("exec", &e))?;
    run(sandbox, "rm -rf .berth-words").await?;
    if program.stdout != "the program\n" || line.stdout == "the program\n" {
        return Err(format!(
            "argv [\"cd\"] printed {:?} (want the program's line), the command line `cd` {:?} (want the builtin's silence)",
            program.stdout, line.stdout
        ));
    }

    let missing = exec_words(sandbox, &["berth-no-such-program".into(), "x".into()]).await?;
    if missing.exit_code != 127 || !missing.stderr_text().contains("not found") {
        return Err(format!(
            "a missing program: exit {} and stderr {:?}, want 127 and \"not found\"",
            missing.exit_code, missing.stderr
        ));
    }

    for (what, request) in [
        (
            "an empty argv",
            ExecRequest::program(Vec::<String>::new(), Duration::from_secs(5)),
        ),
        (
            "argv in a shell session",
            ExecRequest::program(["true"], Duration::from_secs(5)).in_session("s"),
        ),
    ] {
        match sandbox.exec(request).await {
            Err(SandboxError::Backend(BackendError::Request(_))) => {}
            other => return Err(format!("{what}: {other:?}, want a refusal")),
        }
    }
    Ok(format!(
        "{ROUNDS} generated word lists (seed {seed:#x}) reached printf as given; a program named as a builtin ran; a missing one exited 127; an empty argv and argv in a session refused"
    ))
}
