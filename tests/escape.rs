//! The escape suite: commands an agent could run to get out of its
//! sandbox, run on every tier, each result checked against the table in
//! `docs/SECURITY.md` ("Escape probes"), which this test reads.
//!
//! A probe prints `ESCAPED` when it got through, or leaves a trace the test
//! looks for on the host. Probes that would change the host (the clock,
//! mounts, kernel modules) run only on tiers the table says stop them; if
//! one gets through there, the test fails and the probe undoes what it did.
//! Network probes talk only to a server this test starts on loopback.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use berth::backend::local::{Isolation, LocalOptions};
use berth::backend::ExecRequest;
use berth::sandbox::{BackendSpec, Sandbox, SandboxSpec, SnapshotSpec};
use berth::workspace::WorkspaceSpec;

/// What the host holds that no sandbox should reach.
struct Host {
    /// A file in the test user's home (`/root` here) with `secret` in it.
    secret_file: PathBuf,
    secret: String,
    /// A host directory outside every workspace.
    outside: tempfile::TempDir,
    /// A TCP server on the host's 127.0.0.1 answering `secret`.
    port: u16,
    /// A host process (`sleep`) the probes try to see and signal.
    marker: std::process::Child,
    /// A Unix socket like Berth's server socket, in the client's home.
    berth_socket: PathBuf,
    /// The host kernel's `/proc/version`.
    kernel: String,
}

impl Host {
    fn new(home: &Path) -> (Host, std::os::unix::net::UnixListener) {
        let secret = format!("berth-escape-{:016x}", rand::random::<u64>());
        let user_home = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
        let secret_file = user_home.join(format!(".{secret}"));
        std::fs::write(&secret_file, &secret).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let answer = secret.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let _ = write!(
                    stream,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
                    answer.len()
                );
            }
        });
        let marker = std::process::Command::new("sleep")
            .arg("987654")
            .spawn()
            .unwrap();
        std::fs::create_dir_all(home).unwrap();
        let berth_socket = home.join("berth.sock");
        let socket = std::os::unix::net::UnixListener::bind(&berth_socket).unwrap();
        (
            Host {
                secret_file,
                secret,
                outside: tempfile::tempdir().unwrap(),
                port,
                marker,
                berth_socket,
                kernel: std::fs::read_to_string("/proc/version")
                    .unwrap()
                    .trim()
                    .to_string(),
            },
            socket,
        )
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.secret_file);
        let _ = self.marker.kill();
        let _ = self.marker.wait();
    }
}

/// One probe.
struct Probe {
    name: &'static str,
    /// Whether getting through would change the host.
    harmful: bool,
    /// The command.
    script: fn(&Host) -> String,
    /// A trace on the host that it got through.
    trace: Option<fn(&mut Host) -> bool>,
    /// A host fact without which the probe means nothing (it is skipped).
    needs: Option<fn() -> bool>,
}

fn docker_socket_on_host() -> bool {
    use std::os::unix::fs::FileTypeExt;
    ["/run/docker.sock", "/var/run/docker.sock"]
        .iter()
        .any(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket()))
}

/// `ESCAPED` when `condition` (a shell test) holds.
fn when(condition: &str) -> String {
    format!("if {condition}; then echo ESCAPED; fi")
}

const PROBES: &[Probe] = &[
    Probe {
        // A kernel in user space (gVisor) answers with its own version:
        // the host kernel's system call surface is out of reach.
        name: "host-kernel",
        harmful: false,
        script: |h| {
            when(&format!(
                "[ \"$(cat /proc/version)\" = '{}' ]",
                h.kernel.replace('\'', "")
            ))
        },
        trace: None,
        needs: Some(|| {
            !std::fs::read_to_string("/proc/version")
                .unwrap_or_default()
                .contains('\'')
        }),
    },
    Probe {
        name: "read-host-file",
        harmful: false,
        script: |h| {
            when(&format!(
                "grep -qs {} {}",
                h.secret,
                h.secret_file.display()
            ))
        },
        trace: None,
        needs: None,
    },
    Probe {
        name: "write-outside",
        harmful: false,
        script: |h| {
            format!(
                "echo x > {}/written 2>/dev/null; true",
                h.outside.path().display()
            )
        },
        trace: Some(|h| h.outside.path().join("written").exists()),
        needs: None,
    },
    Probe {
        name: "host-loopback",
        harmful: false,
        script: |h| {
            let url = format!("http://127.0.0.1:{}/", h.port);
            format!(
                "got=$( (wget -q -T 3 -O - {url} || curl -s -m 3 {url} || \
                 python3 -c 'import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())' {url}) 2>/dev/null ); \
                 {}",
                when(&format!("[ \"$got\" = {} ]", h.secret))
            )
        },
        trace: None,
        needs: None,
    },
    Probe {
        name: "docker-socket",
        harmful: false,
        script: |_| when("[ -S /run/docker.sock ] || [ -S /var/run/docker.sock ]"),
        trace: None,
        needs: Some(docker_socket_on_host),
    },
    Probe {
        name: "berth-socket",
        harmful: false,
        script: |h| when(&format!("[ -S {} ]", h.berth_socket.display())),
        trace: None,
        needs: None,
    },
    Probe {
        name: "see-host-process",
        harmful: false,
        script: |h| when(&format!("grep -qs 987654 /proc/{}/cmdline", h.marker.id())),
        trace: None,
        needs: None,
    },
    Probe {
        name: "signal-host-process",
        harmful: false,
        script: |h| format!("kill -TERM {} 2>/dev/null; true", h.marker.id()),
        // The signal is delivered after the command returns: wait a
        // little for the process to be gone.
        trace: Some(|h| {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                if h.marker.try_wait().ok().flatten().is_some() {
                    return true;
                }
                if std::time::Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }),
        needs: None,
    },
    Probe {
        name: "read-kcore",
        harmful: false,
        script: |_| when("[ \"$(head -c 4 /proc/kcore 2>/dev/null | wc -c)\" -eq 4 ]"),
        trace: None,
        needs: Some(|| Path::new("/proc/kcore").exists()),
    },
    Probe {
        // `h` prints the sysrq help to the kernel log: harmless if it
        // gets through.
        name: "write-sysrq",
        harmful: false,
        script: |_| when("echo h 2>/dev/null > /proc/sysrq-trigger"),
        trace: None,
        needs: Some(|| Path::new("/proc/sysrq-trigger").exists()),
    },
    Probe {
        // Dropping the page cache changes nothing that lasts.
        name: "write-proc-sys",
        harmful: false,
        script: |_| when("echo 1 2>/dev/null > /proc/sys/vm/drop_caches"),
        trace: None,
        needs: None,
    },
    Probe {
        name: "gain-privileges",
        harmful: false,
        script: |_| {
            when(
                "grep -q '^NoNewPrivs:[[:space:]]*0' /proc/self/status || \
                 ! grep -q '^CapEff:[[:space:]]*0000000000000000' /proc/self/status",
            )
        },
        trace: None,
        needs: None,
    },
    Probe {
        name: "user-namespace",
        harmful: false,
        script: |_| when("unshare -U true 2>/dev/null || unshare -r true 2>/dev/null"),
        trace: None,
        needs: None,
    },
    Probe {
        name: "mount",
        harmful: true,
        script: |_| {
            "mkdir -p /tmp/berth-probe-mnt 2>/dev/null; \
             if mount -t tmpfs none /tmp/berth-probe-mnt 2>/dev/null; then \
             umount /tmp/berth-probe-mnt; echo ESCAPED; fi"
                .into()
        },
        trace: None,
        needs: None,
    },
    Probe {
        name: "set-clock",
        harmful: true,
        script: |_| {
            // busybox's `date -s` exits 0 even when refused: the clock
            // itself is the evidence.
            "now=$(date +%s); date -s @1000000000 >/dev/null 2>&1; \
             if [ \"$(date +%Y)\" = 2001 ]; then date -s @$now >/dev/null 2>&1; echo ESCAPED; fi"
                .into()
        },
        trace: None,
        needs: None,
    },
    Probe {
        name: "load-module",
        harmful: true,
        script: |_| {
            "modprobe -q dummy 2>/dev/null; if grep -qs '^dummy ' /proc/modules; then \
             modprobe -qr dummy; echo ESCAPED; fi"
                .into()
        },
        trace: None,
        // A kernel with modules, and the probe's module not loaded yet.
        needs: Some(|| {
            std::fs::read_to_string("/proc/modules")
                .is_ok_and(|m| !m.lines().any(|l| l.starts_with("dummy ")))
        }),
    },
    Probe {
        // 2000 processes at once, each a `sleep`: a fork bomb that stops
        // by itself. A shell exits when a fork fails, so the bomb runs in
        // a subshell that logs each child's pid; this shell then counts
        // and kills them with builtins, which need no fork.
        name: "fork-bomb",
        harmful: false,
        script: |_| {
            "rm -f .bomb; ( i=0; while [ $i -lt 2000 ]; do sleep 97531 2>/dev/null & \
             printf '%s ' $! >> .bomb; i=$((i+1)); done ) 2>/dev/null; \
             read -r pids < .bomb; set -- $pids; n=$#; kill $pids 2>/dev/null; \
             for p in $pids; do j=0; while kill -0 $p 2>/dev/null && [ $j -lt 100000 ]; do j=$((j+1)); done; done; \
             rm -f .bomb; if [ $n -gt 1500 ]; then echo ESCAPED; fi"
                .into()
        },
        trace: None,
        needs: None,
    },
    Probe {
        // 3 GiB at once, past the 2 GiB default bound: two 1.5 GiB
        // buffers, the writer's held full while the reader's fills.
        name: "memory-bomb",
        harmful: false,
        script: |_| {
            when(
                "dd if=/dev/zero bs=1500M count=1 2>/dev/null | \
                 dd of=/dev/null bs=1500M count=1 iflag=fullblock 2>&1 | grep -q '^1+0 records in'",
            )
        },
        trace: None,
        needs: None,
    },
    Probe {
        // 300 MiB into a workspace whose quota is 256 MiB (the test's
        // config.toml): stopped by ENOSPC, and the space given back.
        name: "fill-disk",
        harmful: false,
        script: |_| {
            "dd if=/dev/zero of=.fill bs=1M count=300 2>/dev/null; s=$(wc -c < .fill); rm -f .fill; \
             if [ \"$s\" -ge 314572800 ]; then echo ESCAPED; fi"
                .into()
        },
        trace: None,
        needs: None,
    },
];

/// What a probe should come to on a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Stopped; the sandbox goes on.
    Contained,
    /// Gets through.
    Escapes,
    /// Stopped by ending the whole sandbox (gVisor's kernel is one host
    /// process the bound applies to); the next start brings it back.
    EndsSandbox,
}

/// The expected result of every probe on every tier, from
/// `docs/SECURITY.md`: tier name → probe → outcome.
fn table() -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, Outcome>> {
    let doc = std::fs::read_to_string(berth_tests::repo_root().join("docs/SECURITY.md")).unwrap();
    let start = doc
        .find("<!-- escape-table -->")
        .expect("docs/SECURITY.md has the escape table");
    let mut rows = doc[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect::<Vec<_>>()
        });
    let header = rows.next().unwrap();
    let mut out = std::collections::BTreeMap::new();
    for row in rows.filter(|r| !r[0].starts_with('-')) {
        for (tier, cell) in header.iter().zip(&row).skip(2) {
            let contained = match cell.as_str() {
                "contained" => Outcome::Contained,
                "escapes" => Outcome::Escapes,
                "ends the sandbox" => Outcome::EndsSandbox,
                other => panic!("escape table: {other:?} for {} on {tier}", row[0]),
            };
            out.entry(tier.clone())
                .or_insert_with(std::collections::BTreeMap::new)
                .insert(row[0].clone(), contained);
        }
    }
    out
}

/// Runs every probe in `sandbox` and checks each against the table's
/// column `tier`.
async fn probe_tier(tier: &str, sandbox: &mut Sandbox, host: &mut Host) {
    let table = table();
    let expected = table
        .get(tier)
        .unwrap_or_else(|| panic!("the escape table has no column {tier:?}"));
    let names: Vec<&str> = PROBES.iter().map(|p| p.name).collect();
    assert_eq!(
        expected.keys().map(String::as_str).collect::<Vec<_>>(),
        {
            let mut n = names.clone();
            n.sort();
            n
        },
        "the escape table's rows are the probes"
    );
    let mut wrong = Vec::new();
    for probe in PROBES {
        let outcome = expected[probe.name];
        let contained = outcome != Outcome::Escapes;
        if (probe.harmful && !contained) || probe.needs.is_some_and(|holds| !holds()) {
            continue;
        }
        let script = (probe.script)(host);
        let r = sandbox
            .exec(ExecRequest::new(script.clone(), Duration::from_secs(60)))
            .await;
        if outcome == Outcome::EndsSandbox {
            // Stopped either way, as long as it printed no escape and the
            // sandbox comes back.
            if r.as_ref()
                .is_ok_and(|r| r.stdout_text().contains("ESCAPED"))
            {
                wrong.push(format!(
                    "{}: expected the sandbox to end, it got through",
                    probe.name
                ));
            }
            // The engine may not have seen the sandbox end yet: a start
            // finds it running and the command fails; the next start
            // brings it back.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let back = match sandbox.start().await {
                    Ok(_) => sandbox
                        .exec(ExecRequest::new("echo back", Duration::from_secs(60)))
                        .await
                        .map(|r| r.stdout_text().trim() == "back")
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match back {
                    Ok(true) => break,
                    other if std::time::Instant::now() > deadline => {
                        panic!(
                            "{tier}: after {}, the sandbox did not come back: {other:?}",
                            probe.name
                        )
                    }
                    _ => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
            continue;
        }
        let r = r.unwrap_or_else(|e| panic!("{tier}: probe {}: {e}", probe.name));
        let escaped =
            r.stdout_text().contains("ESCAPED") || probe.trace.is_some_and(|trace| trace(host));
        if escaped == contained {
            wrong.push(format!(
                "{}: expected {}, {} (stdout {:?}, stderr {:?})",
                probe.name,
                if contained { "contained" } else { "escapes" },
                if escaped {
                    "it got through"
                } else {
                    "it was stopped"
                },
                r.stdout_text(),
                r.stderr_text()
            ));
        }
        if probe.name == "signal-host-process" && escaped {
            host.marker = std::process::Command::new("sleep")
                .arg("987654")
                .spawn()
                .unwrap();
        }
    }
    assert!(wrong.is_empty(), "{tier}:\n{}", wrong.join("\n"));
}

async fn started(client: &berth::SandboxClient, backend: BackendSpec) -> Sandbox {
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(backend),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    sb
}

/// Every probe in a fresh sandbox of `backend`, against the table's
/// column `tier`.
async fn probe_backend(tier: &str, backend: BackendSpec) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (mut host, _socket) = Host::new(&home);
    // The host-wide defaults file, as an operator writes it: a quota the
    // fill-disk probe can pass quickly.
    std::fs::write(home.join("config.toml"), "[sandbox]\ndisk = \"256MiB\"\n").unwrap();
    let client = berth_tests::client(&home);
    let mut sb = started(&client, backend).await;
    probe_tier(tier, &mut sb, &mut host).await;
    sb.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn local_confined() {
    probe_backend("local confined", BackendSpec::local()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_unconfined() {
    probe_backend(
        "local none",
        BackendSpec::new(LocalOptions::default().isolation(Isolation::None)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_runc() {
    let Some(_docker) = berth_tests::docker_or_skip("escape::docker_runc").await else {
        return;
    };
    let _shared = berth_tests::DOCKERD.read().await;
    probe_backend(
        "docker",
        BackendSpec::new(berth_docker::DockerOptions::new(berth_tests::test_image())),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_gvisor() {
    let Some(_docker) = berth_tests::docker_or_skip("escape::docker_gvisor").await else {
        return;
    };
    let _shared = berth_tests::DOCKERD.read().await;
    probe_backend(
        "docker runsc",
        BackendSpec::new(
            berth_docker::DockerOptions::new(berth_tests::test_image())
                .runtime(berth_docker::runtime::GVISOR),
        ),
    )
    .await;
}

/// A link the agent plants in the workspace to a host file leaks nothing:
/// not through the files API, not through a command, not after a stop
/// and a restore (the link is restored as a link, never as the file).
#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_link_to_a_host_file_leaks_nothing_through_files_or_a_restore() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (host, _socket) = Host::new(&home);
    let client = berth_tests::client(&home);
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::local(dir.path().join("snapshots")))
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    let secret = host.secret_file.display().to_string();
    let planted = berth_tests::sh(
        &sb,
        &format!("ln -s {secret} link; ln {secret} hard 2>/dev/null; ls"),
    )
    .await;
    assert_eq!(planted, "link\n", "a hard link to a host file was made");
    let leaks = |what: &str, got: &[u8]| {
        assert!(
            !String::from_utf8_lossy(got).contains(&host.secret),
            "{what} read the host file"
        );
    };
    for round in ["before a stop", "after a restore"] {
        if let Ok(bytes) = sb.files().read_to_bytes("link").await {
            leaks(&format!("the files API {round}"), &bytes);
        }
        let shown = sb
            .exec(ExecRequest::new("cat link", Duration::from_secs(30)))
            .await
            .unwrap();
        leaks(&format!("a command {round}"), &shown.stdout);
        sb.stop().await.unwrap();
        sb.shutdown().await.unwrap();
        sb.start().await.unwrap();
    }
    let kept = sb.files().stat("link").await.unwrap();
    assert_eq!(
        kept.target.as_deref(),
        Some(secret.as_str()),
        "the link came back as {kept:?}"
    );
    sb.close().await.unwrap();
}

/// `berth ARGS` (in-process, no server) in a throw-away user namespace
/// whose `user.max_user_namespaces` is 0: a host where user namespaces
/// are forbidden, as a hardened kernel or an unprivileged container has
/// them.
fn berth_without_user_namespaces(home: &Path, args: &[&str]) -> std::process::Output {
    let mut script = String::from("echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\"");
    for i in 1..=args.len() {
        script.push_str(&format!(" \"${i}\""));
    }
    std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "--fork", "sh", "-c"])
        .arg(&script)
        .arg(berth_tests::berth_bin())
        .args(args)
        .env("BERTH_HOME", home)
        .env("BERTH_NO_SERVER", "1")
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// Where commands cannot be confined, a confined sandbox is neither made
/// nor started: one error naming the cause and both ways out, nothing
/// left behind, nothing run. `--isolation none` still works there, and
/// says so.
#[test]
fn a_host_that_cannot_confine_refuses_clearly_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let ws = dir.path().join("ws");
    let ws_arg = ws.to_str().unwrap();
    let out = berth_without_user_namespaces(&home, &["create", "box", "--root-dir", ws_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("cannot confine").count(), 1, "{stderr}");
    for needed in ["bubblewrap", "max_user_namespaces", "--isolation none"] {
        assert!(stderr.contains(needed), "{needed:?} missing from: {stderr}");
    }
    assert!(!ws.exists(), "a workspace was made");
    let listed = berth_tests::berth_ok(&home, &["ls", "--json"]);
    assert_eq!(listed.trim(), "[]", "a sandbox was recorded");

    // A sandbox made where confinement works runs nothing where it does
    // not.
    berth_tests::berth_ok(&home, &["create", "box", "--root-dir", ws_arg]);
    let refused = berth_without_user_namespaces(&home, &["exec", "box", "--", "touch ran"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot confine"));
    assert!(!ws.join("ran").exists(), "the command ran unconfined");

    // The explicit opt-outs work there, and are printed. Root in a user
    // namespace of its own cannot mount the workspace's disk image either:
    // that refusal names its own way out.
    let bounded = berth_without_user_namespaces(
        &home,
        &[
            "create",
            "open",
            "--isolation",
            "none",
            "--snapshot",
            "noop",
        ],
    );
    let said = String::from_utf8_lossy(&bounded.stderr);
    assert!(!bounded.status.success(), "{said}");
    assert!(
        said.contains("cannot bound") && said.contains("disk=unlimited"),
        "{said}"
    );
    let open = berth_without_user_namespaces(
        &home,
        &[
            "create",
            "open",
            "--isolation",
            "none",
            "--disk",
            "unlimited",
            "--snapshot",
            "noop",
        ],
    );
    let said = String::from_utf8_lossy(&open.stderr);
    assert!(open.status.success(), "{said}");
    assert!(said.contains("unconfined"), "no warning printed: {said}");
    let ran = berth_without_user_namespaces(&home, &["exec", "open", "--", "echo ran"]);
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "ran\n");
    let table = berth_tests::berth_ok(&home, &["ls"]);
    assert!(
        table.contains("confined") && table.contains("none"),
        "{table}"
    );
}

/// A runtime the engine does not have is refused before anything is
/// made: the error names the runtime, what the engine has and how to
/// register it, and no container is left.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_the_engine_lacks_is_refused_and_leaves_nothing() {
    let Some(docker) = berth_tests::docker_or_skip("escape::a_runtime_the_engine_lacks").await
    else {
        return;
    };
    let _shared = berth_tests::DOCKERD.read().await;
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::new(
                    berth_docker::DockerOptions::new(berth_tests::test_image())
                        .runtime("no-such-runtime"),
                )),
        )
        .await
        .unwrap();
    let session = sb.state().session_id;
    let e = sb.start().await.unwrap_err();
    let text = format!("{e}");
    assert!(
        matches!(
            e,
            berth::sandbox::SandboxError::Backend(berth::backend::BackendError::Unconfined { .. })
        ),
        "{e:?}"
    );
    for word in ["no-such-runtime", "runc", "daemon.json"] {
        assert!(text.contains(word), "{word} not in {text}");
    }
    let left = docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&std::collections::HashMap::from([(
                    "label".to_string(),
                    vec![format!("berth.session={session}")],
                )]))
                .build(),
        ))
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}
