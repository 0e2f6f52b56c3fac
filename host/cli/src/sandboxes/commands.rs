//! `berth exec|ps|logs|kill|wait|shell`: commands as agents and people
//! use them: output streamed as it is produced, stdin, background
//! processes, and an interactive terminal.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use berth::backend::{ExecEvent, ExecExit, ExecInput, ExecInputSender, ExecProcess, ExecRequest};
use berth::sandbox::BackgroundProcess;
use berth::DetachRequest;
use clap::Args;
use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::server::{encode, Remote};

/// `berth exec`.
#[derive(Args)]
pub struct ExecArgs {
    /// Sandbox name.
    name: String,
    /// Timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// Extra environment (KEY=VALUE, repeatable).
    #[arg(long = "env")]
    env: Vec<String>,
    /// Collect the output and print the result as JSON (each stream capped,
    /// its start and end kept) instead of streaming it through.
    #[arg(long)]
    json: bool,
    /// Stream this program's stdin to the command.
    #[arg(short = 'i', long)]
    interactive: bool,
    /// Run it in the background and print its id at once (see `berth ps`,
    /// `berth logs`, `berth kill`).
    #[arg(short = 'd', long, conflicts_with_all = ["interactive", "json"])]
    detach: bool,
    /// With --detach: the background process's id (letters, digits, '-',
    /// '_', '.'). By default, one is made up.
    #[arg(long = "name", requires = "detach")]
    name_as: Option<String>,
    /// With --detach: bytes of each stream's newest output kept.
    #[arg(long, requires = "detach", default_value_t = berth::sandbox::DEFAULT_LOG_RING)]
    log_ring: u64,
    /// Run the words as the program and its arguments, with no shell (as
    /// `docker exec` does): nothing is expanded, and `echo` or `test` is
    /// the program on `PATH`, not a builtin. A program that cannot be
    /// started exits 127 (not found) or 126.
    #[arg(long, conflicts_with = "detach")]
    no_shell: bool,
    /// The command (joined with spaces and run by `sh -c`, unless
    /// --no-shell): after `--`, or from the first word that is not one of
    /// these options on (`berth exec box ls -la`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

impl ExecArgs {
    /// The command as its words, or as one line for `sh -c`.
    fn request(&self) -> ExecRequest {
        let timeout = Duration::from_secs_f64(self.timeout);
        if self.no_shell {
            ExecRequest::program(self.command.clone(), timeout)
        } else {
            ExecRequest::new(self.command.join(" "), timeout)
        }
    }
}

pub async fn exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    // A sandbox created with `--checkpoint each-exec`: a generation after
    // the command (not after a detached one, which has not ended).
    let checkpoint = (!args.detach
        && load(&home, &args.name).is_ok_and(|s| s.checkpoint_each_exec))
    .then(|| (args.name.clone(), args.request().command));
    if let Some(remote) = Remote::for_home(&home).await {
        // The server checkpoints on the sandbox it holds open, before it
        // sends the command's exit.
        return exec_through(&remote, args).await;
    }
    let (lock, mut sandbox) = attach_locked(&home, &args.name).await?;
    let command = args.command.join(" ");
    if args.detach {
        // The record of it is part of the state: written under the lock.
        let mut request = DetachRequest::new(command).log_ring(args.log_ring);
        if let Some(id) = &args.name_as {
            request = request.name(id.clone());
        }
        let started = sandbox.detach(request).await?;
        drop(lock);
        println!("{}", started.id);
        return Ok(ExitCode::SUCCESS);
    }
    // The sandbox is up: commands on it may run in parallel.
    drop(lock);
    let mut request = args.request();
    request.env.extend(env_pairs(&args.env)?);
    if args.interactive {
        request = request.with_stdin();
    }
    if args.json {
        let started = (std::time::SystemTime::now(), std::time::Instant::now());
        let result = sandbox.exec(request).await?;
        println!("{}", serde_json::to_string_pretty(&result)?);
        after_command(checkpoint, result.exit_code, started).await;
        return Ok(exit_code(result.exit_code));
    }
    let process = sandbox.exec_stream(request).await?;
    match run_streamed(process, args.interactive, checkpoint).await {
        Err(e) if removed_meanwhile(&home, &args.name).await => Err(e.context(format!(
            "sandbox {} was removed while the command ran (`berth rm`); the command ended with it",
            args.name
        ))),
        other => other,
    }
}

/// Whether sandbox `name` was removed: `berth rm` holds its lock until it
/// has forgotten it, so this waits (a while) for a removal under way.
async fn removed_meanwhile(home: &std::path::Path, name: &str) -> bool {
    let named = named(home);
    let locked = tokio::time::timeout(Duration::from_secs(30), named.lock(name)).await;
    matches!(locked, Ok(Ok(_))) && matches!(named.read_text(name), Ok(None))
}

/// The checkpoint after a command, when the sandbox takes one.
async fn after_command(
    checkpoint: Option<(String, String)>,
    exit_code: i32,
    started: (std::time::SystemTime, std::time::Instant),
) {
    if let Some((name, command)) = checkpoint {
        super::history::checkpoint_after(
            &name,
            &command,
            exit_code,
            started.0,
            started.1.elapsed(),
        )
        .await;
    }
}

/// Relays a streamed command here (this program's stdin to it when
/// `interactive`) and returns its exit code as berth's.
async fn run_streamed(
    process: ExecProcess,
    interactive: bool,
    checkpoint: Option<(String, String)>,
) -> anyhow::Result<ExitCode> {
    let started = (std::time::SystemTime::now(), std::time::Instant::now());
    if interactive {
        tokio::spawn(pump_stdin(process.input()));
    }
    let exit = relay(process).await?;
    after_command(checkpoint, exit.exit_code, started).await;
    if interactive {
        // The stdin reader may still be blocked in a read no runtime can
        // cancel: leave without waiting for it.
        std::process::exit(exit.exit_code.clamp(0, 255));
    }
    Ok(exit_code(exit.exit_code))
}

/// `--env KEY=VALUE` pairs.
fn env_pairs(env: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    env.iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--env {kv:?} is not KEY=VALUE"))
        })
        .collect()
}

/// `berth exec` through the server: the same output and exit code.
async fn exec_through(remote: &Remote, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let command = args.command.join(" ");
    let path = through_server::sandbox_path(&args.name);
    if args.detach {
        let started: BackgroundProcess = remote
            .json(
                Method::POST,
                &format!("{path}/processes"),
                Some(serde_json::json!({
                    "command": command,
                    "name": args.name_as,
                    "log_ring": args.log_ring,
                })),
            )
            .await?;
        println!("{}", started.id);
        return Ok(ExitCode::SUCCESS);
    }
    let request = args.request();
    let mut body = serde_json::json!({
        "timeout_ms": (args.timeout * 1000.0).round() as u64,
        "env": env_pairs(&args.env)?,
        "stream": !args.json,
        "interactive": args.interactive && !args.json,
    });
    match request.argv {
        Some(argv) => body["argv"] = argv.into(),
        None => body["command"] = request.command.into(),
    }
    if args.json {
        let result: berth_server::ExecOutcome = remote
            .json(Method::POST, &format!("{path}/exec"), Some(body))
            .await?;
        println!("{}", serde_json::to_string_pretty(&result)?);
        through_server::report_checkpoint(result.checkpoint.as_ref());
        return Ok(exit_code(result.exit_code));
    }
    let process =
        through_server::process(remote, Method::POST, &format!("{path}/exec"), Some(body)).await?;
    run_streamed(process, args.interactive, None).await
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// This program's stdin, chunk by chunk, then its end.
async fn pump_stdin(input: ExecInputSender) {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let chunk = bytes::Bytes::copy_from_slice(&buf[..n]);
                if input.send(ExecInput::Stdin(chunk)).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = input.send(ExecInput::CloseStdin).await;
}

/// Writes a command's output here as it comes (stdout to stdout, stderr
/// to stderr, uncapped: a pipe is the user's own) and returns its exit.
/// Ctrl-C stops the command in the sandbox.
async fn relay(mut process: ExecProcess) -> anyhow::Result<ExecExit> {
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    loop {
        let event = tokio::select! {
            e = process.next_event() => e,
            _ = tokio::signal::ctrl_c() => {
                drop(process);
                eprintln!("berth: interrupted; the command was stopped");
                return Ok(ExecExit::new(130, false, Duration::ZERO));
            }
        };
        match event {
            Some(Ok(ExecEvent::Stdout(b))) => {
                // A reader that went away (`| head`) ends the command.
                if stdout
                    .write_all(&b)
                    .await
                    .and(stdout.flush().await)
                    .is_err()
                {
                    return Ok(ExecExit::new(141, false, Duration::ZERO));
                }
            }
            Some(Ok(ExecEvent::Stderr(b))) => {
                let _ = stderr.write_all(&b).await;
                let _ = stderr.flush().await;
            }
            Some(Ok(ExecEvent::Exit(exit))) => {
                for note in &exit.notes {
                    eprintln!("berth: {note}");
                }
                return Ok(exit);
            }
            Some(Err(e)) => return Err(e.into()),
            None => anyhow::bail!("the command's output ended without its exit"),
        }
    }
}

/// `berth ps NAME`.
pub async fn ps(name: &str, json: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let list: Vec<BackgroundProcess> = match Remote::for_home(&home).await {
        Some(remote) => {
            remote
                .json(
                    Method::GET,
                    &format!("{}/processes", through_server::sandbox_path(name)),
                    None,
                )
                .await?
        }
        None => {
            let (lock, sandbox) = attach_locked(&home, name).await?;
            drop(lock);
            sandbox.processes().list().await?
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(ExitCode::SUCCESS);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut t = table::Table::new(&["ID", "STATE", "STARTED", "EXIT", "COMMAND"]);
    for p in list {
        t.row(vec![
            p.id,
            format!("{:?}", p.state).to_lowercase(),
            format!("{} ago", human_duration(now.saturating_sub(p.started_ms))),
            p.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            p.command,
        ]);
    }
    print!("{}", t.render());
    Ok(ExitCode::SUCCESS)
}

fn human_duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// `berth logs`.
#[derive(Args)]
pub struct LogsArgs {
    /// Sandbox name.
    name: String,
    /// The background process's id.
    id: String,
    /// Go on printing what it writes until it exits (Ctrl-C to stop).
    #[arg(short, long)]
    follow: bool,
    /// Start at the last N lines of each stream (of what the ring keeps).
    #[arg(long)]
    tail: Option<u64>,
}

pub async fn logs(args: LogsArgs) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let process = match Remote::for_home(&home).await {
        Some(remote) => {
            let mut path = format!(
                "{}/processes/{}/logs?follow={}",
                through_server::sandbox_path(&args.name),
                encode(&args.id),
                args.follow
            );
            if let Some(n) = args.tail {
                path.push_str(&format!("&tail={n}"));
            }
            through_server::process(&remote, Method::GET, &path, None).await?
        }
        None => {
            let (lock, sandbox) = attach_locked(&home, &args.name).await?;
            drop(lock);
            sandbox
                .processes()
                .logs(&args.id, args.follow, args.tail)
                .await?
        }
    };
    let exit = relay(process).await?;
    Ok(exit_code(exit.exit_code))
}

/// A signal's number from its name (`TERM`, `SIGKILL`) or number.
fn signal_number(name: &str) -> anyhow::Result<i32> {
    Ok(berth::backend::signal_number(name)?)
}

/// `berth kill NAME ID [--signal S]`.
pub async fn kill(name: &str, id: &str, signal: &str) -> anyhow::Result<ExitCode> {
    let signal = signal_number(signal)?;
    let home = berth_home()?;
    if let Some(remote) = Remote::for_home(&home).await {
        remote
            .json::<serde_json::Value>(
                Method::POST,
                &format!(
                    "{}/processes/{}/kill",
                    through_server::sandbox_path(name),
                    encode(id)
                ),
                Some(serde_json::json!({ "signal": signal.to_string() })),
            )
            .await?;
        return Ok(ExitCode::SUCCESS);
    }
    let (lock, sandbox) = attach_locked(&home, name).await?;
    drop(lock);
    sandbox.processes().kill(id, signal).await?;
    Ok(ExitCode::SUCCESS)
}

/// `berth wait NAME ID`: prints and returns its exit code.
pub async fn wait(name: &str, id: &str) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let code = match Remote::for_home(&home).await {
        Some(remote) => {
            let waited: berth_server::Waited = remote
                .json(
                    Method::POST,
                    &format!(
                        "{}/processes/{}/wait",
                        through_server::sandbox_path(name),
                        encode(id)
                    ),
                    None,
                )
                .await?;
            waited.exit_code
        }
        None => {
            let (lock, sandbox) = attach_locked(&home, name).await?;
            drop(lock);
            sandbox.processes().wait(id).await?
        }
    };
    println!("{code}");
    Ok(exit_code(code))
}

/// `berth port NAME [PORT]`: where each published port is reached, as
/// `docker port` prints it.
pub async fn port(name: &str, port: Option<&str>) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let ports: Vec<(String, String)> = match Remote::for_home(&home).await {
        Some(remote) => {
            let ports: Vec<berth_server::Port> = remote
                .json(
                    Method::GET,
                    &format!("{}/ports", through_server::sandbox_path(name)),
                    None,
                )
                .await?;
            ports.into_iter().map(|p| (p.port, p.address)).collect()
        }
        None => {
            let (lock, sandbox) = attach_locked(&home, name).await?;
            drop(lock);
            let ports = sandbox.published_ports().await?;
            ports.into_iter().map(|p| (p.port, p.address)).collect()
        }
    };
    let wanted = |p: &str| match port {
        None => true,
        Some(w) => p == w || p.split('/').next() == Some(w),
    };
    let shown: Vec<_> = ports.iter().filter(|(p, _)| wanted(p)).collect();
    if shown.is_empty() {
        anyhow::bail!(
            "{name} publishes {}",
            match port {
                Some(p) => format!("no port {p}"),
                None => "no ports (create it with --expose PORT and a --network)".into(),
            }
        );
    }
    for (p, address) in shown {
        if port.is_some() {
            println!("{address}");
        } else {
            println!("{p} -> {address}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth shell NAME [-- COMMAND]`.
pub async fn shell(name: &str, command: &[String]) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
        anyhow::bail!(
            "`berth shell` needs a terminal on stdin and stdout, and this has none; from a script or an agent, use `berth exec {name} -- COMMAND` (with -i to stream stdin to it)"
        );
    }
    let home = berth_home()?;
    let command = (!command.is_empty()).then(|| command.join(" "));
    let size = terminal::size().unwrap_or_default();
    let process = match Remote::for_home(&home).await {
        Some(remote) => {
            let body = serde_json::json!({
                // What Sandbox::shell runs when given no command.
                "command": command.clone().unwrap_or_else(|| berth::sandbox::LOGIN_SHELL.to_string()),
                "timeout_ms": berth::sandbox::SHELL_TIMEOUT.as_millis() as u64,
                "stream": true,
                "interactive": true,
                "pty": {"rows": size.rows, "cols": size.cols},
            });
            through_server::process(
                &remote,
                Method::POST,
                &format!("{}/exec", through_server::sandbox_path(name)),
                Some(body),
            )
            .await?
        }
        None => {
            let (lock, sandbox) = attach_locked(&home, name).await?;
            drop(lock);
            sandbox.shell(command.as_deref(), size).await?
        }
    };
    // Raw from here on (keys go to the sandbox's terminal as typed, Ctrl-C
    // included), restored however this ends.
    let raw = terminal::RawMode::enter();
    let input = process.input();
    tokio::spawn(pump_stdin(input.clone()));
    let resize = tokio::spawn(async move {
        let Ok(mut changes) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        else {
            return;
        };
        while changes.recv().await.is_some() {
            if let Some(size) = terminal::size() {
                if input.send(ExecInput::Resize(size)).await.is_err() {
                    return;
                }
            }
        }
    });
    let exit = relay_terminal(process).await;
    resize.abort();
    drop(raw);
    let exit = exit?;
    // The stdin reader is blocked in a read no runtime can cancel: leave
    // without waiting for it.
    std::process::exit(exit.exit_code.clamp(0, 255))
}

/// A terminal's output, as is, until its exit (signals are the sandbox's
/// terminal's business: raw mode sends Ctrl-C there as a byte).
async fn relay_terminal(mut process: ExecProcess) -> anyhow::Result<ExecExit> {
    let mut stdout = tokio::io::stdout();
    while let Some(event) = process.next_event().await {
        match event? {
            ExecEvent::Stdout(b) | ExecEvent::Stderr(b) => {
                let _ = stdout.write_all(&b).await;
                let _ = stdout.flush().await;
            }
            ExecEvent::Exit(exit) => return Ok(exit),
        }
    }
    anyhow::bail!("the shell's output ended without its exit")
}

/// This program's terminal: its size and raw mode.
mod terminal {
    use berth::backend::PtySize;

    /// The size of the terminal on stdout (or stdin), if there is one.
    pub fn size() -> Option<PtySize> {
        for fd in [1, 0] {
            // SAFETY: a zeroed winsize is valid for TIOCGWINSZ to fill.
            let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
            // SAFETY: TIOCGWINSZ writes one winsize we own.
            if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_row > 0 {
                return Some(PtySize {
                    rows: ws.ws_row,
                    cols: ws.ws_col,
                });
            }
        }
        None
    }

    /// Raw mode on stdin while it lives (when stdin is a terminal).
    pub struct RawMode(Option<libc::termios>);

    impl RawMode {
        pub fn enter() -> Self {
            // SAFETY: isatty reads nothing of ours.
            if unsafe { libc::isatty(0) } != 1 {
                return RawMode(None);
            }
            // SAFETY: a zeroed termios is valid for tcgetattr to fill.
            let mut saved: libc::termios = unsafe { std::mem::zeroed() };
            // SAFETY: tcgetattr fills the termios we own.
            if unsafe { libc::tcgetattr(0, &mut saved) } != 0 {
                return RawMode(None);
            }
            let mut raw = saved;
            // SAFETY: cfmakeraw edits the termios we own; tcsetattr reads it.
            unsafe {
                libc::cfmakeraw(&mut raw);
                libc::tcsetattr(0, libc::TCSANOW, &raw);
            }
            RawMode(Some(saved))
        }
    }

    impl Drop for RawMode {
        fn drop(&mut self) {
            if let Some(saved) = &self.0 {
                // SAFETY: tcsetattr reads the termios we saved.
                unsafe { libc::tcsetattr(0, libc::TCSANOW, saved) };
            }
        }
    }
}
