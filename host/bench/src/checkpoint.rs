//! What `--checkpoint each-exec` adds to a command on the bench workspace:
//! through the server (the checkpoint written on the sandbox it holds open,
//! before the command's result) against the same command without one, and
//! against the in-process CLI's way (a fresh process resumes, attaches and
//! checkpoints).

use std::path::Path;
use std::time::Instant;

use super::server::{berth, ok};
use super::*;

/// A command that rewrites 50 small files of the bench workspace (1 MiB in
/// all) with new content.
fn change_1mib(step: u64) -> String {
    format!(
        "i=0; while [ $i -lt 50 ]; do head -c 20971 /dev/urandom > src/d$(printf %03d $i)/f$i.txt; \
         i=$((i+1)); done; echo {step} > .step"
    )
}

/// One collected exec through the server's API; its wall time in seconds.
fn exec_secs(home: &Path, command: &str, checkpoint: bool) -> anyhow::Result<f64> {
    let body = serde_json::json!({"command": command, "checkpoint": checkpoint}).to_string();
    let socket = home.join("berth.sock");
    let t = Instant::now();
    let out = ok(Command::new("curl").args([
        "-sf",
        "--unix-socket",
        &socket.to_string_lossy(),
        "-d",
        &body,
        "http://berth/v1/sandboxes/cp/exec",
    ]))?;
    let secs = t.elapsed().as_secs_f64();
    let reply: serde_json::Value = serde_json::from_str(&out)?;
    anyhow::ensure!(reply["exit_code"] == 0, "the bench command failed: {reply}");
    anyhow::ensure!(
        reply["checkpoint"]["error"].is_null(),
        "the checkpoint failed: {reply}"
    );
    Ok(secs)
}

/// Where the checkpointing sandbox runs.
pub(super) enum Placement {
    /// The local backend, its root the bench workspace itself.
    Local,
    /// A Docker container of this image, the bench workspace copied in.
    Docker(String),
}

/// Rows for `label`'s store (`manifest`): the checkpoint's added time
/// through the server, and the in-process CLI's checkpoint.
pub(super) async fn checkpoint_rows(
    base: &Path,
    src: &Path,
    label: &str,
    manifest: &Path,
    runs: usize,
    placement: &Placement,
) -> anyhow::Result<Vec<Row>> {
    let home = base.join(format!("checkpoint-home-{}", label.replace(' ', "-")));
    std::fs::create_dir_all(&home)?;
    let snapshot = format!("remote:{}", manifest.display());
    let mut create = berth(&home)?;
    create.args([
        "create",
        "cp",
        "--snapshot",
        &snapshot,
        "--dedup",
        "--checkpoint",
        "each-exec",
    ]);
    match placement {
        Placement::Local => create.args([
            "-o",
            &format!("root_dir={}", src.display()),
            "-o",
            "disk=unlimited",
        ]),
        Placement::Docker(image) => create.args(["--backend", "docker", "--image", image]),
    };
    ok(&mut create)?;
    ok(berth(&home)?.args(["server", "start"]))?;
    if let Placement::Docker(_) = placement {
        // The bench workspace, copied in through the server.
        for entry in std::fs::read_dir(src)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            ok(berth(&home)?.args([
                "cp",
                &src.join(&name).to_string_lossy(),
                &format!("cp:/workspace/{name}"),
            ]))?;
        }
    }
    // The first checkpoint stores everything; the ones measured store what
    // the command changed.
    exec_secs(&home, "true", true)?;
    let (mut with, mut without, mut cli) = (vec![], vec![], vec![]);
    let mut step = 0;
    for _ in 0..runs.max(3) {
        for checkpoint in [false, true] {
            step += 1;
            // An agent reads a reply before its next command (a model's
            // turn takes seconds; a tenth of one here), in which the
            // server tidies after the last checkpoint.
            std::thread::sleep(std::time::Duration::from_millis(100));
            dedup::settle();
            let secs = exec_secs(&home, &change_1mib(step), checkpoint)?;
            if checkpoint {
                with.push(secs);
            } else {
                without.push(secs);
            }
        }
        // The in-process way, as `berth exec` took it before the server
        // did: a fresh process resumes, attaches and checkpoints.
        step += 1;
        exec_secs(&home, &change_1mib(step), false)?;
        dedup::settle();
        let t = Instant::now();
        ok(berth(&home)?
            .env("BERTH_NO_SERVER", "1")
            .args(["checkpoint", "cp"]))?;
        cli.push(t.elapsed().as_secs_f64());
        // The CLI changed the state file behind the server, which opens
        // the sandbox afresh on its next command (on Docker, a new agent
        // session: ~0.1 s): paid here, untimed, not by the next timed
        // command.
        exec_secs(&home, "true", false)?;
    }
    if let Placement::Docker(_) = placement {
        let _ = ok(berth(&home)?.args(["rm", "cp"]));
    }
    let _ = ok(berth(&home)?.args(["server", "stop"]));
    let (with, without, cli) = (median(with), median(without), median(cli));
    let added = (with - without).max(0.0);
    Ok(vec![
        Row {
            group: "checkpoint",
            name: format!(
                "{label}: checkpoint added to a command that changed 1 MiB, through the server (exec with vs without)"
            ),
            value: format!("{:.0} ms ({:.0} vs {:.0} ms)", added * 1e3, with * 1e3, without * 1e3),
            baseline: format!("in-process CLI checkpoint {:.0} ms", cli * 1e3),
            ratio: Some(added / cli),
        },
    ])
}
