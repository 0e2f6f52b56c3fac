//! The protocol between Berth's host and its in-container agent: framed
//! messages over the stdin and stdout of one long-lived exec session.
//!
//! A frame is a 4-byte big-endian length (of what follows), a kind byte,
//! a 4-byte big-endian command id, and a payload. Both sides bound frames
//! by [`MAX_FRAME`]; a frame over it, an unknown kind or a payload that
//! does not decode ends the session with an error, since nothing after it
//! can be trusted to be in step.
//!
//! The host sends [`Kind::Run`] (a [`RunRequest`]), then for a command that
//! asked for stdin any number of [`Kind::Stdin`] chunks (an empty one is the
//! end of stdin), and at any time [`Kind::Kill`], [`Kind::Signal`] and, for
//! a command on a terminal, [`Kind::Resize`]. The agent answers
//! [`Kind::Hello`] once, then per command any number of [`Kind::Stdout`]
//! and [`Kind::Stderr`] chunks, a [`Kind::StdinAck`] per stdin chunk it has
//! handed to the command (the host keeps at most [`STDIN_WINDOW`] chunks
//! unacknowledged, so neither side buffers more), and one [`Kind::Exit`]
//! (an [`ExitReport`]) or [`Kind::Error`].
//!
//! `berth-agent egress-tunnel ADDRESS`, run in its own exec session,
//! speaks the same frames for a sandbox whose egress point is on a host
//! that cannot bind its socket into the container (a swarm node's): it
//! listens on ADDRESS and announces each connection with
//! [`Kind::TunnelOpen`]; both sides then carry its bytes as
//! [`Kind::TunnelData`], acknowledged chunk by chunk with
//! [`Kind::TunnelAck`] (at most [`TUNNEL_WINDOW`] outstanding per
//! connection, so a slow reader holds up only its own connection), and end
//! it with an empty data frame per direction or a [`Kind::TunnelClose`].
//!
//! The same binary, run with arguments, is the sandbox's tool for files
//! (`berth-agent fs …`) and background processes (`berth-agent proc …`);
//! see its `--help`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::io::{self, Write};

pub mod walk;

/// The protocol version the agent announces in its hello.
pub const VERSION: u32 = 3;

/// The largest frame either side accepts (length field included).
pub const MAX_FRAME: usize = 1 << 20;

/// The largest output chunk the agent sends in one frame.
pub const CHUNK: usize = 64 * 1024;

/// Where the host puts the agent in a container.
pub const AGENT_PATH: &str = "/.berth/agent";

/// Stdin chunks the host may have sent that the agent has not yet
/// acknowledged with [`Kind::StdinAck`].
pub const STDIN_WINDOW: usize = 16;

/// Data chunks of one tunnelled connection either side may have sent that
/// the other has not acknowledged with [`Kind::TunnelAck`].
pub const TUNNEL_WINDOW: usize = 16;

/// Connections a tunnel carries at once; one more is closed as it opens.
pub const TUNNEL_CONNECTIONS: usize = 128;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Host → agent: run a command ([`RunRequest`]).
    Run = 1,
    /// Host → agent: kill a command and everything it started.
    Kill = 2,
    /// Host → agent: a chunk of a command's stdin; empty: the end of it.
    Stdin = 3,
    /// Host → agent: a terminal's new size (rows and columns, two
    /// big-endian `u16`s).
    Resize = 4,
    /// Host → agent: send a signal (a big-endian `i32`) to the command's
    /// process group.
    Signal = 5,
    /// Agent → host: ready; the payload is [`VERSION`].
    Hello = 10,
    /// Agent → host: a chunk of a command's stdout.
    Stdout = 11,
    /// Agent → host: a chunk of a command's stderr.
    Stderr = 12,
    /// Agent → host: a command ended ([`ExitReport`]).
    Exit = 13,
    /// Agent → host: a command could not run; the payload is the reason.
    Error = 14,
    /// Agent → host: one stdin chunk was handed to the command.
    StdinAck = 15,
    /// Tunnel, agent → host: a connection to the tunnel's address was
    /// accepted; its id names it from now on (see `egress-tunnel`).
    TunnelOpen = 20,
    /// Tunnel, both ways: bytes for a connection; empty: the sender has
    /// finished writing (a half close).
    TunnelData = 21,
    /// Tunnel, both ways: one [`Kind::TunnelData`] chunk was written to
    /// its destination (each side keeps at most [`TUNNEL_WINDOW`] chunks
    /// unacknowledged per connection).
    TunnelAck = 22,
    /// Tunnel, both ways: the connection is gone; drop it.
    TunnelClose = 23,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Run,
            2 => Kind::Kill,
            3 => Kind::Stdin,
            4 => Kind::Resize,
            5 => Kind::Signal,
            10 => Kind::Hello,
            11 => Kind::Stdout,
            12 => Kind::Stderr,
            13 => Kind::Exit,
            14 => Kind::Error,
            15 => Kind::StdinAck,
            20 => Kind::TunnelOpen,
            21 => Kind::TunnelData,
            22 => Kind::TunnelAck,
            23 => Kind::TunnelClose,
            _ => return None,
        })
    }
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it carries.
    pub kind: Kind,
    /// The command it is about (0 for the hello).
    pub id: u32,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// Why a byte stream is not a valid frame sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// A frame's length is over [`MAX_FRAME`] or under its header.
    BadLength(usize),
    /// A kind byte that names nothing.
    UnknownKind(u8),
    /// A payload that does not decode as its kind's.
    BadPayload(&'static str),
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtocolError::BadLength(n) => {
                write!(f, "a frame of {n} bytes (the limit is {MAX_FRAME})")
            }
            ProtocolError::UnknownKind(k) => write!(f, "a frame of unknown kind {k}"),
            ProtocolError::BadPayload(what) => write!(f, "an unreadable {what} payload"),
        }
    }
}

impl std::error::Error for ProtocolError {}

impl Frame {
    /// A frame.
    pub fn new(kind: Kind, id: u32, payload: Vec<u8>) -> Self {
        Frame { kind, id, payload }
    }

    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let len = 1 + 4 + self.payload.len();
        let mut out = Vec::with_capacity(4 + len);
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// Writes the frame and flushes.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode())?;
        w.flush()
    }
}

/// Splits a byte stream, fed in pieces of any size, into frames.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Decoder::default()
    }

    /// Adds bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived. An error means the stream
    /// is broken for good.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if !(5..=MAX_FRAME - 4).contains(&len) {
            return Err(ProtocolError::BadLength(len));
        }
        let Some(&kind) = self.buf.get(4) else {
            return Ok(None);
        };
        let kind = Kind::from_byte(kind).ok_or(ProtocolError::UnknownKind(kind))?;
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let id = u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]]);
        let payload = self.buf[9..4 + len].to_vec();
        self.buf.drain(..4 + len);
        Ok(Some(Frame { kind, id, payload }))
    }

    /// Bytes received but not yet a whole frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Reads frames from a blocking reader (the agent's stdin).
pub fn read_frame(r: &mut impl io::Read) -> io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = u32::from_be_bytes(len) as usize;
    if !(5..=MAX_FRAME - 4).contains(&n) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            ProtocolError::BadLength(n),
        ));
    }
    let mut rest = vec![0u8; n];
    r.read_exact(&mut rest)?;
    let kind = Kind::from_byte(rest[0]).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            ProtocolError::UnknownKind(rest[0]),
        )
    })?;
    let id = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
    Ok(Some(Frame {
        kind,
        id,
        payload: rest[5..].to_vec(),
    }))
}

struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(&(b.len() as u32).to_be_bytes());
        self.0.extend_from_slice(b);
    }
}

struct Reader<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if self.rest.len() < n {
            return Err(ProtocolError::BadPayload(self.what));
        }
        let (now, later) = self.rest.split_at(n);
        self.rest = later;
        Ok(now)
    }
    fn u64(&mut self) -> Result<u64, ProtocolError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn u16(&mut self) -> Result<u16, ProtocolError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn flag(&mut self) -> Result<bool, ProtocolError> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtocolError::BadPayload(self.what)),
        }
    }
    fn u32(&mut self) -> Result<u32, ProtocolError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn string(&mut self) -> Result<String, ProtocolError> {
        let n = self.u32()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtocolError::BadPayload(self.what))
    }
    fn end(&self) -> Result<(), ProtocolError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::BadPayload(self.what))
        }
    }
}

/// A command to run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunRequest {
    /// Passed to `sh -c` (when `argv` is empty).
    pub command: String,
    /// Version 3: the program and its arguments, run with no shell
    /// (`berth-agent exec`); empty: `command` runs under `sh -c`.
    pub argv: Vec<String>,
    /// The working directory.
    pub cwd: String,
    /// Variables added to the agent's environment.
    pub env: Vec<(String, String)>,
    /// Killed, with everything it started, after this many milliseconds.
    pub timeout_ms: u64,
    /// Bytes of stdout to send; the rest is counted.
    pub stdout_cap: u64,
    /// Bytes of stderr to send; the rest is counted.
    pub stderr_cap: u64,
    /// A persistent shell session to run in (its working directory and
    /// exported variables carry over between its commands); empty: none.
    pub session: String,
    /// Whether the host streams stdin ([`Kind::Stdin`]); otherwise the
    /// command's stdin is empty.
    pub stdin: bool,
    /// Runs the command on a new terminal of this many rows and columns
    /// (stdout carries the terminal's output, stderr nothing); `(0, 0)`:
    /// no terminal, pipes.
    pub pty: (u16, u16),
}

impl RunRequest {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.bytes(self.command.as_bytes());
        w.bytes(self.cwd.as_bytes());
        w.0.extend_from_slice(&(self.env.len() as u32).to_be_bytes());
        for (k, v) in &self.env {
            w.bytes(k.as_bytes());
            w.bytes(v.as_bytes());
        }
        w.u64(self.timeout_ms);
        w.u64(self.stdout_cap);
        w.u64(self.stderr_cap);
        w.bytes(self.session.as_bytes());
        w.0.push(self.stdin as u8);
        w.0.extend_from_slice(&self.pty.0.to_be_bytes());
        w.0.extend_from_slice(&self.pty.1.to_be_bytes());
        w.0.extend_from_slice(&(self.argv.len() as u32).to_be_bytes());
        for word in &self.argv {
            w.bytes(word.as_bytes());
        }
        w.0
    }

    /// Decodes a payload.
    pub fn decode(payload: &[u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader {
            rest: payload,
            what: "run",
        };
        let command = r.string()?;
        let cwd = r.string()?;
        let n = r.u32()? as usize;
        let mut env = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            env.push((r.string()?, r.string()?));
        }
        let mut req = RunRequest {
            command,
            cwd,
            env,
            timeout_ms: r.u64()?,
            stdout_cap: r.u64()?,
            stderr_cap: r.u64()?,
            session: r.string()?,
            stdin: r.flag()?,
            pty: (r.u16()?, r.u16()?),
            argv: Vec::new(),
        };
        let words = r.u32()? as usize;
        req.argv.reserve(words.min(4096));
        for _ in 0..words {
            req.argv.push(r.string()?);
        }
        r.end()?;
        Ok(req)
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExitReport {
    /// Exit code; 128+N when killed by signal N; 124 on timeout.
    pub code: i32,
    /// Whether the timeout (or a kill) ended it.
    pub timed_out: bool,
    /// Stdout bytes over the cap, not sent.
    pub stdout_dropped: u64,
    /// Stderr bytes over the cap, not sent.
    pub stderr_dropped: u64,
}

impl ExitReport {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.0.extend_from_slice(&self.code.to_be_bytes());
        w.0.push(self.timed_out as u8);
        w.u64(self.stdout_dropped);
        w.u64(self.stderr_dropped);
        w.0
    }

    /// Decodes a payload.
    pub fn decode(payload: &[u8]) -> Result<Self, ProtocolError> {
        let mut r = Reader {
            rest: payload,
            what: "exit",
        };
        let code = r.u32()? as i32;
        let timed_out = r.flag()?;
        let report = ExitReport {
            code,
            timed_out,
            stdout_dropped: r.u64()?,
            stderr_dropped: r.u64()?,
        };
        r.end()?;
        Ok(report)
    }
}

/// The payload of a [`Kind::Resize`] frame.
pub fn encode_size(rows: u16, cols: u16) -> Vec<u8> {
    let mut v = rows.to_be_bytes().to_vec();
    v.extend_from_slice(&cols.to_be_bytes());
    v
}

/// Decodes a [`Kind::Resize`] payload.
pub fn decode_size(payload: &[u8]) -> Result<(u16, u16), ProtocolError> {
    let mut r = Reader {
        rest: payload,
        what: "resize",
    };
    let size = (r.u16()?, r.u16()?);
    r.end()?;
    Ok(size)
}

/// Decodes a [`Kind::Signal`] payload.
pub fn decode_signal(payload: &[u8]) -> Result<i32, ProtocolError> {
    let mut r = Reader {
        rest: payload,
        what: "signal",
    };
    let sig = r.u32()? as i32;
    r.end()?;
    Ok(sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_whatever_the_pieces() {
        let req = RunRequest {
            command: "echo hi".into(),
            cwd: "/workspace".into(),
            env: vec![("A".into(), "b=c".into())],
            timeout_ms: 5000,
            stdout_cap: 10,
            stderr_cap: 20,
            session: "s1".into(),
            stdin: true,
            pty: (24, 80),
            argv: vec![
                "printf".into(),
                "%s\n".into(),
                "$HOME; *".into(),
                String::new(),
            ],
        };
        let frames = [
            Frame::new(Kind::Run, 7, req.encode()),
            Frame::new(Kind::Stdout, 7, b"hello".to_vec()),
            Frame::new(
                Kind::Exit,
                7,
                ExitReport {
                    code: -3,
                    timed_out: true,
                    stdout_dropped: 1,
                    stderr_dropped: 2,
                }
                .encode(),
            ),
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        for step in [1, 3, 7, bytes.len()] {
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for piece in bytes.chunks(step) {
                d.push(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, frames);
            assert_eq!(d.pending(), 0);
        }
        assert_eq!(RunRequest::decode(&frames[0].payload).unwrap(), req);
        let exit = ExitReport::decode(&frames[2].payload).unwrap();
        assert_eq!((exit.code, exit.timed_out), (-3, true));
        let mut cursor = io::Cursor::new(bytes);
        assert_eq!(read_frame(&mut cursor).unwrap().unwrap(), frames[0]);
    }

    /// Whatever the agent (or anything posing as it) sends, in whatever
    /// pieces, the decoder answers frames, "not yet" or an error, and never
    /// panics or buffers past one frame. Seeded, so a failure replays.
    #[test]
    fn arbitrary_bytes_in_arbitrary_pieces_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..2000 {
            let mut bytes = Vec::new();
            // Valid frames with corruption sprinkled in, or pure noise.
            while bytes.len() < 300 {
                if next() % 3 == 0 {
                    let n = (next() % 40) as usize;
                    bytes.extend((0..n).map(|_| next() as u8));
                } else {
                    let payload: Vec<u8> = (0..next() % 50).map(|_| next() as u8).collect();
                    bytes.extend(Frame::new(Kind::Stdout, next() as u32, payload).encode());
                }
            }
            let mut d = Decoder::new();
            let mut rest = &bytes[..];
            'feed: while !rest.is_empty() {
                let n = (1 + next() % 17).min(rest.len() as u64) as usize;
                d.push(&rest[..n]);
                rest = &rest[n..];
                loop {
                    match d.next_frame() {
                        Ok(Some(f)) => assert!(f.payload.len() < MAX_FRAME),
                        Ok(None) => break,
                        Err(_) => break 'feed,
                    }
                }
                assert!(d.pending() < MAX_FRAME + 17, "case {case}");
            }
        }
    }

    #[test]
    fn oversized_unknown_and_malformed_frames_are_refused() {
        let mut d = Decoder::new();
        d.push(&(MAX_FRAME as u32).to_be_bytes());
        d.push(&[11]);
        assert_eq!(d.next_frame(), Err(ProtocolError::BadLength(MAX_FRAME)));
        let mut d = Decoder::new();
        d.push(&[0, 0, 0, 5, 99, 0, 0, 0, 1]);
        assert_eq!(d.next_frame(), Err(ProtocolError::UnknownKind(99)));
        let mut d = Decoder::new();
        d.push(&[0, 0, 0, 2]);
        assert_eq!(d.next_frame(), Err(ProtocolError::BadLength(2)));
        assert!(RunRequest::decode(&[0, 0, 0, 9, b'x']).is_err());
        assert!(ExitReport::decode(&[0; 3]).is_err());
        let mut with_trailer = ExitReport::default().encode();
        with_trailer.push(0);
        assert!(ExitReport::decode(&with_trailer).is_err());
    }
}
