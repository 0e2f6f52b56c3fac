/** The connection to a server: requests, replies, streams. */

import * as http from "node:http";
import * as os from "node:os";
import * as path from "node:path";
import { Readable } from "node:stream";

import { BerthError, errorClass } from "./errors";
import { Body, readAll, readCapped } from "./io";
import { Sandbox } from "./sandbox";
import {
  API,
  BackendKind,
  Claimed,
  ExecEvent,
  HostDefaults,
  Pool,
  SandboxRecord,
  SandboxSummary,
  parseEvent,
} from "./types";

/**
 * `$BERTH_SOCKET`, else `$BERTH_HOME/berth.sock`, else the XDG data
 * directory's `berth/berth.sock` (as the `berth` CLI finds it).
 */
export function defaultSocket(): string {
  const env = process.env;
  if (env.BERTH_SOCKET) return env.BERTH_SOCKET;
  let home = env.BERTH_HOME;
  if (!home) {
    const data = env.XDG_DATA_HOME || path.join(os.homedir(), ".local", "share");
    home = path.join(data, "berth");
  }
  return path.join(home, "berth.sock");
}

/** How to reach a server. */
export interface BerthOptions {
  /** The server's unix socket (default: {@link defaultSocket}). */
  socketPath?: string;
  /** `http://127.0.0.1:PORT` for a server started with `--listen` (loopback TCP). */
  url?: string;
  /** The bearer token of a `--listen` server. */
  token?: string;
  /**
   * Bounds each socket's inactivity, in milliseconds (default: none, since
   * commands may run for long).
   */
  timeoutMs?: number;
}

/** What a request sends besides its method and path. */
export interface RequestOptions {
  /** Query parameters; `undefined` ones are left out, booleans sent as `true`/`false`. */
  query?: Record<string, string | number | boolean | undefined | null>;
  /** A JSON body. */
  json?: unknown;
  /** A raw body. */
  body?: Body;
  /** The raw body's length, where it is a stream (else it is sent chunked). */
  length?: number;
  /** The raw body's type (default `application/octet-stream`). */
  contentType?: string;
  /** Aborts the request (and, for a command, stops it). */
  signal?: AbortSignal;
}

/** The most of an error reply read. */
const ERROR_CAP = 64 * 1024;

/**
 * A connection to a Berth server.
 *
 * By default it uses the unix socket {@link defaultSocket} finds. Give
 * `{ url: "http://127.0.0.1:PORT", token }` for a server started with
 * `--listen`. Every request opens its own connection (over a unix socket
 * that costs little), so closing a stream early closes only it — which
 * is how a streamed command is stopped.
 */
export class Berth {
  private readonly socketPath?: string;
  private readonly host?: string;
  private readonly port?: number;
  private readonly token?: string;
  private readonly timeoutMs?: number;

  constructor(options: BerthOptions = {}) {
    if (options.url) {
      const url = new URL(options.url);
      if (url.protocol !== "http:") {
        throw new TypeError("only http:// URLs (loopback TCP) are supported");
      }
      this.host = url.hostname.replace(/^\[(.*)\]$/, "$1");
      this.port = url.port ? Number(url.port) : 80;
    } else {
      this.socketPath = options.socketPath ?? defaultSocket();
    }
    this.token = options.token;
    this.timeoutMs = options.timeoutMs;
  }

  // -- plumbing -------------------------------------------------------------

  /**
   * Sends a request; resolves to the response once its status is OK (the
   * caller reads it, or destroys it to stop). A refusal rejects with the
   * {@link BerthError} subclass its status and code name.
   */
  async request(method: string, urlPath: string, options: RequestOptions = {}): Promise<http.IncomingMessage> {
    let target = urlPath;
    if (options.query) {
      const pairs = new URLSearchParams();
      for (const [key, value] of Object.entries(options.query)) {
        if (value === undefined || value === null) continue;
        pairs.set(key, String(value));
      }
      const text = pairs.toString();
      if (text) target += `?${text}`;
    }
    const headers: Record<string, string> = { Host: "berth" };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    let data: Buffer | undefined;
    let stream: Readable | undefined;
    if (options.json !== undefined) {
      data = Buffer.from(JSON.stringify(options.json));
      headers["Content-Type"] = "application/json";
    } else if (options.body !== undefined) {
      headers["Content-Type"] = options.contentType ?? "application/octet-stream";
      const body = options.body;
      if (typeof body === "string") data = Buffer.from(body);
      else if (body instanceof Uint8Array) data = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
      else stream = body instanceof Readable ? body : Readable.from(body);
    }
    if (data !== undefined) headers["Content-Length"] = String(data.length);
    else if (stream !== undefined && options.length !== undefined) headers["Content-Length"] = String(options.length);
    // A raw body waits for the server's go-ahead: a body it refuses from
    // its headers alone (over a limit) is then never sent, and its answer
    // is read rather than lost to a broken pipe.
    const raw = options.json === undefined && options.body !== undefined;
    if (raw) headers.Expect = "100-continue";

    const response = await new Promise<http.IncomingMessage>((resolve, reject) => {
      const req = http.request({
        method,
        path: target,
        headers,
        socketPath: this.socketPath,
        host: this.host,
        port: this.port,
        agent: false,
        signal: options.signal,
        timeout: this.timeoutMs,
      });
      let answered = false;
      req.on("response", (res) => {
        answered = true;
        resolve(res);
      });
      req.on("timeout", () => req.destroy(new BerthError(0, "timeout", `no answer from the server in ${this.timeoutMs} ms`)));
      req.on("error", (err) => {
        // A server that refuses a body part-way answers, then closes: its
        // answer, already here, says why.
        if (!answered) reject(err);
      });
      const send = () => {
        if (answered) return;
        if (stream !== undefined) {
          stream.on("error", (err) => req.destroy(err));
          stream.pipe(req);
        } else {
          req.end(data);
        }
      };
      if (raw) req.on("continue", send);
      else send();
    });
    if ((response.statusCode ?? 0) >= 300) {
      const raw = await readCapped(response, ERROR_CAP);
      const status = response.statusCode ?? 0;
      let code = "http";
      let message = raw.toString("utf8") || response.statusMessage || "";
      try {
        const err = JSON.parse(raw.toString("utf8")).error;
        if (typeof err?.code === "string" && typeof err?.message === "string") {
          code = err.code;
          message = err.message;
        }
      } catch {
        // Not JSON: the body's text stands.
      }
      const Class = errorClass(status, code);
      throw new Class(status, code, message);
    }
    return response;
  }

  /** A request whose reply is JSON. */
  async json<T>(method: string, urlPath: string, options: RequestOptions = {}): Promise<T> {
    const response = await this.request(method, urlPath, options);
    const raw = await readAll(response).catch((err) => {
      throw abortReason(err, options.signal);
    });
    return JSON.parse(raw.toString("utf8")) as T;
  }

  /**
   * The body of a streamed reply, chunk by chunk. Leaving the loop early
   * (`break`, a throw) closes the connection, which stops the command; an
   * abort rejects with the signal's reason.
   */
  private async *blocks(method: string, urlPath: string, options: RequestOptions): AsyncGenerator<Buffer, void, undefined> {
    const response = await this.request(method, urlPath, options);
    try {
      yield* response as AsyncIterable<Buffer>;
    } catch (err) {
      throw abortReason(err, options.signal);
    } finally {
      response.destroy();
    }
  }

  /**
   * A request whose reply is exec events in binary frames (`framing:
   * "binary"`): a kind byte (1 stdout, 2 stderr, 0 a JSON event), a 4-byte
   * big-endian length, the payload — output with no base64 and no JSON
   * parse. Leaving the loop early closes the connection, which stops the
   * command.
   */
  async *frames(method: string, urlPath: string, options: RequestOptions = {}): AsyncGenerator<ExecEvent, void, undefined> {
    let pending: Buffer = Buffer.alloc(0);
    for await (const chunk of this.blocks(method, urlPath, options)) {
      const block = pending.length ? Buffer.concat([pending, chunk]) : chunk;
      let at = 0;
      while (block.length - at >= 5) {
        const size = block.readUInt32BE(at + 1);
        if (block.length - at - 5 < size) break;
        const kind = block[at];
        const body = block.subarray(at + 5, at + 5 + size);
        at += 5 + size;
        if (kind === 1) yield { type: "stdout", data: body };
        else if (kind === 2) yield { type: "stderr", data: body };
        else if (kind === 0) yield parseEvent(body);
        else throw new BerthError(502, "protocol", `unknown frame kind ${kind}`);
      }
      pending = block.subarray(at);
    }
    if (pending.length) throw new BerthError(502, "protocol", "the stream ended inside a frame");
  }

  // -- the API ----------------------------------------------------------------

  /** The server's API and Berth versions. */
  version(): Promise<{ api: number; berth: string; pid: number; environment: string; build: string }> {
    return this.json("GET", `${API}/version`);
  }

  /** The server's OpenAPI document. */
  openapi(): Promise<Record<string, unknown>> {
    return this.json("GET", `${API}/openapi.json`);
  }

  /** The backend kinds the server can create, each with its settings. */
  backends(): Promise<BackendKind[]> {
    return this.json("GET", `${API}/backends`);
  }

  /**
   * The bounds a new sandbox gets where its settings say nothing
   * (`memory`, `pids`, `cpus`, `disk`), from the server's
   * `$BERTH_HOME/config.toml` over Berth's own.
   */
  defaults(): Promise<HostDefaults> {
    return this.json("GET", `${API}/defaults`);
  }

  /** Every sandbox. */
  sandboxes(): Promise<SandboxSummary[]> {
    return this.json("GET", `${API}/sandboxes`);
  }

  /** A handle on sandbox `name` (nothing is sent until it is used). */
  sandbox(name: string): Sandbox {
    return new Sandbox(this, name);
  }

  /**
   * Creates (and by default starts) a sandbox. A create whose start fails
   * rejects, and leaves no sandbox of that name: the same call can be made
   * again. See {@link CreateOptions}.
   */
  async create(name: string, options: CreateOptions = {}): Promise<Sandbox> {
    const { backend, image, workspace, snapshot, start, egress, checkpointEachExec, dedupKeep, compress, settings } = options;
    const body: Record<string, unknown> = { name, start: start ?? true, ...(settings ?? {}) };
    if (backend !== undefined) body.backend = backend;
    if (image !== undefined) body.image = image;
    if (workspace !== undefined) body.workspace = workspace;
    if (snapshot !== undefined) body.snapshot = snapshot;
    if (compress !== undefined) body.compress = compress;
    if (dedupKeep !== undefined) body.dedup_keep = dedupKeep;
    if (checkpointEachExec !== undefined) body.checkpoint_each_exec = checkpointEachExec;
    if (egress !== undefined) {
      body.egress = {
        allow_hosts: egress.allowHosts ?? [],
        deny_hosts: egress.denyHosts ?? [],
        allow_cidrs: egress.allowCidrs ?? [],
        test_resolve: egress.testResolve ?? [],
        secrets: Object.entries(egress.secrets ?? {}).map(([secret, spec]) => ({
          name: secret,
          value: spec.value,
          hosts: spec.hosts,
        })),
      };
    }
    await this.json("POST", `${API}/sandboxes`, { json: body });
    return new Sandbox(this, name);
  }

  /**
   * Makes a warm pool: the server keeps `size` sandboxes of this template
   * started and open, refilled in the background, so that {@link claim}
   * hands one over at once. The template is what {@link create} takes.
   */
  createPool(name: string, size: number, options: CreatePoolOptions = {}): Promise<Pool> {
    const { backend, image, snapshot, settings } = options;
    const body: Record<string, unknown> = { name, size, ...(settings ?? {}) };
    if (backend !== undefined) body.backend = backend;
    if (image !== undefined) body.image = image;
    if (snapshot !== undefined) body.snapshot = snapshot;
    return this.json("POST", `${API}/pools`, { json: body });
  }

  /** Every warm pool, with its members ready in the server. */
  pools(): Promise<Pool[]> {
    return this.json("GET", `${API}/pools`);
  }

  /** One warm pool (`ready`: members a claim gets at once). */
  pool(name: string): Promise<Pool> {
    return this.json("GET", `${API}/pools/${encodeURIComponent(name)}`);
  }

  /**
   * Removes a warm pool: every member shut down and forgotten (sandboxes
   * claimed from it stay). Resolves to how many were removed.
   */
  async removePool(name: string): Promise<number> {
    const reply: { members_removed: number } = await this.json("DELETE", `${API}/pools/${encodeURIComponent(name)}`);
    return reply.members_removed;
  }

  /**
   * A sandbox `name` from warm pool `pool`: a started member handed over
   * with `workspace` applied (no bind mounts, the default root), or, when
   * none is ready, one created cold from the pool's template. Either way
   * it runs when this resolves; `claimed` says which.
   */
  async claim(name: string, pool: string, options: { workspace?: Record<string, unknown> } = {}): Promise<{ sandbox: Sandbox; claimed: Claimed }> {
    const body: Record<string, unknown> = { name, from_pool: pool };
    if (options.workspace !== undefined) body.workspace = options.workspace;
    const record: SandboxRecord = await this.json("POST", `${API}/sandboxes`, { json: body });
    return {
      sandbox: new Sandbox(this, name),
      claimed: record.claimed ?? { pool, warm: false },
    };
  }
}

/** What `createPool` takes besides the name and size: the template, as `create` takes it. */
export interface CreatePoolOptions {
  /** A kind's name or `{ type, ...settings }`, as in {@link CreateOptions}. */
  backend?: string | ({ type: string } & Record<string, unknown>);
  /** The image (Docker and swarm), flat. */
  image?: string;
  /** Where claimed sandboxes' snapshots go. */
  snapshot?: string;
  /** Further fields of `POST /v1/pools`, or the kind's settings given flat. */
  settings?: Record<string, unknown>;
}

/**
 * The reason `signal` gave when it aborted a reply being read (Node tells
 * only that the connection was "aborted"), else `err`.
 */
function abortReason(err: unknown, signal?: AbortSignal): unknown {
  return signal?.aborted ? (signal.reason ?? err) : err;
}

/** An egress policy: default deny, enforced on the server's host. */
export interface EgressPolicy {
  /** Hosts the sandbox may reach (`api.example.com`, `*.example.org:443`). An empty list reaches nothing. */
  allowHosts?: string[];
  /** Hosts refused even where an allow rule matches. */
  denyHosts?: string[];
  /** Addresses reached by number (`10.0.0.0/8:5432`). */
  allowCidrs?: string[];
  /** For tests: names under `.test` resolved to given addresses (`*.pkg.test=127.0.0.1`). */
  testResolve?: string[];
  /**
   * Credentials kept out of the sandbox: it sees each name set to a
   * placeholder, and the egress point puts the value in its place in the
   * request headers of HTTPS connections to those hosts only (each must be
   * allowed). The server keeps the value and never gives it back.
   */
  secrets?: Record<string, { value: string; hosts: string[] }>;
}

/** What `create` takes besides the name. */
export interface CreateOptions {
  /**
   * A kind's name (`"local"`, `"docker"`, `"swarm"`) or an object with the
   * kind under `type` and its settings beside it:
   * `{ type: "docker", image: "alpine", memory: "2GiB" }`. `backends()`
   * lists every kind's settings; a key the kind does not take is refused
   * (400) naming the keys it does.
   */
  backend?: string | ({ type: string } & Record<string, unknown>);
  /** The image (Docker and swarm), flat. */
  image?: string;
  /** The workspace manifest (entries the workspace starts with). */
  workspace?: Record<string, unknown>;
  /** Where its snapshots go: `local`, `noop`, `remote:MANIFEST` (a store plugin). */
  snapshot?: string;
  /** Start it now (default true). */
  start?: boolean;
  /** Compress archives. */
  compress?: boolean;
  /** Deduplicated generations, this many kept. */
  dedupKeep?: number;
  /** Write a generation after every command (history, diff, rewind); implies deduplicated generations, 50 kept unless `dedupKeep` says. */
  checkpointEachExec?: boolean;
  /** An egress policy (default: the server's). */
  egress?: EgressPolicy;
  /** Further fields of `POST /v1/sandboxes`, or the kind's settings given flat (`{ memory: "2GiB" }`). */
  settings?: Record<string, unknown>;
}
