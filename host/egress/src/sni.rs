//! The server name in a TLS ClientHello, read from the first bytes a
//! client sends (RFC 8446 §4.1.2, RFC 6066 §3), reassembled across TLS
//! records. Nothing is decrypted and nothing past the ClientHello is read.

/// The most ClientHello bytes (records included) the egress point reads
/// before refusing a connection: a ClientHello with post-quantum key
/// shares is about 2 KiB.
pub const MAX_CLIENT_HELLO: usize = 64 << 10;

/// What the first bytes of a connection say about its server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sni {
    /// More bytes are needed.
    Incomplete,
    /// They are not a TLS ClientHello (or not a well-formed one), or it
    /// would take more than [`MAX_CLIENT_HELLO`] bytes.
    NotTls,
    /// A ClientHello without a server name.
    Missing,
    /// The host name the ClientHello names, as sent.
    Name(String),
}

const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const SERVER_NAME: u16 = 0;
const HOST_NAME: u8 = 0;

/// Reads the server name from `bytes`, the start of what a client sent.
pub fn client_hello_sni(bytes: &[u8]) -> Sni {
    // The handshake message, gathered from the records that carry it.
    let mut message = Vec::new();
    let mut rest = bytes;
    loop {
        if rest.len() < 5 {
            return incomplete(bytes);
        }
        if rest[0] != HANDSHAKE || rest[1] != 3 {
            return Sni::NotTls;
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > 1 << 14 {
            return Sni::NotTls;
        }
        let Some(fragment) = rest.get(5..5 + len) else {
            // Part of a record: enough, perhaps, to refuse what it
            // declares before waiting for it.
            message.extend_from_slice(&rest[5..]);
            return match declared(&message) {
                Some(Err(())) => Sni::NotTls,
                _ => incomplete(bytes),
            };
        };
        message.extend_from_slice(fragment);
        rest = &rest[5 + len..];
        match declared(&message) {
            Some(Err(())) => return Sni::NotTls,
            Some(Ok(body)) if message.len() >= body + 4 => {
                return parse_client_hello(&message[4..body + 4])
            }
            _ => {}
        }
    }
}

/// The ClientHello body's declared length, once the handshake header is
/// in: `Err` for another message or one larger than [`MAX_CLIENT_HELLO`].
fn declared(message: &[u8]) -> Option<Result<usize, ()>> {
    let header = message.get(..4)?;
    let body = u32::from_be_bytes([0, header[1], header[2], header[3]]) as usize;
    Some(
        if header[0] != CLIENT_HELLO || body + 4 > MAX_CLIENT_HELLO {
            Err(())
        } else {
            Ok(body)
        },
    )
}

fn incomplete(bytes: &[u8]) -> Sni {
    if bytes.len() >= MAX_CLIENT_HELLO {
        Sni::NotTls
    } else {
        Sni::Incomplete
    }
}

/// A cursor over a message that fails (with `None`) instead of reading
/// past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n.into())
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n.into())
    }
}

fn parse_client_hello(body: &[u8]) -> Sni {
    let parsed = (|| {
        let mut r = Reader(body);
        r.take(2 + 32)?; // legacy_version, random
        r.vec8()?; // legacy_session_id
        r.vec16()?; // cipher_suites
        r.vec8()?; // legacy_compression_methods
        if r.0.is_empty() {
            return Some(Sni::Missing);
        }
        let mut extensions = Reader(r.vec16()?);
        while !extensions.0.is_empty() {
            let kind = extensions.u16()?;
            let data = extensions.vec16()?;
            if kind != SERVER_NAME {
                continue;
            }
            let mut list = Reader(Reader(data).vec16()?);
            while !list.0.is_empty() {
                let name_type = list.u8()?;
                let name = list.vec16()?;
                if name_type == HOST_NAME {
                    let name = std::str::from_utf8(name).ok()?;
                    return Some(Sni::Name(name.to_string()));
                }
            }
            return Some(Sni::Missing);
        }
        Some(Sni::Missing)
    })();
    parsed.unwrap_or(Sni::NotTls)
}
