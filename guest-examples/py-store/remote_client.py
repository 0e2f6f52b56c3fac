"""The `client` resource of berth:snapshot/remote-client, in Python."""

import os
import re
from typing import List, Tuple

from componentize_py_types import Err
from wit_world.exports import remote_client
from wit_world.imports import streams
from wit_world.imports.types import (
    StorageError_Denied,
    StorageError_InvalidId,
    StorageError_Io,
    StorageError_NotFound,
    StorageError_Other,
)

CHUNK = 256 * 1024
ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def valid_id(snapshot_id: str) -> str:
    if not ID.fullmatch(snapshot_id) or snapshot_id in (".", ".."):
        raise Err(StorageError_InvalidId(f"snapshot id {snapshot_id!r} is not [A-Za-z0-9._-]{{1,128}}"))
    return snapshot_id


def io_error(what: str, e: OSError):
    if isinstance(e, PermissionError):
        return Err(StorageError_Denied(f"{what}: {e}"))
    return Err(StorageError_Io(f"{what}: {e}"))


class Client(remote_client.Client):
    def __init__(self, root: str) -> None:
        self.root = root

    @classmethod
    def open(cls, config: List[Tuple[str, str]]) -> "Client":
        root = dict(config).get("root", "/data")
        if not os.path.isdir(root):
            raise Err(StorageError_Denied(
                f"root {root} is not reachable; grant it as a preopened directory in the plugin manifest"))
        return cls(root)

    def _path(self, snapshot_id: str) -> str:
        return os.path.join(self.root, valid_id(snapshot_id) + ".tar")

    def upload(self, snapshot_id: str, data: streams.InputStream) -> None:
        target = self._path(snapshot_id)
        partial = os.path.join(self.root, ".partial")
        try:
            os.makedirs(partial, exist_ok=True)
            temp = os.path.join(partial, f"{snapshot_id}.{os.urandom(8).hex()}")
            f = open(temp, "wb")
        except OSError as e:
            raise io_error("creating the upload file", e)
        committed = False
        try:
            while True:
                try:
                    chunk = data.blocking_read(CHUNK)
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise Err(StorageError_Io(f"archive stream failed: {e.value}"))
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.rename(temp, target)
            committed = True
        except OSError as e:
            raise io_error("writing the upload", e)
        finally:
            if not committed:
                try:
                    f.close()
                    os.remove(temp)
                except OSError:
                    pass

    def download(self, snapshot_id: str, sink: streams.OutputStream) -> None:
        path = self._path(snapshot_id)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise Err(StorageError_NotFound(f"no snapshot {snapshot_id!r}"))
        except OSError as e:
            raise io_error("opening the snapshot", e)
        with f:
            while True:
                permit = sink.check_write()
                if permit == 0:
                    sink.subscribe().block()
                    continue
                chunk = f.read(min(permit, CHUNK))
                if not chunk:
                    break
                sink.write(chunk)
        sink.blocking_flush()

    def exists(self, snapshot_id: str) -> bool:
        return os.path.isfile(self._path(snapshot_id))

    def delete(self, snapshot_id: str) -> None:
        try:
            os.remove(self._path(snapshot_id))
        except FileNotFoundError:
            raise Err(StorageError_NotFound(f"no snapshot {snapshot_id!r}"))
        except OSError as e:
            raise io_error("deleting the snapshot", e)
