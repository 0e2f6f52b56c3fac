/** A sandbox on the server: its lifecycle, commands, processes, files and generations. */

import type { Writable } from "node:stream";
import { Readable } from "node:stream";

import type { Berth } from "./client";
import { Body, fileStreamLength, readAll } from "./io";
import { NotFound } from "./errors";
import {
  API,
  Diff,
  EgressReport,
  EgressRules,
  ExecEvent,
  ExecResult,
  FileEntry,
  History,
  Process,
  SandboxRecord,
  Started,
  parseResult,
} from "./types";

/** What `exec` and `execStream` take besides the command. */
export interface ExecOptions {
  /** Kills the command after this many milliseconds (default 600 000); `timed_out` says so. */
  timeoutMs?: number;
  /** Environment variables for the command. */
  env?: Record<string, string>;
  /** Bytes on the command's stdin (then its end). */
  stdin?: Buffer | Uint8Array | string;
  /**
   * Write a generation when it ends (by default, when the sandbox was
   * created with `checkpointEachExec`); the result's `checkpoint` says which.
   */
  checkpoint?: boolean;
  /** Aborts the request, which stops the command. */
  signal?: AbortSignal;
}

/** What `exec` takes besides the command. */
export interface CollectOptions extends ExecOptions {
  /** The most of stdout kept (its start and end); the server's default otherwise. */
  stdoutCap?: number;
  /** The most of stderr kept. */
  stderrCap?: number;
}

/** What `execStream` takes besides the command. */
export interface StreamOptions extends ExecOptions {
  /** The first event is `started`, whose `exec_id` takes {@link Sandbox.sendStdin}. */
  interactive?: boolean;
  /** Runs it on a terminal of this size. */
  pty?: { rows: number; cols: number };
}

/** One sandbox on the server. */
export class Sandbox {
  /** The sandbox's file API. */
  readonly files: Files;
  /** The path of its resource, `/v1/sandboxes/NAME`. */
  readonly path: string;

  constructor(
    /** The connection it is reached through. */
    readonly client: Berth,
    /** Its name. */
    readonly name: string,
  ) {
    this.path = `${API}/sandboxes/${encodeURIComponent(name)}`;
    this.files = new Files(this);
  }

  // lifecycle

  /** Its record: `name`, `compression`, `freeze`, `checkpoint_each_exec`, `state`. */
  inspect(): Promise<SandboxRecord> {
    return this.client.json("GET", this.path);
  }

  /** Starts it: `branch` says whether it reused, restored or initialised the workspace. */
  start(): Promise<Started> {
    return this.client.json("POST", `${this.path}/start`);
  }

  /** Persists the workspace into its snapshot (destroys nothing). */
  stop(): Promise<SandboxRecord> {
    return this.client.json("POST", `${this.path}/stop`);
  }

  /** Destroys the running instance; the snapshot stays. */
  shutdown(): Promise<SandboxRecord> {
    return this.client.json("POST", `${this.path}/shutdown`);
  }

  /** Shuts it down, deletes the snapshots Berth made (unless `keepSnapshot`) and forgets it. */
  async remove(options: { keepSnapshot?: boolean; force?: boolean } = {}): Promise<void> {
    await this.client.json("DELETE", this.path, {
      query: { keep_snapshot: options.keepSnapshot ?? false, force: options.force ?? false },
    });
  }

  /**
   * A new sandbox `name` starting from one of this one's kept generations
   * (the newest by default; deduplicated snapshots only).
   */
  async fork(name: string, options: { generation?: number; start?: boolean } = {}): Promise<Sandbox> {
    const body: Record<string, unknown> = { name, start: options.start ?? true };
    if (options.generation !== undefined) body.generation = options.generation;
    await this.client.json("POST", `${this.path}/fork`, { json: body });
    return new Sandbox(this.client, name);
  }

  // generations (deduplicated snapshots)

  /**
   * The kept generations, oldest first: when, what wrote each (a command's
   * checkpoint, a named checkpoint, a rewind, a stop) and what it changed.
   */
  history(): Promise<History> {
    return this.client.json("GET", `${this.path}/history`);
  }

  /** The paths generation `from` and generation `to` differ by, read from their indexes. */
  diff(from: number, to: number): Promise<Diff> {
    return this.client.json("GET", `${this.path}/diff`, { query: { from, to } });
  }

  /** Writes a generation of the running workspace now (it keeps running); its number. */
  async checkpoint(message?: string): Promise<number> {
    const reply = await this.client.json<{ generation: number }>("POST", `${this.path}/checkpoint`, {
      json: { message: message ?? null },
    });
    return reply.generation;
  }

  /**
   * Makes the workspace `generation`. The workspace as it was is saved
   * first as a new generation, whose number is returned (rewind to it to
   * undo this). Background processes do not survive a rewind.
   */
  async rewind(generation: number): Promise<number> {
    const reply = await this.client.json<{ saved_as: number }>("POST", `${this.path}/rewind`, {
      json: { generation },
    });
    return reply.saved_as;
  }

  // egress

  /** The egress policy and the log of connections. */
  egress(): Promise<EgressReport> {
    return this.client.json("GET", `${this.path}/egress`);
  }

  /** Replaces the egress policy (from the next connection); returns what `egress()` does. */
  setEgress(rules: { allowHosts?: string[]; denyHosts?: string[]; allowCidrs?: string[] }): Promise<EgressReport> {
    const body: EgressRules = {
      allow_hosts: rules.allowHosts ?? [],
      deny_hosts: rules.denyHosts ?? [],
      allow_cidrs: rules.allowCidrs ?? [],
    };
    return this.client.json("PUT", `${this.path}/egress`, { json: body });
  }

  /** Published ports and where they are reached. */
  ports(): Promise<{ port: string; address: string }[]> {
    return this.client.json("GET", `${this.path}/ports`);
  }

  // commands

  /**
   * Runs `command` in the workspace and collects its output (each stream
   * capped; its start and end kept). A string is a command line for
   * `sh -c`; an array is the program and its arguments, run with no shell
   * (nothing expanded, no builtin in a program's place; one that cannot be
   * started exits 127 or 126).
   */
  async exec(command: Command, options: CollectOptions = {}): Promise<ExecResult> {
    const body = execBody(command, options);
    if (options.stdoutCap !== undefined) body.stdout_cap = options.stdoutCap;
    if (options.stderrCap !== undefined) body.stderr_cap = options.stderrCap;
    const reply = await this.client.json<Record<string, unknown>>("POST", `${this.path}/exec`, {
      json: body,
      signal: options.signal,
    });
    return parseResult(reply);
  }

  /**
   * Runs `command` (a command line, or the program and its arguments, as
   * for {@link exec}) and yields its output as it is produced, uncapped,
   * then its `exit` event. Leaving the loop early stops the command.
   */
  execStream(command: Command, options: StreamOptions = {}): AsyncGenerator<ExecEvent, void, undefined> {
    const body = execBody(command, options);
    body.stream = true;
    body.interactive = options.interactive ?? false;
    body.framing = "binary";
    if (options.pty !== undefined) body.pty = options.pty;
    return this.client.frames("POST", `${this.path}/exec`, { json: body, signal: options.signal });
  }

  /** Sends bytes to an interactive exec's stdin; closes stdin after unless `close` is false. The bytes sent. */
  async sendStdin(execId: string, data: Body, options: { close?: boolean; length?: number } = {}): Promise<number> {
    const reply = await this.client.json<{ bytes: number }>("POST", `${API}/execs/${encodeURIComponent(execId)}/stdin`, {
      query: { keep_open: !(options.close ?? true) },
      body: data,
      length: options.length,
    });
    return reply.bytes;
  }

  /** Resizes an interactive exec's terminal. */
  async resize(execId: string, rows: number, cols: number): Promise<void> {
    await this.client.json("POST", `${API}/execs/${encodeURIComponent(execId)}/resize`, { json: { rows, cols } });
  }

  /** Sends an interactive exec's command a signal (`TERM` by default). */
  async signal(execId: string, signal = "TERM"): Promise<void> {
    await this.client.json("POST", `${API}/execs/${encodeURIComponent(execId)}/signal`, { json: { signal } });
  }

  // background processes

  /** Starts `command` in the background and returns at once. */
  detach(command: string, options: { name?: string; logRing?: number } = {}): Promise<Process> {
    const body: Record<string, unknown> = { command };
    if (options.name !== undefined) body.name = options.name;
    if (options.logRing !== undefined) body.log_ring = options.logRing;
    return this.client.json("POST", `${this.path}/processes`, { json: body });
  }

  /** Its background processes. */
  processes(): Promise<Process[]> {
    return this.client.json("GET", `${this.path}/processes`);
  }

  /** One background process. */
  process(id: string): Promise<Process> {
    return this.client.json("GET", this.processPath(id));
  }

  /** What a background process's log ring keeps, as events; with `follow`, until it exits. */
  logs(id: string, options: { follow?: boolean; tail?: number } = {}): AsyncGenerator<ExecEvent, void, undefined> {
    return this.client.frames("GET", `${this.processPath(id)}/logs`, {
      query: { follow: options.follow ?? false, tail: options.tail, framing: "binary" },
    });
  }

  /** Sends a background process a signal (`TERM` by default). */
  async kill(id: string, signal = "TERM"): Promise<void> {
    await this.client.json("POST", `${this.processPath(id)}/kill`, { json: { signal } });
  }

  /** Waits for a background process to exit; its exit code. */
  async wait(id: string): Promise<number> {
    const reply = await this.client.json<{ exit_code: number }>("POST", `${this.processPath(id)}/wait`);
    return reply.exit_code;
  }

  private processPath(id: string): string {
    return `${this.path}/processes/${encodeURIComponent(id)}`;
  }

  // the workspace as a tar stream

  /** The workspace as a tar stream (destroy it to stop early). */
  async persistStream(): Promise<Readable> {
    return this.client.request("GET", `${this.path}/archive`);
  }

  /** Writes the workspace as a tar stream to `out`; the bytes written. */
  async persist(out: Writable): Promise<number> {
    const response = await this.persistStream();
    let written = 0;
    try {
      for await (const chunk of response as AsyncIterable<Buffer>) {
        written += chunk.length;
        if (!out.write(chunk)) await new Promise((resolve) => out.once("drain", resolve));
      }
    } finally {
      response.destroy();
    }
    return written;
  }

  /** Extracts a tar stream into the workspace once all of it passed the hydrate policy. */
  hydrate(archive: Body, length?: number): Promise<{ bytes: number; entries?: number | null }> {
    return this.client.json("PUT", `${this.path}/archive`, {
      body: archive,
      length: length ?? fileStreamLength(archive),
      contentType: "application/x-tar",
    });
  }
}

/** A command line for `sh -c`, or the program and its arguments (no shell). */
export type Command = string | readonly string[];

function execBody(command: Command, options: ExecOptions): Record<string, unknown> {
  if (typeof command !== "string" && command.length === 0) {
    throw new TypeError("command: argv must name at least the program to run");
  }
  const body: Record<string, unknown> = {
    ...(typeof command === "string" ? { command } : { argv: [...command] }),
    timeout_ms: options.timeoutMs ?? 600_000,
    env: options.env ?? {},
  };
  if (options.checkpoint !== undefined) body.checkpoint = options.checkpoint;
  if (options.stdin !== undefined) body.stdin = Buffer.from(options.stdin).toString("base64");
  return body;
}

/**
 * A sandbox's files, every path relative to its workspace root (a path
 * that leaves it is refused with {@link PathRefused}).
 */
export class Files {
  private readonly path: string;

  constructor(private readonly sandbox: Sandbox) {
    this.path = `${sandbox.path}/files`;
  }

  /** A whole file. */
  async read(path: string): Promise<Buffer> {
    return readAll(await this.readStream(path));
  }

  /** A file's bytes, streamed (destroy it to stop early). */
  async readStream(path: string): Promise<Readable> {
    return this.sandbox.client.request("GET", `${this.path}/content`, { query: { path } });
  }

  /**
   * Writes a file atomically (it appears whole or not at all). A stream
   * needs `length` unless it is a real file's (`fs.createReadStream`).
   * The bytes written.
   */
  async write(path: string, data: Body, options: { mode?: number; length?: number } = {}): Promise<number> {
    let length = options.length;
    if (length === undefined && (data instanceof Readable || isAsyncIterable(data))) {
      length = fileStreamLength(data);
      if (length === undefined) {
        throw new TypeError("Files.write: a stream needs `length` (the server writes a file whose size it knows)");
      }
    }
    const reply = await this.sandbox.client.json<{ bytes: number }>("PUT", `${this.path}/content`, {
      query: { path, mode: options.mode === undefined ? undefined : options.mode.toString(8) },
      body: data,
      length,
    });
    return reply.bytes;
  }

  /** Describes a path (symlinks not followed). */
  stat(path: string): Promise<FileEntry> {
    return this.sandbox.client.json("GET", `${this.path}/stat`, { query: { path } });
  }

  /** Whether a path exists. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (err) {
      if (err instanceof NotFound) return false;
      throw err;
    }
  }

  /** A directory's entries. */
  list(path = ""): Promise<FileEntry[]> {
    return this.sandbox.client.json("GET", `${this.path}/list`, { query: { path } });
  }

  /** Removes a path (a directory and everything in it with `recursive`). */
  async remove(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.sandbox.client.json("DELETE", this.path, { query: { path, recursive: options.recursive ?? false } });
  }

  /** Makes a directory (and missing parents with `parents`). */
  async mkdir(path: string, options: { parents?: boolean } = {}): Promise<void> {
    await this.sandbox.client.json("POST", `${this.path}/mkdir`, { query: { path, parents: options.parents ?? false } });
  }
}

function isAsyncIterable(x: unknown): x is AsyncIterable<Uint8Array> {
  return typeof x === "object" && x !== null && Symbol.asyncIterator in x && !(x instanceof Uint8Array);
}
