"""The `client` resource of berth:snapshot/remote-client, in Python.

Archive bytes never pass through Python objects: the component imports
`wasi:filesystem` (world `berth:fs-guest/fs-remote-client` in ../wit-fs) and
splices the host's stream into a file stream and back. That is faster, and
it sidesteps a componentize-py 0.25.1 leak: every `bytes` passed to an
imported function such as `output-stream.write` stays allocated, so a
download written chunk by chunk grew with the archive.
"""

import os
import re
from typing import List, Tuple

from componentize_py_types import Err
from wit_world.exports import remote_client
from wit_world.imports import preopens, streams
from wit_world.imports import wasi_filesystem_types as fs
from wit_world.imports.berth_snapshot_types import (
    StorageError_Denied,
    StorageError_InvalidId,
    StorageError_Io,
    StorageError_NotFound,
    StorageError_Other,
)

CHUNK = 1024 * 1024
ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
NOFOLLOW = fs.PathFlags(0)


def valid_id(snapshot_id: str) -> str:
    if not ID.fullmatch(snapshot_id) or snapshot_id in (".", ".."):
        raise Err(StorageError_InvalidId(f"snapshot id {snapshot_id!r} is not [A-Za-z0-9._-]{{1,128}}"))
    return snapshot_id


def fs_error(what: str, code) -> Err:
    if code in (fs.ErrorCode.ACCESS, fs.ErrorCode.NOT_PERMITTED, fs.ErrorCode.READ_ONLY):
        return Err(StorageError_Denied(f"{what}: {code.name.lower()}"))
    return Err(StorageError_Io(f"{what}: {getattr(code, 'name', code)}"))


def stream_error(what: str, e: Err) -> Err:
    if isinstance(e.value, streams.StreamError_LastOperationFailed):
        return Err(StorageError_Io(f"{what}: {e.value.value.to_debug_string()}"))
    return Err(StorageError_Io(f"{what}: stream closed"))


def closed(e: Err) -> bool:
    return isinstance(e.value, streams.StreamError_Closed)


def resolve_root(root: str) -> Tuple[fs.Descriptor, str]:
    """The preopened directory holding `root`, and `root` relative to it."""
    clean = root.rstrip("/") or "/"
    best = None
    for descriptor, guest_path in preopens.get_directories():
        base = guest_path.rstrip("/") or "/"
        prefix = "/" if base == "/" else base + "/"
        if (clean == base or clean.startswith(prefix)) and (best is None or len(base) > len(best[1])):
            best = (descriptor, base)
    if best is None:
        raise Err(StorageError_Denied(
            f"root {root} is not reachable; grant it as a preopened directory in the plugin manifest"))
    return best[0], clean[len(best[1]):].lstrip("/")


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


class Client(remote_client.Client):
    def __init__(self, directory: fs.Descriptor, rel: str) -> None:
        self.dir = directory
        self.rel = rel

    @classmethod
    def open(cls, config: List[Tuple[str, str]]) -> "Client":
        root = dict(config).get("root", "/data")
        directory, rel = resolve_root(root)
        if rel:
            try:
                stat = directory.stat_at(fs.PathFlags.SYMLINK_FOLLOW, rel)
            except Err as e:
                raise Err(StorageError_Denied(f"root {root} is not reachable ({e.value})"))
            if stat.type != fs.DescriptorType.DIRECTORY:
                raise Err(StorageError_Other(f"root {root} is not a directory"))
        return cls(directory, rel)

    def _path(self, snapshot_id: str) -> str:
        return join(self.rel, valid_id(snapshot_id) + ".tar")

    def upload(self, snapshot_id: str, data: streams.InputStream) -> None:
        # BACKEND: a real store streams `data` to its service here (granted
        # in the manifest's grants.http_hosts) and makes it visible only
        # once the whole stream has arrived.
        target = self._path(snapshot_id)
        partial = join(self.rel, ".partial")
        try:
            self.dir.create_directory_at(partial)
        except Err as e:
            if e.value != fs.ErrorCode.EXIST:
                raise fs_error("creating .partial", e.value)
        temp = join(partial, f"{snapshot_id}.{os.urandom(8).hex()}")
        try:
            f = self.dir.open_at(NOFOLLOW, temp, fs.OpenFlags.CREATE | fs.OpenFlags.EXCLUSIVE,
                                 fs.DescriptorFlags.WRITE)
        except Err as e:
            raise fs_error("creating the upload file", e.value)
        committed = False
        try:
            with f.write_via_stream(0) as out:
                while True:
                    try:
                        out.blocking_splice(data, CHUNK)
                    except Err as e:
                        if not closed(e):
                            raise stream_error("archive stream failed", e)
                        # `closed` ends the archive, unless the file stream
                        # is the side that closed (it only does on error).
                        try:
                            out.check_write()
                        except Err as e2:
                            raise stream_error("writing the upload file", e2)
                        break
                try:
                    out.blocking_flush()
                except Err as e:
                    raise stream_error("writing the upload file", e)
            try:
                f.sync_data()
                self.dir.rename_at(temp, self.dir, target)
            except Err as e:
                raise fs_error("committing the upload", e.value)
            committed = True
        finally:
            f.__exit__(None, None, None)
            if not committed:
                try:
                    self.dir.unlink_file_at(temp)
                except Err:
                    pass

    def download(self, snapshot_id: str, sink: streams.OutputStream) -> None:
        path = self._path(snapshot_id)
        try:
            f = self.dir.open_at(NOFOLLOW, path, fs.OpenFlags(0), fs.DescriptorFlags.READ)
        except Err as e:
            if e.value == fs.ErrorCode.NO_ENTRY:
                raise Err(StorageError_NotFound(f"no snapshot {snapshot_id!r}"))
            raise fs_error("opening the snapshot", e.value)
        with f:
            with f.read_via_stream(0) as src:
                while True:
                    try:
                        sink.blocking_splice(src, CHUNK)
                    except Err as e:
                        if not closed(e):
                            raise stream_error("streaming the snapshot", e)
                        break
            # `closed` from splice means the file ended or the host closed
            # the sink; only the first is success.
            try:
                sink.check_write()
                sink.blocking_flush()
            except Err as e:
                raise stream_error("the host stopped reading the snapshot", e)

    def exists(self, snapshot_id: str) -> bool:
        path = self._path(snapshot_id)
        try:
            return self.dir.stat_at(NOFOLLOW, path).type == fs.DescriptorType.REGULAR_FILE
        except Err as e:
            if e.value == fs.ErrorCode.NO_ENTRY:
                return False
            raise fs_error("checking the snapshot", e.value)

    def delete(self, snapshot_id: str) -> None:
        path = self._path(snapshot_id)
        try:
            self.dir.unlink_file_at(path)
        except Err as e:
            if e.value == fs.ErrorCode.NO_ENTRY:
                raise Err(StorageError_NotFound(f"no snapshot {snapshot_id!r}"))
            raise fs_error("deleting the snapshot", e.value)
