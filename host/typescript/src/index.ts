/**
 * The Node client of Berth's sandbox server (`berth serve`): create
 * sandboxes, run commands (collected, or streamed as an async iterator),
 * move files, run background processes, and read and rewind a workspace's
 * history — over the server's unix socket or loopback TCP, with Node's
 * own HTTP.
 *
 * ```ts
 * import { Berth } from "berth-client";
 * const berth = new Berth();
 * const box = await berth.create("task", { backend: "docker", image: "alpine" });
 * const r = await box.exec("echo hi");
 * for await (const e of box.execStream("make test")) if (e.type === "stdout") process.stdout.write(e.data);
 * ```
 */

export { Berth, defaultSocket } from "./client";
export type { BerthOptions, CreateOptions, CreatePoolOptions, EgressPolicy, RequestOptions } from "./client";
export type { Body } from "./io";
export { Files, Sandbox } from "./sandbox";
export type { CollectOptions, Command, ExecOptions, StreamOptions } from "./sandbox";
export {
  BerthError,
  Conflict,
  GenerationNotKept,
  NotFound,
  PathRefused,
  PlacementFailed,
  Stale,
  TooLarge,
  Unauthorized,
  errorClass,
} from "./errors";
export { API } from "./types";
export type {
  BackendKind,
  Checkpointed,
  Claimed,
  Diff,
  EgressConnection,
  EgressReport,
  EgressRules,
  ErrorDetail,
  ExecEvent,
  ExecResult,
  FileEntry,
  Generation,
  History,
  HostDefault,
  HostDefaults,
  Note,
  PathDiff,
  Pool,
  Process,
  SandboxRecord,
  SandboxSummary,
  Started,
} from "./types";
