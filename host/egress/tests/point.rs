//! The egress point against servers these tests start on loopback (test
//! names resolve there through `Resolver::Fixed`; nothing else is sent
//! anywhere): what a policy allows gets through byte for byte, and every
//! refusal is the one its rule says, in the reply and in the log.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use berth_egress::{EgressPoint, EgressPolicy, Resolver, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A server that keeps what each connection sent first, and answers a
/// plain GET with the path and Host it saw.
async fn upstream() -> (u16, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 8192 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                kept.lock().unwrap().push(got.clone());
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some(line) = text.lines().next().filter(|l| l.starts_with("GET ")) {
                    let host = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Host: "))
                        .unwrap_or("-");
                    let body = format!("{} for {host}\n", line.split(' ').nth(1).unwrap());
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(reply.as_bytes()).await;
                }
            });
        }
    });
    (port, seen)
}

/// The egress point, listening on loopback.
async fn egress(point: EgressPoint) -> u16 {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let point = point.clone();
            tokio::spawn(async move { point.serve(stream).await });
        }
    });
    port
}

fn policy(allow: &[String], cidrs: &[String]) -> EgressPolicy {
    EgressPolicy {
        allow_hosts: allow.iter().map(|r| r.parse().unwrap()).collect(),
        deny_hosts: vec![],
        allow_cidrs: cidrs.iter().map(|r| r.parse().unwrap()).collect(),
    }
}

fn test_names() -> Resolver {
    Resolver::Test(vec!["*.test=127.0.0.1".parse().unwrap()])
}

/// Sends `request` to the egress point and reads until it closes.
async fn exchange(proxy: u16, request: &[u8]) -> String {
    let mut stream = TcpStream::connect((LOOPBACK, proxy)).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        stream.read_to_end(&mut out),
    )
    .await
    .expect("the egress point answers and closes");
    String::from_utf8_lossy(&out).into_owned()
}

fn last_verdict(point: &EgressPoint) -> Verdict {
    point.connections().0.last().unwrap().verdict.clone()
}

fn denied_because(point: &EgressPoint) -> String {
    match last_verdict(point) {
        Verdict::Denied { reason } => reason,
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[tokio::test]
async fn an_allowed_host_is_reached_and_everything_else_is_refused_by_its_rule() {
    let (port, seen) = upstream().await;
    let point = EgressPoint::new(
        policy(
            &[format!("api.allowed.test:{port}")],
            &[format!("127.0.0.1:{port}")],
        ),
        test_names(),
    );
    let proxy = egress(point.clone()).await;

    // Plain HTTP, absolute form: forwarded in origin form, one request.
    let reply = exchange(
        proxy,
        format!("GET http://api.allowed.test:{port}/x HTTP/1.1\r\nHost: api.allowed.test:{port}\r\nProxy-Connection: keep-alive\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(
        reply.ends_with(&format!("/x for api.allowed.test:{port}\n")),
        "{reply}"
    );
    let forwarded = String::from_utf8(seen.lock().unwrap().last().unwrap().clone()).unwrap();
    assert!(forwarded.starts_with("GET /x HTTP/1.1\r\n"), "{forwarded}");
    assert!(
        !forwarded.to_ascii_lowercase().contains("proxy-"),
        "{forwarded}"
    );
    // Bytes are counted when the connection ends, just after the reply.
    let mut entry = None;
    for _ in 0..100 {
        entry = point.connections().0.last().cloned();
        if entry.as_ref().is_some_and(|e| e.bytes_in > 0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let entry = entry.unwrap();
    assert_eq!(
        entry.verdict,
        Verdict::Allowed {
            rule: format!("api.allowed.test:{port}")
        }
    );
    assert!(entry.bytes_in > 0 && entry.bytes_out > 0, "{entry:?}");

    // A tunnel: CONNECT, then anything.
    let reply = exchange(
        proxy,
        format!("CONNECT api.allowed.test:{port} HTTP/1.1\r\n\r\nGET /t HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(
        reply.starts_with("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK"),
        "{reply}"
    );
    assert!(reply.ends_with("/t for api.allowed.test\n"), "{reply}");

    // Refusals, each with the rule in the reply and the log.
    let before = seen.lock().unwrap().len();
    for (request, status, reason) in [
        (format!("CONNECT denied.test:{port} HTTP/1.1\r\n\r\n"), "403", "no --allow-host rule names denied.test".to_string()),
        ("CONNECT api.allowed.test:22 HTTP/1.1\r\n\r\n".to_string(), "403", format!("api.allowed.test is allowed on port(s) {port} (by api.allowed.test:{port}), not on 22")),
        ("CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n".to_string(), "403", "127.0.0.1 port 22 is an address no --allow-cidr rule holds".to_string()),
        (format!("GET http://api.allowed.test:{port}/ HTTP/1.1\r\nHost: other.test\r\n\r\n"), "403", "the Host header \"other.test\" does not name api.allowed.test".to_string()),
        ("GET /relative HTTP/1.1\r\n\r\n".to_string(), "400", "names its URL in full".to_string()),
    ] {
        let reply = exchange(proxy, request.as_bytes()).await;
        assert!(reply.starts_with(&format!("HTTP/1.1 {status} ")), "{request:?}: {reply}");
        assert!(reply.contains(&reason), "{request:?}: {reply}");
    }
    assert_eq!(
        seen.lock().unwrap().len(),
        before,
        "a refused request reached the server"
    );

    // An IP literal a CIDR rule holds is reached.
    let reply = exchange(
        proxy,
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200 "), "{reply}");
}

#[tokio::test]
async fn a_name_that_resolves_into_loopback_is_refused_without_a_cidr_rule() {
    let (port, seen) = upstream().await;
    let point = EgressPoint::new(
        policy(&[format!("*.allowed.test:{port}")], &[]),
        test_names(),
    );
    let proxy = egress(point.clone()).await;
    let reply = exchange(
        proxy,
        format!("CONNECT a.allowed.test:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 403 "), "{reply}");
    assert_eq!(
        denied_because(&point),
        "a.allowed.test resolves to 127.0.0.1, a loopback address, which no --allow-cidr rule allows"
    );
    assert!(seen.lock().unwrap().is_empty());
    // The policy changes while the point runs: from the next connection.
    point.set_policy(policy(
        &[format!("*.allowed.test:{port}")],
        &[format!("127.0.0.0/8:{port}")],
    ));
    let reply = exchange(
        proxy,
        format!("CONNECT a.allowed.test:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200 "), "{reply}");
}

fn client_hello(host: &str) -> Vec<u8> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

#[tokio::test]
async fn a_tls_server_name_other_than_the_tunnels_host_is_refused() {
    let (port, seen) = upstream().await;
    let point = EgressPoint::new(
        policy(
            &[format!("*.allowed.test:{port}")],
            &[format!("127.0.0.1:{port}")],
        ),
        test_names(),
    );
    let proxy = egress(point.clone()).await;
    // A matching name: the ClientHello reaches the server whole, even
    // when it arrives in small writes.
    let hello = client_hello("a.allowed.test");
    let mut stream = TcpStream::connect((LOOPBACK, proxy)).await.unwrap();
    stream
        .write_all(format!("CONNECT a.allowed.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    for piece in hello.chunks(100) {
        stream.write_all(piece).await.unwrap();
        stream.flush().await.unwrap();
    }
    let mut reply = vec![0u8; 39];
    stream.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply[..], b"HTTP/1.1 200 Connection established\r\n\r\n");
    drop(stream);
    for _ in 0..50 {
        if !seen.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(seen.lock().unwrap().first(), Some(&hello));

    // Fronting: allowed name in CONNECT, another in the ClientHello.
    let mut request = format!("CONNECT a.allowed.test:{port} HTTP/1.1\r\n\r\n").into_bytes();
    request.extend_from_slice(&client_hello("b.allowed.test"));
    let reply = exchange(proxy, &request).await;
    assert!(
        reply.starts_with("HTTP/1.1 200 Connection established"),
        "{reply}"
    );
    assert!(
        reply.contains("403 Forbidden")
            && reply.contains("\"b.allowed.test\" is not a.allowed.test"),
        "{reply}"
    );
    assert!(denied_because(&point).contains("TLS server name"));
    let reached = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|b| !b.is_empty())
        .count();
    assert_eq!(reached, 1, "the fronted hello reached the server");
}

#[tokio::test]
async fn plain_http_in_a_tunnel_may_not_name_another_host() {
    let (port, seen) = upstream().await;
    let point = EgressPoint::new(
        policy(
            &[format!("*.allowed.test:{port}")],
            &[format!("127.0.0.1:{port}")],
        ),
        test_names(),
    );
    let proxy = egress(point.clone()).await;
    // The head arrives in pieces; the check waits for all of it.
    let mut stream = TcpStream::connect((LOOPBACK, proxy)).await.unwrap();
    stream
        .write_all(format!("CONNECT a.allowed.test:{port} HTTP/1.1\r\n\r\nGET / HT").as_bytes())
        .await
        .unwrap();
    stream.flush().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    stream
        .write_all(b"TP/1.1\r\nHost: evil.example\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    let reply = String::from_utf8_lossy(&out);
    assert!(
        reply.contains("403 Forbidden") && reply.contains("\"evil.example\" in the tunnel"),
        "{reply}"
    );
    assert!(denied_because(&point).contains("Host header"));
    let reached = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|b| !b.is_empty())
        .count();
    assert_eq!(reached, 0, "the request reached the server");
}

/// An open tunnel's bytes show in the log while it lasts, and the log
/// keeps them once it ends, counted once.
#[tokio::test]
async fn an_open_connections_bytes_are_counted_as_they_pass() {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.write_all(&[1u8; 100_000]).await.unwrap();
        let _ = released.await;
    });
    let point = EgressPoint::new(
        policy(
            &[format!("bulk.test:{port}")],
            &[format!("127.0.0.1:{port}")],
        ),
        test_names(),
    );
    let proxy = egress(point.clone()).await;
    let mut client = TcpStream::connect((LOOPBACK, proxy)).await.unwrap();
    client
        .write_all(format!("CONNECT bulk.test:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: bulk.test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 65536];
    let head = b"HTTP/1.1 200 Connection established\r\n\r\n".len();
    while got < head + 100_000 {
        got += client.read(&mut buf).await.unwrap();
    }
    let live = point.connections().0.last().cloned().unwrap();
    assert_eq!(live.bytes_in, 100_000, "{live:?}");
    assert!(live.bytes_out > 0);
    assert_eq!(point.open_connections(), 1);
    release.send(()).unwrap();
    drop(client);
    for _ in 0..200 {
        if point.open_connections() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let ended = point.connections().0.last().cloned().unwrap();
    assert_eq!(
        (ended.bytes_in, ended.bytes_out),
        (live.bytes_in, live.bytes_out)
    );
}
