/** Bodies: what a request sends, how a reply is read. */

import * as fs from "node:fs";
import type { Readable } from "node:stream";

/** A request body: bytes, text, or a stream of bytes. */
export type Body = Buffer | Uint8Array | string | Readable | AsyncIterable<Uint8Array>;

/** All of a response's bytes. */
export async function readAll(response: Readable): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of response as AsyncIterable<Buffer>) chunks.push(chunk);
  return Buffer.concat(chunks);
}

/** A response's first `cap` bytes (the rest is read and dropped). */
export async function readCapped(response: Readable, cap: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of response as AsyncIterable<Buffer>) {
    if (size < cap) {
      chunks.push(chunk.subarray(0, cap - size));
      size += Math.min(chunk.length, cap - size);
    }
  }
  return Buffer.concat(chunks);
}

/** A real file's remaining size, for a stream from `fs.createReadStream`. */
export function fileStreamLength(stream: unknown): number | undefined {
  const file = stream as { path?: unknown; start?: unknown; end?: unknown };
  if (stream instanceof fs.ReadStream && typeof file.path === "string") {
    const size = fs.statSync(file.path).size;
    const start = typeof file.start === "number" ? file.start : 0;
    const end = typeof file.end === "number" && Number.isFinite(file.end) ? Math.min(file.end + 1, size) : size;
    return Math.max(0, end - start);
  }
  return undefined;
}
