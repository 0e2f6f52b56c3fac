//! The egress daemon's control protocol: one JSON request per line on its
//! control socket (mode 0600, the host user's only), one JSON reply line,
//! then the daemon closes the connection.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::log::Connection;
use crate::policy::EgressPolicy;

/// The most bytes a request or reply line may hold (a policy of a few
/// thousand rules, a log of [`crate::DEFAULT_LOG_ENTRIES`] connections).
pub const MAX_CONTROL_LINE: usize = 4 << 20;
/// How long a control call may take, end to end.
pub const CONTROL_DEADLINE: Duration = Duration::from_secs(10);

/// What the host asks of a running egress daemon.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ControlRequest {
    /// The policy in force and the connection log.
    Status,
    /// Replace the policy; it counts from the next connection, and the
    /// daemon keeps it (in its directory) across its own restart.
    SetPolicy {
        /// The new policy.
        policy: EgressPolicy,
    },
    /// Stop serving and exit.
    Shutdown,
}

/// A running egress daemon's account of itself.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EgressStatus {
    /// The policy in force.
    pub policy: EgressPolicy,
    /// The newest connections, oldest first.
    pub connections: Vec<Connection>,
    /// How many older connections the bounded log dropped.
    pub dropped: u64,
    /// Connections open now.
    pub open: u64,
    /// The daemon's process id.
    pub pid: u32,
    /// The daemon's resident memory, in bytes (0 where unknown).
    pub rss_bytes: u64,
}

/// A daemon's reply.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ControlReply {
    /// The answer to [`ControlRequest::Status`].
    Status(Box<EgressStatus>),
    /// The request was carried out.
    Done,
    /// The request was refused, and why.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// A control call that did not get a reply.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The daemon's socket could not be reached (no daemon runs there).
    #[error("no egress daemon answers at {socket}: {source}")]
    Unreachable {
        /// The control socket.
        socket: String,
        /// The connection error.
        #[source]
        source: std::io::Error,
    },
    /// The daemon did not answer in time, or answered badly.
    #[error("the egress daemon at {socket} did not answer: {why}")]
    NoAnswer {
        /// The control socket.
        socket: String,
        /// What happened instead.
        why: String,
    },
    /// The daemon refused the request.
    #[error("the egress daemon refused: {0}")]
    Refused(String),
}

/// Sends `request` to the daemon at `socket` and returns its reply
/// ([`ControlReply::Error`] becomes [`ControlError::Refused`]).
pub async fn call(socket: &Path, request: &ControlRequest) -> Result<ControlReply, ControlError> {
    let name = socket.display().to_string();
    let no_answer = |why: String| ControlError::NoAnswer {
        socket: name.clone(),
        why,
    };
    let mut stream =
        UnixStream::connect(socket)
            .await
            .map_err(|source| ControlError::Unreachable {
                socket: name.clone(),
                source,
            })?;
    let exchange = async {
        let mut line = serde_json::to_vec(request).map_err(|e| no_answer(e.to_string()))?;
        line.push(b'\n');
        stream
            .write_all(&line)
            .await
            .map_err(|e| no_answer(e.to_string()))?;
        let reply = read_line(&mut stream)
            .await
            .map_err(|e| no_answer(e.to_string()))?;
        serde_json::from_slice::<ControlReply>(&reply).map_err(|e| no_answer(e.to_string()))
    };
    let reply = tokio::time::timeout(CONTROL_DEADLINE, exchange)
        .await
        .map_err(|_| no_answer(format!("no reply in {CONTROL_DEADLINE:?}")))??;
    match reply {
        ControlReply::Error { message } => Err(ControlError::Refused(message)),
        reply => Ok(reply),
    }
}

/// Reads one line of at most [`MAX_CONTROL_LINE`] bytes (without its
/// newline); a longer line is an error, not a truncation.
pub(crate) async fn read_line<S>(stream: &mut S) -> std::io::Result<Vec<u8>>
where
    S: tokio::io::AsyncRead + Unpin,
{
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(line);
        }
        if let Some(end) = available.iter().position(|b| *b == b'\n') {
            line.extend_from_slice(&available[..end]);
            return Ok(line);
        }
        let n = available.len();
        line.extend_from_slice(available);
        reader.consume(n);
        if line.len() > MAX_CONTROL_LINE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a control line longer than {MAX_CONTROL_LINE} bytes"),
            ));
        }
    }
}
