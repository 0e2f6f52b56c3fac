//! `berth-agent egress-tunnel ADDRESS`: the sandbox's end of an egress
//! route carried over this process's stdin and stdout, for a sandbox whose
//! egress point is a socket on a host that cannot bind it into the
//! container (a swarm node's container; the point is on Berth's host).
//!
//! It listens on `ADDRESS` (the proxy address every command is given),
//! says hello, and speaks the crate's tunnel frames: each accepted
//! connection is announced ([`Kind::TunnelOpen`]) and its bytes go both
//! ways as [`Kind::TunnelData`], each chunk acknowledged once written
//! ([`Kind::TunnelAck`]; at most [`TUNNEL_WINDOW`] unacknowledged per
//! connection and direction, so memory is bounded and a slow reader holds
//! up only its own connection). It decides nothing: the host's egress
//! point does. It exits when its stdin ends (the host went away), and the
//! address stops answering with it.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use berth_agent::{Frame, Kind, CHUNK, TUNNEL_CONNECTIONS, TUNNEL_WINDOW, VERSION};

const USAGE: &str = "usage: berth-agent egress-tunnel ADDRESS";

/// Frames to the host, one writer at a time.
struct Out(Mutex<io::Stdout>);

impl Out {
    fn send(&self, kind: Kind, id: u32, payload: Vec<u8>) {
        let mut out = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if Frame::new(kind, id, payload).write_to(&mut *out).is_err() {
            // The host is gone: nothing here has anywhere to go.
            std::process::exit(0);
        }
    }
}

/// Chunks a connection may still send before the host acknowledges one.
struct Credits {
    left: Mutex<Option<usize>>,
    changed: Condvar,
}

impl Credits {
    fn new() -> Self {
        Credits {
            left: Mutex::new(Some(TUNNEL_WINDOW)),
            changed: Condvar::new(),
        }
    }

    /// Waits for a credit and takes it; `false` once the connection is
    /// closed.
    fn take(&self) -> bool {
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match *left {
                None => return false,
                Some(0) => {
                    left = self.changed.wait(left).unwrap_or_else(|p| p.into_inner());
                }
                Some(n) => {
                    *left = Some(n - 1);
                    return true;
                }
            }
        }
    }

    fn give(&self) {
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = *left {
            *left = Some((n + 1).min(TUNNEL_WINDOW));
        }
        self.changed.notify_all();
    }

    fn close(&self) {
        *self.left.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.changed.notify_all();
    }
}

/// One tunnelled connection, as the frame reader sees it.
struct Connection {
    stream: TcpStream,
    credits: Arc<Credits>,
    /// Chunks from the host to write to the client; empty: its end.
    to_client: mpsc::Sender<Vec<u8>>,
    /// Chunks handed to the writer and not yet written.
    queued: Arc<AtomicU32>,
    /// Halves still carrying (2, then 1, then gone).
    halves: Arc<AtomicU32>,
}

type Connections = Arc<Mutex<HashMap<u32, Connection>>>;

/// Runs the tunnel as `args` (after `egress-tunnel`) say.
pub fn main(args: &[String]) -> i32 {
    let [address] = args else {
        eprintln!("{USAGE}");
        return 2;
    };
    let listener = match listen(address) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("berth-agent egress-tunnel: listening on {address}: {e}");
            return 1;
        }
    };
    let out = Arc::new(Out(Mutex::new(io::stdout())));
    let connections: Connections = Arc::default();
    out.send(Kind::Hello, 0, VERSION.to_be_bytes().to_vec());
    {
        let out = out.clone();
        let connections = connections.clone();
        std::thread::spawn(move || accept(listener, &out, &connections));
    }
    let mut stdin = io::stdin().lock();
    loop {
        let frame = match berth_agent::read_frame(&mut stdin) {
            Ok(Some(f)) => f,
            Ok(None) => return 0,
            Err(e) => {
                eprintln!("berth-agent egress-tunnel: the host's stream is broken ({e}); stopping");
                return 2;
            }
        };
        let id = frame.id;
        let mut all = connections.lock().unwrap_or_else(|p| p.into_inner());
        match frame.kind {
            Kind::TunnelData => {
                let Some(conn) = all.get(&id) else { continue };
                // The host keeps to the window; a host that does not is
                // cut off from this connection rather than buffered for.
                let over = conn.queued.fetch_add(1, Ordering::SeqCst) as usize >= TUNNEL_WINDOW;
                if over || conn.to_client.send(frame.payload).is_err() {
                    close(&mut all, id);
                    drop(all);
                    out.send(Kind::TunnelClose, id, Vec::new());
                }
            }
            Kind::TunnelAck => {
                if let Some(conn) = all.get(&id) {
                    conn.credits.give();
                }
            }
            // The host's end is gone: so is the client's connection.
            Kind::TunnelClose => close(&mut all, id),
            other => {
                eprintln!("berth-agent egress-tunnel: the host sent a {other:?} frame; stopping");
                return 2;
            }
        }
    }
}

/// Listens on `address`; while it is taken, tries again for a while (the
/// previous tunnel, whose host has just gone, may not have exited yet).
fn listen(address: &str) -> io::Result<TcpListener> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match TcpListener::bind(address) {
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// Drops connection `id`: its socket is shut both ways, so its reader and
/// writer end.
fn close(all: &mut HashMap<u32, Connection>, id: u32) {
    if let Some(conn) = all.remove(&id) {
        conn.credits.close();
        let _ = conn.stream.shutdown(Shutdown::Both);
    }
}

/// Counts one half of connection `id` done (`whole`: to its end); the
/// second forgets it. A broken half drops the connection at once and
/// tells the host.
fn end_half(connections: &Connections, id: u32, halves: &AtomicU32, whole: bool, out: &Out) {
    if halves.fetch_sub(1, Ordering::SeqCst) == 1 || !whole {
        let mut all = connections.lock().unwrap_or_else(|p| p.into_inner());
        let known = all.contains_key(&id);
        close(&mut all, id);
        drop(all);
        if known && !whole {
            out.send(Kind::TunnelClose, id, Vec::new());
        }
    }
}

fn accept(listener: TcpListener, out: &Arc<Out>, connections: &Connections) {
    let mut next_id = 1u32;
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let _ = client.set_nodelay(true);
        let (Ok(reader), Ok(writer)) = (client.try_clone(), client.try_clone()) else {
            continue;
        };
        let id = next_id;
        next_id = next_id.wrapping_add(1).max(1);
        let (to_client, chunks) = mpsc::channel();
        let conn = Connection {
            stream: client,
            credits: Arc::new(Credits::new()),
            to_client,
            queued: Arc::default(),
            halves: Arc::new(AtomicU32::new(2)),
        };
        let (credits, queued, halves) = (
            conn.credits.clone(),
            conn.queued.clone(),
            conn.halves.clone(),
        );
        {
            let mut all = connections.lock().unwrap_or_else(|p| p.into_inner());
            if all.len() >= TUNNEL_CONNECTIONS {
                // Dropping it closes the client's connection at once.
                continue;
            }
            all.insert(id, conn);
        }
        out.send(Kind::TunnelOpen, id, Vec::new());
        {
            let (out, connections, halves) = (out.clone(), connections.clone(), halves.clone());
            std::thread::spawn(move || {
                let whole = to_host(reader, id, &credits, &out);
                end_half(&connections, id, &halves, whole, &out);
            });
        }
        let (out, connections) = (out.clone(), connections.clone());
        std::thread::spawn(move || {
            let whole = to_client_side(writer, id, &chunks, &queued, &out);
            end_half(&connections, id, &halves, whole, &out);
        });
    }
}

/// Reads the client and sends its bytes to the host, a window at a time;
/// an empty chunk at its end. `false`: the connection broke (or was
/// closed).
fn to_host(mut client: TcpStream, id: u32, credits: &Credits, out: &Out) -> bool {
    let mut buf = vec![0u8; CHUNK];
    loop {
        if !credits.take() {
            return false;
        }
        match client.read(&mut buf) {
            Ok(0) => {
                out.send(Kind::TunnelData, id, Vec::new());
                return true;
            }
            Ok(n) => out.send(Kind::TunnelData, id, buf[..n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => credits.give(),
            Err(_) => return false,
        }
    }
}

/// Writes the host's chunks to the client, acknowledging each; shuts the
/// client's write side at the host's end. `false`: the connection broke
/// (or was closed).
fn to_client_side(
    mut client: TcpStream,
    id: u32,
    chunks: &mpsc::Receiver<Vec<u8>>,
    queued: &AtomicU32,
    out: &Out,
) -> bool {
    while let Ok(chunk) = chunks.recv() {
        queued.fetch_sub(1, Ordering::SeqCst);
        if chunk.is_empty() {
            let _ = client.shutdown(Shutdown::Write);
            return true;
        }
        if client.write_all(&chunk).is_err() {
            return false;
        }
        out.send(Kind::TunnelAck, id, Vec::new());
    }
    false
}
