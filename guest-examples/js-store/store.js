// js-store: a Berth remote snapshot client in JavaScript (componentize-js).
//
// It behaves like the Rust fs-store: archives live at `<root>/<id>.tar` in a
// directory the host preopened for it, uploads are written under
// `<root>/.partial/` and renamed into place only when complete.
//
// Archive bytes never enter JavaScript: the component imports
// `wasi:filesystem` (world `berth:fs-guest/fs-remote-client`) and splices the
// host's stream into a file stream and back. Copying 256 KiB chunks through
// JS arrays works too, but costs a copy per chunk in each direction.

import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

const CHUNK = 1024n * 1024n;
const ID = /^[A-Za-z0-9._-]{1,128}$/;

/** A contract error: componentize-js turns a thrown variant into `err`. */
function storageError(tag, message) {
  const e = new Error(message);
  e.payload = { tag, val: message };
  return e;
}

function validId(id) {
  if (!ID.test(id) || id === '.' || id === '..') {
    throw storageError('invalid-id', `snapshot id ${JSON.stringify(id)} is not [A-Za-z0-9._-]{1,128}`);
  }
  return id;
}

/** wasi:filesystem error codes arrive as thrown strings (or {payload}). */
function codeOf(e) {
  if (typeof e === 'string') return e;
  if (e && typeof e.payload === 'string') return e.payload;
  if (e && e.payload && typeof e.payload.tag === 'string') return e.payload.tag;
  return String(e);
}

function fsError(what, e) {
  const code = codeOf(e);
  if (code === 'access' || code === 'not-permitted' || code === 'read-only') {
    return storageError('denied', `${what}: ${code}`);
  }
  return storageError('io', `${what}: ${code}`);
}

/** Whether a stream call failed because the stream is closed (end of data). */
function isClosed(e) {
  const p = e && e.payload !== undefined ? e.payload : e;
  return p && p.tag === 'closed';
}

function streamFailure(what, e) {
  const p = e && e.payload !== undefined ? e.payload : e;
  let detail = String(p && p.tag ? p.tag : e);
  if (p && p.tag === 'last-operation-failed' && p.val && p.val.toDebugString) {
    detail = p.val.toDebugString();
  }
  return storageError('io', `${what}: ${detail}`);
}

/** Finds the preopened directory holding `root` and the path inside it. */
function resolveRoot(root) {
  const clean = root.replace(/\/+$/, '') || '/';
  let best = null;
  for (const [descriptor, guestPath] of getDirectories()) {
    const base = guestPath.replace(/\/+$/, '') || '/';
    const inside = clean === base || clean.startsWith(base === '/' ? '/' : `${base}/`);
    if (inside && (best === null || base.length > best.base.length)) {
      best = { descriptor, base };
    }
  }
  if (best === null) {
    throw storageError(
      'denied',
      `root ${root} is not reachable; grant it as a preopened directory in the plugin manifest`,
    );
  }
  let rel = clean.slice(best.base.length).replace(/^\/+/, '');
  return { dir: best.descriptor, rel };
}

function join(rel, name) {
  return rel === '' ? name : `${rel}/${name}`;
}

const NOFOLLOW = {};
let counter = 0;

function tempName(id) {
  const r = Math.floor(Math.random() * 0x100000000).toString(16).padStart(8, '0');
  counter += 1;
  return `${id}.${Date.now().toString(16)}${r}${counter}`;
}

class Client {
  constructor(dir, rel) {
    this.dir = dir;
    this.rel = rel;
  }

  static open(config) {
    let root = '/data';
    for (const [k, v] of config) {
      if (k === 'root') root = v;
    }
    const { dir, rel } = resolveRoot(root);
    if (rel !== '') {
      let stat;
      try {
        stat = dir.statAt({ symlinkFollow: true }, rel);
      } catch (e) {
        throw storageError('denied', `root ${root} is not reachable (${codeOf(e)})`);
      }
      if (stat.type !== 'directory') {
        throw storageError('other', `root ${root} is not a directory`);
      }
    }
    return new Client(dir, rel);
  }

  path(id) {
    return join(this.rel, `${validId(id)}.tar`);
  }

  upload(id, data) {
    // BACKEND: a real store streams `data` to its service here (granted in
    // the manifest's grants.http_hosts) and makes it visible only once the
    // whole stream has arrived.
    const target = this.path(id);
    const partialDir = join(this.rel, '.partial');
    try {
      this.dir.createDirectoryAt(partialDir);
    } catch (e) {
      if (codeOf(e) !== 'exist') throw fsError('creating .partial', e);
    }
    const temp = join(partialDir, tempName(id));
    let file;
    try {
      file = this.dir.openAt(NOFOLLOW, temp, { create: true, exclusive: true }, { write: true });
    } catch (e) {
      throw fsError('creating the upload file', e);
    }
    let committed = false;
    try {
      const out = file.writeViaStream(0n);
      try {
        for (;;) {
          try {
            out.blockingSplice(data, CHUNK);
          } catch (e) {
            if (!isClosed(e)) throw streamFailure('archive stream failed', e);
            // `closed` is the archive's end, unless the file side is the
            // one that closed: a file stream only closes on error.
            try {
              out.checkWrite();
            } catch (e2) {
              throw streamFailure('writing the upload file', e2);
            }
            break;
          }
        }
        try {
          out.blockingFlush();
        } catch (e) {
          throw streamFailure('writing the upload file', e);
        }
      } finally {
        out[Symbol.dispose]?.();
      }
      try {
        file.syncData();
        this.dir.renameAt(temp, this.dir, target);
      } catch (e) {
        throw fsError('committing the upload', e);
      }
      committed = true;
    } finally {
      file[Symbol.dispose]?.();
      if (!committed) {
        try {
          this.dir.unlinkFileAt(temp);
        } catch (_) {
          // Already gone or never written: nothing to undo.
        }
      }
    }
  }

  download(id, sink) {
    const path = this.path(id);
    let file;
    try {
      file = this.dir.openAt(NOFOLLOW, path, {}, { read: true });
    } catch (e) {
      if (codeOf(e) === 'no-entry') {
        throw storageError('not-found', `no snapshot ${JSON.stringify(id)}`);
      }
      throw fsError('opening the snapshot', e);
    }
    try {
      const src = file.readViaStream(0n);
      try {
        for (;;) {
          try {
            sink.blockingSplice(src, CHUNK);
          } catch (e) {
            if (!isClosed(e)) throw streamFailure('streaming the snapshot', e);
            break;
          }
        }
      } finally {
        src[Symbol.dispose]?.();
      }
      // `closed` from splice means either the file ended or the host closed
      // the sink; only the first is success.
      try {
        sink.checkWrite();
        sink.blockingFlush();
      } catch (e) {
        throw streamFailure('the host stopped reading the snapshot', e);
      }
    } finally {
      file[Symbol.dispose]?.();
    }
  }

  exists(id) {
    const path = this.path(id);
    try {
      return this.dir.statAt(NOFOLLOW, path).type === 'regular-file';
    } catch (e) {
      if (codeOf(e) === 'no-entry') return false;
      throw fsError('checking the snapshot', e);
    }
  }

  delete(id) {
    const path = this.path(id);
    try {
      this.dir.unlinkFileAt(path);
    } catch (e) {
      if (codeOf(e) === 'no-entry') {
        throw storageError('not-found', `no snapshot ${JSON.stringify(id)}`);
      }
      throw fsError('deleting the snapshot', e);
    }
  }
}

export const remoteClient = { Client };
