//! Egress by policy with the tools agents use and the timing users meet:
//! `git clone` over HTTPS through the egress point, and a policy changed
//! while a download runs (it finishes; the next connection is decided by
//! the new policy). Servers are started by this test, on loopback.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use berth_tests::berth_ok;

use crate::egress_support::{certificate, sh, verdict_of};

/// A static HTTPS server for `dir` on loopback (Python's, with the test's
/// certificate).
struct StaticServer {
    child: Child,
    port: u16,
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const STATIC: &str = r#"
import functools, http.server, ssl, sys
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(H, directory=sys.argv[1]))
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain(sys.argv[2], sys.argv[3])
s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

fn static_server(dir: &Path, cert: &Path, key: &Path) -> StaticServer {
    let mut child = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(STATIC)
        .arg(dir)
        .arg(cert)
        .arg(key)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    StaticServer {
        child,
        port: line.trim().parse().expect("the server says its port"),
    }
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn git_clones_over_https_and_a_policy_change_spares_a_running_download() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let scratch = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(scratch.path());
    // A repository served over the dumb HTTP protocol, and a large file.
    let served = scratch.path().join("served");
    let work = scratch.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q"]);
    std::fs::write(work.join("README"), "cloned through the egress point\n").unwrap();
    git(&work, &["add", "README"]);
    git(&work, &["commit", "-qm", "first"]);
    std::fs::create_dir_all(&served).unwrap();
    git(
        scratch.path(),
        &["clone", "-q", "--bare", "work", "served/repo.git"],
    );
    git(&served.join("repo.git"), &["update-server-info"]);
    let big = 8usize << 20;
    std::fs::write(served.join("big.bin"), vec![7u8; big]).unwrap();
    let server = static_server(&served, &cert, &key);
    let port = server.port.to_string();

    berth_ok(
        home,
        &[
            "create",
            "g",
            "--allow-host",
            &format!("git.pkg.test:{port}"),
            "--allow-host",
            &format!("files.pkg.test:{port}"),
            "--allow-cidr",
            &format!("127.0.0.0/8:{port}"),
            "--test-resolve",
            "*.pkg.test=127.0.0.1",
        ],
    );
    let root = berth_tests::local_root(&berth_tests::berth_state(home, "g"));
    std::fs::copy(&cert, root.join("ca.pem")).unwrap();

    let (code, out) = sh(
        home,
        "g",
        &format!(
            "git -c http.sslCAInfo=$PWD/ca.pem clone -q https://git.pkg.test:{port}/repo.git r && cat r/README"
        ),
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "cloned through the egress point\n")
    );
    assert_eq!(verdict_of(home, "g", "git.pkg.test").0, "allowed");

    // A download at 1 MiB/s; halfway, the policy stops allowing its host.
    let download = {
        let home = home.to_path_buf();
        let port = port.clone();
        std::thread::spawn(move || {
            sh(
                &home,
                "g",
                &format!(
                    "curl -sS --limit-rate 1M --cacert ca.pem -o big.bin https://files.pkg.test:{port}/big.bin && wc -c < big.bin"
                ),
            )
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !root.join("big.bin").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the download never began"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    berth_ok(
        home,
        &[
            "egress",
            "g",
            "--reset",
            "--allow-host",
            &format!("git.pkg.test:{port}"),
            "--allow-cidr",
            &format!("127.0.0.0/8:{port}"),
        ],
    );
    let (code, out) = download.join().unwrap();
    assert_eq!(
        (code, out.trim()),
        (0, big.to_string().as_str()),
        "the running download was cut"
    );
    // The next connection to it is the new policy's.
    let (code, _) = sh(
        home,
        "g",
        &format!("curl -sS --cacert ca.pem -o /dev/null https://files.pkg.test:{port}/big.bin"),
    );
    assert_ne!(code, 0);
    let (verdict, why) = verdict_of(home, "g", "files.pkg.test");
    assert_eq!(verdict, "denied");
    assert!(why.contains("files.pkg.test"), "{why}");
    drop(server);
    berth_ok(home, &["rm", "g", "--force"]);
}
