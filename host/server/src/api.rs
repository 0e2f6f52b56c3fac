//! The wire types of API v1: request bodies, replies and the
//! newline-delimited JSON events of streamed output. Their JSON Schemas
//! are the OpenAPI document's `components/schemas`.
//!
//! Bytes that may not be UTF-8 (a command's output, stdin) travel as
//! standard base64 in fields named `data`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API version this server speaks (the `/v1/` of every path).
pub const API_VERSION: u32 = 1;

/// `GET /v1/version`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Version {
    /// The API version (the path prefix's number).
    pub api: u32,
    /// The server's Berth version.
    pub berth: String,
    /// The server's process id.
    pub pid: u32,
    /// A digest of the server's `BERTH_*` and `DOCKER_*` environment (see
    /// [`crate::environment_fingerprint`]): a CLI whose own differs runs
    /// its command in-process rather than under settings it did not give.
    pub environment: String,
    /// Which build serves (see [`crate::build_identity`]).
    pub build: String,
}

/// Every error reply: an HTTP status and this body.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorReply {
    /// What failed.
    pub error: ErrorDetail,
}

/// What failed, for programs (`code`) and people (`message`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorDetail {
    /// A stable machine-readable code: `not_found`, `invalid_name`,
    /// `exists`, `bad_request`, `unauthorized`, `path_refused`,
    /// `file_not_found`, `process_not_found`, `process_running`,
    /// `lineage_mismatch`, `not_started`, `too_large`, `unsupported`,
    /// `generation_not_kept`, `backend`, `internal`.
    pub code: String,
    /// The whole cause chain, outermost first, joined by `: `.
    pub message: String,
}

/// One row of `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SandboxSummary {
    /// Its name.
    pub name: String,
    /// The backend kind (`local`, `docker`, …).
    pub backend: String,
    /// The snapshot kind.
    pub snapshot: String,
    /// The snapshot id.
    pub snapshot_id: String,
    /// Whether the workspace is in place (started and not shut down).
    pub ready: bool,
    /// Where it runs, as its backend says (an engine, a directory).
    pub location: Option<String>,
}

/// `POST /v1/sandboxes`: what to create. The backend's settings are the
/// kind's own (`GET /v1/backends` lists them): in `backend` as an object
/// (`{"type": "docker", "image": "alpine"}`), or beside the other fields
/// (`"backend": "docker", "image": "alpine"`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct CreateSandbox {
    /// Its name (the snapshot id grammar: letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// The backend: a kind's name (`local`, `docker`, `swarm`, or one the
    /// server's program registered), or an object with the kind under
    /// `type` and its settings beside it. By default, `local`.
    #[serde(default)]
    pub backend: Option<BackendChoice>,
    /// The workspace manifest (the `berth create --workspace` file's
    /// JSON). By default, an empty workspace.
    #[serde(default)]
    pub workspace: Option<serde_json::Value>,
    /// The snapshot: `noop`, `local`, `local:DIR`, `plugin:MANIFEST`,
    /// `remote:MANIFEST` (paths absolute, on the server's host). By
    /// default, `local`.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Compress snapshots with zstd. By default, no.
    #[serde(default)]
    pub compress: bool,
    /// Store incremental, deduplicated generations, keeping this many
    /// (a `remote:MANIFEST` snapshot only). By default, whole archives.
    #[serde(default)]
    pub dedup_keep: Option<u32>,
    /// Write a generation after every command (`berth create --checkpoint
    /// each-exec`): a history to diff and rewind through. Implies
    /// deduplicated generations, 50 kept unless `dedup_keep` says. By
    /// default, no.
    #[serde(default)]
    pub checkpoint_each_exec: bool,
    /// Start it after creating. By default, yes.
    #[serde(default)]
    pub start: Option<bool>,
    /// Hold it to an egress policy (default deny, enforced on the host).
    /// By default, none: the backend's network settings alone.
    #[serde(default)]
    pub egress: Option<crate::api_egress::CreateEgress>,
    /// Claim it from this warm pool (`POST /v1/pools`): a started member
    /// is handed over at once, with `workspace` applied (no bind mounts,
    /// the default root); an empty pool, or a workspace a member cannot
    /// take, creates it cold from the pool's template instead (the reply's
    /// `claimed` says which). The template decides everything else: give
    /// only `name` and `workspace`.
    #[serde(default)]
    pub from_pool: Option<String>,
    /// The backend kind's settings, given beside the fields above
    /// (`image`, `memory`, ...; see `GET /v1/backends`). A key the kind
    /// does not take is refused.
    #[serde(flatten)]
    pub settings: serde_json::Map<String, serde_json::Value>,
}

/// A backend: a kind's name, or its settings with the kind under `type`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum BackendChoice {
    /// A kind's name; its settings, if any, beside the request's fields.
    Kind(String),
    /// `{"type": KIND, KEY: VALUE, ...}`.
    Settings(serde_json::Map<String, serde_json::Value>),
}

/// `GET /v1/backends`: a backend kind the server can create, and what it
/// takes.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BackendKind {
    /// The kind (`type`).
    pub kind: String,
    /// The settings a create may give it.
    pub settings: Vec<BackendSetting>,
}

/// `GET /v1/defaults`: the bounds a new sandbox gets where its settings
/// say nothing, as the server's `$BERTH_HOME/config.toml` sets them (over
/// Berth's own).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HostDefaults {
    /// The file read (whether or not it exists).
    pub file: String,
    /// Whether it exists.
    pub file_exists: bool,
    /// Each bound: `memory`, `pids`, `cpus`, `disk`.
    pub defaults: Vec<HostDefault>,
}

/// One default bound.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HostDefault {
    /// The key (in `config.toml` and in every kind's settings).
    pub key: String,
    /// Its value as written there (`2GiB`, `1024`, `1.5`, `unlimited`).
    pub value: String,
    /// Whether `config.toml` set it (else Berth's own).
    pub from_file: bool,
    /// What it bounds.
    pub help: String,
}

/// One setting of a backend kind.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BackendSetting {
    /// The key.
    pub key: String,
    /// What its value looks like (`SIZE`, `PATH`, `BOOL`,
    /// `missing|always|never`); sizes and durations may be numbers (bytes,
    /// seconds) or text (`2GiB`, `30s`).
    pub value: String,
    /// Whether a create must give it.
    pub required: bool,
    /// What it does, with its default.
    pub help: String,
    /// Other names it is accepted under.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
}

/// A named sandbox's record: what `berth inspect` prints under `state`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SandboxRecord {
    /// Its name.
    pub name: String,
    /// Whether snapshots are compressed.
    pub compression: bool,
    /// Whether the container is paused while stop reads the workspace.
    pub freeze: bool,
    /// Whether every command is followed by a checkpoint.
    #[serde(default)]
    pub checkpoint_each_exec: bool,
    /// The lifecycle state (the library's `SandboxState` JSON).
    pub state: serde_json::Value,
    /// Where it came from, in the reply of a create that named
    /// `from_pool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed: Option<Claimed>,
}

/// `POST /v1/sandboxes/{name}/start`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Started {
    /// What start did, for people.
    pub branch: String,
    /// What start did, for programs: `reused` (the workspace was in
    /// place), `attached` (already running), `restored` (brought back from
    /// the snapshot) or `fresh` (set up from the manifest: nothing to
    /// restore).
    pub kind: String,
    /// Background processes that did not come back (their instance was
    /// re-created).
    pub lost_background: Vec<LostProcess>,
    /// The record after starting.
    pub sandbox: SandboxRecord,
}

/// A background process that did not survive a re-created instance.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct LostProcess {
    /// Its id.
    pub id: String,
    /// Its command.
    pub command: String,
}

/// `POST /v1/sandboxes/{name}/fork`: a new sandbox whose workspace starts
/// from one of this one's kept generations (deduplicated snapshots).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// The new sandbox's name.
    pub name: String,
    /// The generation to start from. By default, the newest.
    #[serde(default)]
    pub generation: Option<u64>,
    /// Start it after forking. By default, yes.
    #[serde(default)]
    pub start: Option<bool>,
}

/// `POST /v1/sandboxes/{name}/exec`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// The command line, run by `sh -c` in the workspace root. Give this
    /// or `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// The program and its arguments, run in the workspace root with no
    /// shell: found on `PATH`, no word expanded, no shell builtin in a
    /// program's place; one that cannot be started exits 127 (not found)
    /// or 126. Give this or `command`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// The timeout in milliseconds. By default, 600 000 (10 minutes).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Extra environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Stream the output as newline-delimited JSON events
    /// ([`ExecLine`]), uncapped, instead of collecting it. By default, no:
    /// the reply is one [`ExecOutcome`].
    #[serde(default)]
    pub stream: bool,
    /// Bytes given to the command's stdin, base64 (then stdin is closed).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Keep stdin open for `POST /v1/execs/{id}/stdin` (needs `stream`):
    /// the first event is `started` with the exec's id.
    #[serde(default)]
    pub interactive: bool,
    /// Run on a terminal of this size (needs `stream`).
    #[serde(default)]
    pub pty: Option<TerminalSize>,
    /// Collected output: bytes of stdout kept (its start and its end). By
    /// default, the library's cap.
    #[serde(default)]
    pub stdout_cap: Option<u64>,
    /// Collected output: bytes of stderr kept. By default, the library's
    /// cap.
    #[serde(default)]
    pub stderr_cap: Option<u64>,
    /// Write a generation of the workspace when the command ends, before
    /// the result (or the `exit` line) is sent. By default, what the
    /// sandbox was created with (`checkpoint: "each-exec"`).
    #[serde(default)]
    pub checkpoint: Option<bool>,
    /// How a stream's events come (with `stream`). By default
    /// `json-lines`: one [`ExecLine`] per line, output base64. `binary`
    /// (`application/vnd.berth.exec-frames`) is for bulk output: each event
    /// is a frame of one kind byte (`1` stdout, `2` stderr: the raw
    /// bytes; `0`: any other [`ExecLine`] as JSON — `started`, `exit`,
    /// `error`), a 4-byte big-endian length, then that many bytes.
    #[serde(default)]
    pub framing: Framing,
}

/// How a streamed exec's events are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Framing {
    /// Newline-delimited JSON ([`ExecLine`]), output base64.
    #[default]
    JsonLines,
    /// Binary frames: kind byte, 4-byte big-endian length, payload.
    Binary,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub struct TerminalSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// A collected command's result (the library's `ExecResult` JSON).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ExecOutcome {
    /// Exit code; 124 on timeout; 128+N when killed by signal N.
    pub exit_code: i32,
    /// The signal that ended it.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Kept stdout as text (invalid UTF-8 replaced).
    pub stdout: String,
    /// Kept stdout, base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_base64: Option<String>,
    /// Kept stderr as text (invalid UTF-8 replaced).
    pub stderr: String,
    /// Kept stderr, base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_base64: Option<String>,
    /// Whether the caps dropped output.
    pub truncated: bool,
    /// Bytes of stdout dropped between the kept start and end.
    pub stdout_dropped: u64,
    /// Bytes of stderr dropped.
    pub stderr_dropped: u64,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// Notes for people (a timeout, the out-of-memory killer).
    #[serde(default)]
    pub notes: Vec<String>,
    /// The checkpoint taken after it, when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpointed>,
}

/// One line of a streamed exec (or of followed logs).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecLine {
    /// The command started (interactive execs): its id for
    /// `/v1/execs/{id}/…`.
    Started {
        /// The exec's id.
        exec_id: String,
    },
    /// Output on stdout.
    Stdout {
        /// The bytes, base64.
        data: String,
    },
    /// Output on stderr.
    Stderr {
        /// The bytes, base64.
        data: String,
    },
    /// The end: always the last line of a command that ran.
    Exit {
        /// Exit code; 124 on timeout; 128+N when killed by signal N.
        exit_code: i32,
        /// The signal that ended it.
        signal: Option<i32>,
        /// Whether the timeout killed it.
        timed_out: bool,
        /// Wall time in milliseconds.
        duration_ms: u64,
        /// Notes for people.
        notes: Vec<String>,
        /// The checkpoint taken after it, when one was.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint: Option<Checkpointed>,
    },
    /// The stream failed after it began (the reply's status was already
    /// sent): the last line.
    Error {
        /// What failed.
        error: ErrorDetail,
    },
}

/// `POST /v1/execs/{id}/resize`.
pub type ResizeBody = TerminalSize;

/// `POST /v1/execs/{id}/signal`, `POST …/processes/{id}/kill`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SignalBody {
    /// A signal name (`TERM`, `KILL`, `INT`, `HUP`, …) or number. By
    /// default, `TERM`.
    #[serde(default)]
    pub signal: Option<String>,
}

/// `POST /v1/sandboxes/{name}/processes`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DetachBody {
    /// The command, run by `sh -c` in the background.
    pub command: String,
    /// Its id (letters, digits, `-`, `_`, `.`). By default, one is made up.
    #[serde(default)]
    pub name: Option<String>,
    /// Bytes of each stream's newest output kept. By default, 1 MiB.
    #[serde(default)]
    pub log_ring: Option<u64>,
}

/// A background process.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Process {
    /// Its id.
    pub id: String,
    /// Its command.
    pub command: String,
    /// `running`, `exited` or `lost`.
    pub state: String,
    /// When it started, ms since the Unix epoch (the sandbox's clock).
    pub started_ms: u64,
    /// Its exit code, once exited.
    pub exit_code: Option<i32>,
    /// Its process group in the sandbox.
    pub pid: Option<i64>,
}

/// `POST …/processes/{id}/wait`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Waited {
    /// The exit code.
    pub exit_code: i32,
}

/// A path in a workspace (the library's `FileInfo` JSON).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FileEntry {
    /// Relative to the workspace root (empty for the root).
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// A symlink's target.
    #[serde(default)]
    pub target: Option<String>,
}

/// `PUT …/files/content`, `PUT …/archive`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Written {
    /// Bytes written.
    pub bytes: u64,
    /// Entries extracted (archives).
    #[serde(default)]
    pub entries: Option<u64>,
}

/// A published port.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Port {
    /// The sandbox's port (`8080/tcp`).
    pub port: String,
    /// Where it is reached on the server's host (`127.0.0.1:32768`).
    pub address: String,
}

/// A reply with nothing to say.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Done {
    /// Always true.
    pub ok: bool,
}

/// A checkpoint taken: `POST …/checkpoint`, and `checkpoint` in an exec's
/// result when the sandbox checkpoints every command.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Checkpointed {
    /// The generation written; none when the checkpoint failed.
    pub generation: Option<u64>,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// Why it failed (the command's own result stands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// In a create's reply, when it named `from_pool`: where the sandbox came
/// from.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Claimed {
    /// The pool.
    pub pool: String,
    /// Whether a warm member was handed over (`false`: created cold from
    /// the pool's template, for `reason`).
    pub warm: bool,
    /// Why it was created cold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
