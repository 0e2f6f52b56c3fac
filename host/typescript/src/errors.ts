/** The errors the server's refusals raise. */

/**
 * The server refused a request: `status` (HTTP), `code` (stable, e.g.
 * `not_found`, `path_refused`) and `message` (for people).
 */
export class BerthError extends Error {
  /** The HTTP status. */
  readonly status: number;
  /** The stable error code. */
  readonly code: string;
  /** What failed and what to do, for people. */
  readonly detail: string;

  constructor(status: number, code: string, message: string) {
    super(`${message} (${code})`);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
    this.detail = message;
  }
}

/** No such sandbox, file, process or exec. */
export class NotFound extends BerthError {}

/**
 * The sandbox is not in a state for this (exists, not started, a stop
 * refused to protect the snapshot, a process still running).
 */
export class Conflict extends BerthError {}

/** A path that leaves the workspace. */
export class PathRefused extends BerthError {}

/** No bearer token, or the wrong one. */
export class Unauthorized extends BerthError {}

/** A body over the server's limits. */
export class TooLarge extends BerthError {}

/**
 * A scheduler (the swarm) did not run the sandbox in time; the message
 * carries its reason. A create that fails so leaves nothing behind.
 */
export class PlacementFailed extends BerthError {}

/**
 * The sandbox's instance was replaced by its scheduler (node lost); the
 * command did not run. Running it again resumes the sandbox where it was
 * placed.
 */
export class Stale extends Conflict {}

/**
 * The generation asked for is not kept (collected, or never written); the
 * message lists the kept ones.
 */
export class GenerationNotKept extends NotFound {}

/** The class a refusal with `status` and `code` raises. */
export function errorClass(status: number, code: string): typeof BerthError {
  if (status === 401) return Unauthorized;
  if (code === "path_refused") return PathRefused;
  if (status === 413 || code === "too_large") return TooLarge;
  if (code === "placement") return PlacementFailed;
  if (code === "stale") return Stale;
  if (code === "generation_not_kept") return GenerationNotKept;
  if (status === 404) return NotFound;
  if (status === 409) return Conflict;
  return BerthError;
}
