/**
 * What the API's replies become. Field names are the API's own (as in
 * `GET /v1/openapi.json`), so a reply reads the same here, in Python and
 * on the wire.
 */

import { BerthError } from "./errors";

/** The API's path prefix. */
export const API = "/v1";

/** An error the server reported inside a reply. */
export interface ErrorDetail {
  /** Stable code. */
  code: string;
  /** For people. */
  message: string;
}

/**
 * A checkpoint: the `generation` it wrote (`null` when it failed; `error`
 * then says why, and the command's own result stands) and how long it
 * took.
 */
export interface Checkpointed {
  generation: number | null;
  duration_ms: number;
  error?: ErrorDetail | null;
}

/** A command's collected result (each stream capped; its start and end kept). */
export interface ExecResult {
  /** Exit code; 124 on timeout; 128+N when killed by signal N. */
  exit_code: number;
  /** The signal that ended it. */
  signal: number | null;
  /** Stdout as text (invalid UTF-8 replaced). */
  stdout: string;
  /** Stderr as text (invalid UTF-8 replaced). */
  stderr: string;
  /** Stdout's bytes, exactly. */
  stdout_bytes: Buffer;
  /** Stderr's bytes, exactly. */
  stderr_bytes: Buffer;
  /** Whether the caps dropped output. */
  truncated: boolean;
  /** Bytes of stdout dropped between the kept start and end. */
  stdout_dropped: number;
  /** Bytes of stderr dropped. */
  stderr_dropped: number;
  /** Whether the timeout killed it. */
  timed_out: boolean;
  /** Wall time in milliseconds. */
  duration_ms: number;
  /** Notes for people (a timeout, the out-of-memory killer). */
  notes: string[];
  /** The generation written after it, when the sandbox checkpoints every command (or `checkpoint: true` was given). */
  checkpoint: Checkpointed | null;
}

/** One event of a streamed command (or of a background process's logs). */
export type ExecEvent =
  /** An interactive exec started: its id takes `sendStdin`, `resize`, `signal`. */
  | { type: "started"; exec_id: string }
  /** Output, as it was produced. */
  | { type: "stdout" | "stderr"; data: Buffer }
  /** The end: always the last event of a command that ran. */
  | {
      type: "exit";
      exit_code: number;
      signal: number | null;
      timed_out: boolean;
      duration_ms: number;
      notes: string[];
      checkpoint: Checkpointed | null;
    };

/** A background process. */
export interface Process {
  id: string;
  command: string;
  /** `running` or `exited`. */
  state: string;
  started_ms: number;
  exit_code: number | null;
  pid: number | null;
}

/** A path in a workspace. */
export interface FileEntry {
  path: string;
  /** `file`, `dir`, `symlink` or `other`. */
  type: string;
  size: number;
  mode: number;
  /** Seconds since the epoch. */
  mtime: number;
  /** A symlink's target. */
  target?: string | null;
}

/** A sandbox's record (`berth inspect`). */
export interface SandboxRecord {
  name: string;
  compression: boolean;
  freeze: boolean;
  checkpoint_each_exec: boolean;
  /** The backend's state (what resumes it), as saved. */
  state: Record<string, unknown>;
  /** In a claim's reply: where the sandbox came from. */
  claimed?: Claimed;
}

/** Where a claimed sandbox came from (`Berth.claim`). */
export interface Claimed {
  /** The pool. */
  pool: string;
  /** A warm member was handed over (`false`: created cold from the pool's template, for `reason`). */
  warm: boolean;
  /** Why it was created cold. */
  reason?: string;
}

/** A warm pool (`GET /v1/pools/NAME`). */
export interface Pool {
  name: string;
  /** How many started sandboxes it keeps. */
  size: number;
  /** Members open in the server, handed over at once by a claim. */
  ready: number;
  /** Members on record (ready, being opened, or being made). */
  members: number;
  /** Members being made now. */
  making: number;
  /** The template: `backend`, `snapshot`, ... */
  template: Record<string, unknown>;
}

/** One row of `GET /v1/sandboxes`. */
export interface SandboxSummary {
  name: string;
  backend: string;
  snapshot: string;
  snapshot_id: string;
  ready: boolean;
  location?: string | null;
}

/** What a start did. */
export interface Started {
  /** Whether it reused, restored or initialised the workspace. */
  branch: string;
  kind: string;
  lost_background: { id: string; command: string }[];
  sandbox: SandboxRecord;
}

/** What wrote a generation. */
export type Note =
  | { kind: "exec"; command: string; exit_code: number; started_ms: number; duration_ms: number }
  | { kind: "checkpoint"; message?: string }
  | { kind: "before-rewind"; to: number }
  | { kind: "other" };

/** One kept generation of a deduplicated snapshot. */
export interface Generation {
  number: number;
  index: string;
  digest: string;
  size: number;
  /** When it was written (Unix milliseconds). */
  created?: number | null;
  /** What wrote it; `null` for a stop. */
  note?: Note | null;
  /** The paths added, changed and removed since its parent. */
  changes?: { added: number; changed: number; removed: number } | null;
  stored_bytes?: number | null;
}

/** The kept generations, oldest first, and the one the workspace descends from. */
export interface History {
  generations: Generation[];
  current: number | null;
}

/** One path two generations differ by. */
export interface PathDiff {
  path: string;
  /** `added`, `removed` or `modified`. */
  change: string;
  /** For `modified`: which of `kind`, `mode`, `size`, `content`, `target` differ. */
  what: string[];
  kind: string;
}

/** The paths generation `from` and generation `to` differ by, sorted. */
export interface Diff {
  from: number;
  to: number;
  paths: PathDiff[];
}

/** An egress policy's rules. */
export interface EgressRules {
  allow_hosts: string[];
  deny_hosts: string[];
  allow_cidrs: string[];
}

/** One connection the egress point saw. */
export interface EgressConnection {
  at_ms: number;
  host: string;
  port: number;
  bytes_out: number;
  bytes_in: number;
  /** `allowed` or `denied`. */
  verdict: string;
  rule?: string | null;
  reason?: string | null;
  secrets: string[];
}

/** The egress policy and the log of connections. */
export interface EgressReport {
  policy: EgressRules;
  secrets: { name: string; hosts: string[]; placeholder: string }[];
  running: boolean;
  connections: EgressConnection[];
  dropped: number;
  open: number;
  rss_bytes: number;
}

/** A bound new sandboxes get where their settings say nothing. */
export interface HostDefault {
  key: string;
  value: string;
  from_file: boolean;
  help: string;
}

/** The server's defaults (`GET /v1/defaults`). */
export interface HostDefaults {
  file: string;
  file_exists: boolean;
  defaults: HostDefault[];
}

/** A backend kind the server creates, with its settings. */
export interface BackendKind {
  kind: string;
  settings: { key: string; value?: string | null; required: boolean; help: string }[];
}

const STDOUT = Buffer.from('{"type":"stdout","data":"');
const STDERR = Buffer.from('{"type":"stderr","data":"');
const END = Buffer.from('"}');

/** An event from one line of a stream (`line` without its newline). */
export function parseEvent(line: Buffer): ExecEvent {
  // Output lines as the server writes them, without a JSON parse (most of
  // a big stream's cost).
  if (line.length >= STDOUT.length + END.length && line.subarray(line.length - 2).equals(END)) {
    const head = line.subarray(0, STDOUT.length);
    if (head.equals(STDOUT)) {
      return { type: "stdout", data: decodeBase64(line.subarray(STDOUT.length, line.length - 2)) };
    }
    if (head.equals(STDERR)) {
      return { type: "stderr", data: decodeBase64(line.subarray(STDERR.length, line.length - 2)) };
    }
  }
  const d = JSON.parse(line.toString("utf8")) as Record<string, unknown>;
  switch (d.type) {
    case "stdout":
    case "stderr":
      return { type: d.type, data: Buffer.from(String(d.data), "base64") };
    case "started":
      return { type: "started", exec_id: String(d.exec_id) };
    case "exit":
      return {
        type: "exit",
        exit_code: Number(d.exit_code),
        signal: (d.signal as number | null | undefined) ?? null,
        timed_out: Boolean(d.timed_out),
        duration_ms: Number(d.duration_ms ?? 0),
        notes: (d.notes as string[] | undefined) ?? [],
        checkpoint: (d.checkpoint as Checkpointed | undefined) ?? null,
      };
    case "error": {
      const err = d.error as ErrorDetail;
      throw new BerthError(502, err.code, err.message);
    }
    default:
      throw new BerthError(502, "protocol", `unknown event type ${JSON.stringify(d.type)}`);
  }
}

function decodeBase64(ascii: Buffer): Buffer {
  return Buffer.from(ascii.toString("latin1"), "base64");
}

/** A collected result as the API sends it, with its bytes decoded. */
export function parseResult(d: Record<string, unknown>): ExecResult {
  const raw = (name: "stdout" | "stderr"): Buffer => {
    const b64 = d[`${name}_base64`];
    if (typeof b64 === "string") return Buffer.from(b64, "base64");
    return Buffer.from(String(d[name] ?? ""), "utf8");
  };
  const stdout = raw("stdout");
  const stderr = raw("stderr");
  return {
    exit_code: Number(d.exit_code),
    signal: (d.signal as number | null | undefined) ?? null,
    stdout: stdout.toString("utf8"),
    stderr: stderr.toString("utf8"),
    stdout_bytes: stdout,
    stderr_bytes: stderr,
    truncated: Boolean(d.truncated),
    stdout_dropped: Number(d.stdout_dropped ?? 0),
    stderr_dropped: Number(d.stderr_dropped ?? 0),
    timed_out: Boolean(d.timed_out),
    duration_ms: Number(d.duration_ms ?? 0),
    notes: (d.notes as string[] | undefined) ?? [],
    checkpoint: (d.checkpoint as Checkpointed | undefined) ?? null,
  };
}
