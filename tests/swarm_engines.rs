//! A node's engine reached over mutual TLS (part of the `swarm` test
//! binary).

use std::process::{Child, Command, Stdio};

use super::*;
use berth_tests::engine2_or_skip;

/// A node's engine behind mutual TLS: `stunnel` on a loopback port with the
/// second engine's server certificate, asking for a client certificate of
/// its CA, forwarding to the node's socket; the node's `berth.engine`
/// label names it. Undone when dropped.
struct TlsFront {
    swarm: Swarm,
    node: String,
    child: Child,
    /// `tcp://127.0.0.1:PORT`.
    endpoint: String,
}

impl TlsFront {
    fn start(swarm: &Swarm, node: &str, server_certs: &Path) -> TlsFront {
        let port = berth_tests::free_port();
        // stunnel, not socat: socat's OpenSSL server refuses the session
        // resumption rustls clients attempt ("session id context
        // uninitialized").
        let certs = server_certs.display();
        let config = format!("{}/{node}/stunnel-{port}.conf", swarm.dir);
        std::fs::write(
            &config,
            format!(
                "foreground = yes\npid =\n[engine]\naccept = 127.0.0.1:{port}\n\
                 connect = {}/{node}/docker.sock\ncert = {certs}/server-cert.pem\n\
                 key = {certs}/server-key.pem\nCAfile = {certs}/ca.pem\n\
                 verifyChain = yes\nrequireCert = yes\n",
                swarm.dir
            ),
        )
        .unwrap();
        let child = Command::new("stunnel")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("stunnel (`cargo xtask setup` installs it)");
        let endpoint = format!("tcp://127.0.0.1:{port}");
        let mut front = TlsFront {
            swarm: swarm.clone(),
            node: node.to_string(),
            child,
            endpoint,
        };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "stunnel did not listen: {:?}",
                front.child.try_wait()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        front.label(&front.endpoint.clone());
        front
    }

    fn label(&self, engine: &str) {
        let id = &self.swarm.ids[self
            .swarm
            .nodes
            .iter()
            .position(|n| *n == self.node)
            .unwrap()];
        self.swarm
            .docker(
                &self.swarm.any_manager(),
                &[
                    "node",
                    "update",
                    "--label-add",
                    &format!("berth.engine={engine}"),
                    id,
                ],
            )
            .expect("labelling the node's engine");
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.label(&self.swarm.socket(&self.node));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A swarm whose node engines are `tcp://` with mutual TLS: a sandbox
/// given the client certificates (`--tls-cert-path`) is reached on its
/// node through TLS, stops, and comes back from its stop in a new task;
/// with another CA's files it is refused naming the engine, and leaves
/// nothing.
#[test]
fn a_node_engine_behind_mutual_tls_is_reached_with_the_sandboxs_certificates() {
    const TEST: &str = "a_node_engine_behind_mutual_tls_is_reached_with_the_sandboxs_certificates";
    let _serial = serial();
    let Some(s) = setup(TEST) else {
        return;
    };
    let Some(e) = engine2_or_skip(TEST) else {
        return;
    };
    let node = s.swarm.nodes[2].clone();
    let pin = format!("node.id=={}", s.swarm.ids[2]);
    let server_certs = Path::new(&e.certs).parent().unwrap().join("certs");
    let front = TlsFront::start(&s.swarm, &node, &server_certs);
    let before = s.swarm.berth_services();

    let err = failed(
        &s.try_create(
            "wrong",
            &[
                "--constraint",
                &pin,
                "--placement-timeout",
                "5s",
                "--tls-cert-path",
                &e.wrong_ca,
            ],
        ),
        "a create with another CA's files",
    );
    assert!(err.contains(&front.endpoint), "{err}");
    assert!(!berth_ok(s.home(), &["ls"]).contains("wrong"));
    assert_eq!(
        s.swarm.berth_services(),
        before,
        "a service was left behind"
    );

    s.create("tls", &["--constraint", &pin, "--tls-cert-path", &e.certs]);
    let task = s.swarm_state("tls").current.expect("a task");
    assert_eq!(task.engine, front.endpoint);
    let listing = s.populate_and_stop("tls", 0x7150);
    s.remove_container("tls");
    assert_eq!(s.listing("tls"), listing);
    assert_eq!(s.swarm_state("tls").current.unwrap().engine, front.endpoint);
    s.remove_all(&["tls".to_string()]);
}
