//! Secrets by placeholder, tried as a user would: `berth create --secret
//! NAME=@FILE --secret-hosts NAME=HOST` in fresh processes, real tools
//! (curl, Python's urllib, openssl) in a confined local sandbox, and an
//! HTTPS server this test starts on loopback. The promise: the server the
//! secret is bound to sees its value; any other sees the placeholder; the
//! value is nowhere the sandbox can look (its files, its environment,
//! `/proc`), nor in the sandbox's state, snapshots or logs.

use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::egress_support::{berth, ca_and_certificate, ok, server};

/// Every file under `dir` whose bytes hold `needle`: GNU grep, which
/// skips the holes of a sparse file (a workspace's disk image is one).
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let out = Command::new("grep")
        .args(["-rlsF", "--"])
        .arg(std::ffi::OsStr::from_bytes(needle))
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "grep failed: {out:?}"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_secret_reaches_its_host_and_nothing_else_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let home = home.as_path();
    let store = dir.path().join("store");
    let manifest = berth_tests::fs_store_manifest(dir.path(), &store);
    let snapshot = format!("remote:{}", manifest.display());
    let scratch = tempfile::tempdir().unwrap();
    let (cert, server_cert, key) = ca_and_certificate(scratch.path());
    let https = server(Some((&server_cert, &key)));
    let port = https.port.to_string();
    let value = format!("sk-test-{:016x}", rand::random::<u64>());
    let source = scratch.path().join("key.txt");
    std::fs::write(&source, format!("{value}\n")).unwrap();

    // Refused before anything is made: a secret bound to a host the
    // policy does not allow, and a value given on the command line.
    let refused = berth(
        home,
        &cert,
        &[
            "create",
            "r",
            "--allow-host",
            "other.pkg.test",
            "--secret",
            &format!("API_KEY=@{}", source.display()),
            "--secret-hosts",
            "API_KEY=api.pkg.test",
        ],
    );
    let text = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success());
    assert!(text.contains("--allow-host api.pkg.test"), "{text}");
    let literal = berth(
        home,
        &cert,
        &[
            "create",
            "r",
            "--allow-host",
            "api.pkg.test",
            "--secret",
            "API_KEY=sk-x",
            "--secret-hosts",
            "API_KEY=api.pkg.test",
        ],
    );
    assert!(!literal.status.success());
    assert!(String::from_utf8_lossy(&literal.stderr).contains("=@FILE"));
    assert!(!berth_tests::berth_in(home, &["inspect", "r"])
        .status
        .success());

    let api = format!("api.pkg.test:{port}");
    let other = format!("other.pkg.test:{port}");
    ok(
        berth(
            home,
            &cert,
            &[
                "create",
                "s",
                "--snapshot",
                &snapshot,
                "--dedup",
                "--allow-host",
                &api,
                "--allow-host",
                &other,
                "--test-resolve",
                "*.pkg.test=127.0.0.1",
                "--allow-cidr",
                &format!("127.0.0.0/8:{port}"),
                "--secret",
                &format!("API_KEY=@{}", source.display()),
                "--secret-hosts",
                &format!("API_KEY={api}"),
            ],
        ),
        "create",
    );
    // The user's file is theirs; Berth keeps its own copy.
    std::fs::remove_file(&source).unwrap();
    let exec = |script: &str| {
        let out = berth(home, &cert, &["exec", "s", "--", script]);
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };

    // The sandbox holds a placeholder.
    let (_, placeholder) = exec("printf %s \"$API_KEY\"");
    assert!(
        placeholder.starts_with("BERTH_SECRET_API_KEY_"),
        "{placeholder}"
    );

    // Its host gets the value (curl, then Python), in place of the
    // placeholder, wherever it stands in the header.
    let (code, out) = exec(&format!(
        "curl -sS -H \"Authorization: Bearer $API_KEY\" https://{api}/auth"
    ));
    assert_eq!(
        (code, out.trim()),
        (0, format!("auth=Bearer {value}").as_str())
    );
    let (code, out) = exec(&format!(
        "python3 -c \"import os,urllib.request as u; r=u.Request('https://{api}/auth', headers={{'Authorization': 'token='+os.environ['API_KEY']+';'}}); print(u.urlopen(r).read().decode().strip())\""
    ));
    assert_eq!(
        (code, out.trim()),
        (0, format!("auth=token={value};").as_str())
    );

    // Any other host gets the placeholder, over TLS the point does not
    // read: the certificate the sandbox sees is the server's own.
    let (code, out) = exec(&format!(
        "curl -sS -H \"Authorization: Bearer $API_KEY\" https://{other}/auth"
    ));
    assert_eq!(
        (code, out.trim()),
        (0, format!("auth=Bearer {placeholder}").as_str())
    );
    let issuer = |host: &str| {
        exec(&format!(
            "echo | openssl s_client -proxy 127.0.0.1:3128 -connect {host} -servername {} 2>/dev/null | openssl x509 -noout -issuer",
            host.split(':').next().unwrap()
        ))
        .1
    };
    assert!(issuer(&other).contains("pkg.test"), "{}", issuer(&other));
    assert!(
        issuer(&api).contains("Berth sandbox egress CA"),
        "{}",
        issuer(&api)
    );
    // A request in the tunnel to the secret's host that names another
    // host is refused, not sent there with the value.
    let (_, out) = exec(&format!(
        "curl -sS -H 'Host: other.pkg.test' -H \"Authorization: Bearer $API_KEY\" https://{api}/auth"
    ));
    assert!(out.contains("must name api.pkg.test"), "{out}");
    assert!(!out.contains(&value));

    // The log says which connection carried the secret, never its value.
    let log = ok(berth(home, &cert, &["egress", "s", "--json"]), "egress");
    let report: serde_json::Value = serde_json::from_str(&log).unwrap();
    assert!(report["connections"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["host"] == "api.pkg.test" && c["secrets"][0] == "API_KEY"));
    assert_eq!(report["secrets"][0]["placeholder"], placeholder.as_str());
    assert!(!log.contains(&value));

    // Nowhere the sandbox can look: its files (the host's it is shown
    // too), its environment, /proc. The probe's own command line must not
    // hold the value: it is given reversed and turned back into a pattern
    // file (excluded from the search) by `rev`, through its stdin.
    let reversed: String = value.chars().rev().collect();
    let (_, found) = exec(&format!(
        "printf %s '{reversed}' | rev > /tmp/needle; \
         grep -rlsf /tmp/needle --exclude=needle / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr --exclude-dir=dev; \
         grep -lsf /tmp/needle /proc/*/environ /proc/*/cmdline; env | grep -cf /tmp/needle"
    ));
    assert_eq!(
        found.trim(),
        "0",
        "the value is visible in the sandbox: {found}"
    );

    // Not in the state, the snapshot or any log: only in the daemon's
    // own file, mode 0600.
    ok(berth(home, &cert, &["stop", "s"]), "stop");
    assert_eq!(
        files_holding(&store, value.as_bytes()),
        Vec::<String>::new()
    );
    let holding = files_holding(home, value.as_bytes());
    assert_eq!(holding.len(), 1, "{holding:?}");
    assert!(holding[0].ends_with("secrets.json"), "{holding:?}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&holding[0]).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // A fork sends it to the same host, by its own daemon; after `rm`,
    // Berth keeps it nowhere.
    ok(berth(home, &cert, &["fork", "s", "f"]), "fork");
    let out = berth(
        home,
        &cert,
        &[
            "exec",
            "f",
            "--",
            &format!("curl -sS -H \"Authorization: Bearer $API_KEY\" https://{api}/auth"),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("auth=Bearer {value}")
    );
    ok(berth(home, &cert, &["rm", "f", "--force"]), "rm f");
    ok(berth(home, &cert, &["rm", "s", "--force"]), "rm s");
    assert_eq!(files_holding(home, value.as_bytes()), Vec::<String>::new());
}

/// Berth's home holds every sandbox's state and secrets: a confined
/// sandbox does not see it even where it lies under a directory the
/// sandbox is shown read-only (`/opt` here; `/usr/local` where there is
/// no `/opt`).
#[test]
fn berths_home_is_hidden_from_a_confined_sandbox_under_a_shown_directory() {
    let shown = ["/opt", "/usr/local"]
        .into_iter()
        .find(|d| Path::new(d).is_dir())
        .expect("a system directory a confined sandbox is shown");
    let dir = tempfile::Builder::new()
        .prefix("berth-test-home-")
        .tempdir_in(shown)
        .unwrap();
    let home = dir.path().join("home");
    // Removed however the test ends: its workspace image is mounted under
    // a host directory.
    struct Removed(PathBuf);
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = berth_tests::berth_in(&self.0, &["rm", "h", "--force"]);
        }
    }
    let _removed = Removed(home.clone());
    let value = format!("sk-home-{:016x}", rand::random::<u64>());
    let source = dir.path().join("key.txt");
    std::fs::write(&source, &value).unwrap();
    let out = berth(
        &home,
        &source,
        &[
            "create",
            "h",
            "--allow-host",
            "api.pkg.test",
            "--secret",
            &format!("K=@{}", source.display()),
            "--secret-hosts",
            "K=api.pkg.test",
        ],
    );
    ok(out, "create");
    std::fs::remove_file(&source).unwrap();
    let secrets: Vec<String> = files_holding(&home, value.as_bytes());
    assert_eq!(secrets.len(), 1, "{secrets:?}");
    let out = berth(
        &home,
        &source,
        &[
            "exec",
            "h",
            "--",
            &format!(
                "cat {} 2>&1; ls -A {}/egress 2>&1 | wc -l",
                secrets[0],
                home.display()
            ),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !text.contains(&value),
        "the sandbox read its secret: {text}"
    );
    assert!(text.contains("No such file"), "{text}");
    // The workspace, which lies in the home, is still the sandbox's.
    let out = berth(
        &home,
        &source,
        &["exec", "h", "--", "echo kept > note && cat note"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n");
}

/// On Docker, with busybox's wget, which asks the proxy for `GET
/// https://…` rather than a tunnel: the egress point opens the TLS itself
/// (verified against the host's roots), sends the value to the secret's
/// host and the placeholder to any other.
#[tokio::test(flavor = "multi_thread")]
async fn a_docker_sandbox_sends_a_secret_to_its_host_only() {
    if berth_tests::docker_or_skip("a_docker_sandbox_sends_a_secret_to_its_host_only")
        .await
        .is_none()
    {
        return;
    }
    tokio::task::spawn_blocking(docker_secret).await.unwrap();
}

fn docker_secret() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let scratch = tempfile::tempdir().unwrap();
    let (cert, server_cert, key) = ca_and_certificate(scratch.path());
    let https = server(Some((&server_cert, &key)));
    let port = https.port.to_string();
    let value = format!("sk-docker-{:016x}", rand::random::<u64>());
    std::fs::write(scratch.path().join("key.txt"), &value).unwrap();
    let (api, other) = (
        format!("api.pkg.test:{port}"),
        format!("other.pkg.test:{port}"),
    );
    let image = berth_tests::test_image();
    ok(
        berth(
            home,
            &cert,
            &[
                "create",
                "d",
                "--backend",
                "docker",
                "--image",
                &image,
                "--allow-host",
                &api,
                "--allow-host",
                &other,
                "--allow-cidr",
                &format!("127.0.0.0/8:{port}"),
                "--test-resolve",
                "*.pkg.test=127.0.0.1",
                "--secret",
                &format!("K=@{}", scratch.path().join("key.txt").display()),
                "--secret-hosts",
                &format!("K={api}"),
            ],
        ),
        "create",
    );
    let get = |host: &str| {
        let out = berth(
            home,
            &cert,
            &[
                "exec",
                "d",
                "--",
                &format!("wget -qO- --header \"Authorization: Bearer $K\" https://{host}/auth"),
            ],
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    assert_eq!(get(&api).trim(), format!("auth=Bearer {value}"));
    let placeholder = get(&other);
    assert!(
        placeholder
            .trim()
            .starts_with("auth=Bearer BERTH_SECRET_K_"),
        "{placeholder}"
    );
    let reversed: String = value.chars().rev().collect();
    let out = berth(
        home,
        &cert,
        &["exec", "d", "--", &format!(
            "printf %s '{reversed}' | rev > /tmp/needle; grep -rlsf /tmp/needle --exclude=needle / --exclude-dir=proc --exclude-dir=sys; env | grep -cf /tmp/needle"
        )],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    ok(berth(home, &cert, &["rm", "d", "--force"]), "rm");
}
