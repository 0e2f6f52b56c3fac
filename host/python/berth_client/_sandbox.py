"""A sandbox on the server: its lifecycle, commands, processes, files
and generations."""

from __future__ import annotations

import base64
import os
import urllib.parse
from typing import IO, TYPE_CHECKING, Iterator, Optional, Sequence, Union

from ._errors import NotFound
from ._types import (
    API,
    _CHUNK,
    Diff,
    ExecEvent,
    ExecResult,
    FileEntry,
    History,
    Process,
)

if TYPE_CHECKING:
    from ._client import Berth


class Sandbox:
    """One sandbox on the server."""

    def __init__(self, client: "Berth", name: str):
        self.client = client
        self.name = name
        #: Where a sandbox from :meth:`Berth.claim` came from: ``{"pool",
        #: "warm", "reason"}``; ``None`` for any other.
        self.claimed: Optional[dict] = None
        self._path = f"{API}/sandboxes/{urllib.parse.quote(name, safe='')}"

    def __repr__(self) -> str:
        return f"Sandbox({self.name!r})"

    @property
    def files(self) -> "Files":
        """The sandbox's file API."""
        return Files(self)

    # lifecycle
    def inspect(self) -> dict:
        """Its record: ``name``, ``compression``, ``freeze``, ``state``."""
        return self.client._json("GET", self._path)

    def start(self) -> dict:
        """Starts it: ``branch`` says whether it reused, restored or
        initialised the workspace."""
        return self.client._json("POST", f"{self._path}/start")

    def stop(self) -> dict:
        """Persists the workspace into its snapshot (destroys nothing)."""
        return self.client._json("POST", f"{self._path}/stop")

    def fork(self, name: str, *, generation: Optional[int] = None, start: bool = True) -> "Sandbox":
        """A new sandbox ``name`` starting from one of this one's kept
        generations (the newest by default; deduplicated snapshots only)."""
        body: dict = {"name": name, "start": start}
        if generation is not None:
            body["generation"] = generation
        self.client._json("POST", f"{self._path}/fork", json_body=body)
        return Sandbox(self.client, name)

    # generations (deduplicated snapshots)
    def history(self) -> History:
        """The kept generations, oldest first: when, what wrote each (a
        command's checkpoint, a named checkpoint, a rewind, a stop) and what
        it changed."""
        return History._from_json(self.client._json("GET", f"{self._path}/history"))

    def diff(self, from_: int, to: int) -> Diff:
        """The paths generation ``from_`` and generation ``to`` differ by,
        read from their indexes (nothing else is downloaded)."""
        return Diff._from_json(
            self.client._json("GET", f"{self._path}/diff", query={"from": from_, "to": to})
        )

    def checkpoint(self, message: Optional[str] = None) -> int:
        """Writes a generation of the running workspace now (it keeps
        running); returns its number."""
        reply = self.client._json(
            "POST", f"{self._path}/checkpoint", json_body={"message": message}
        )
        return reply["generation"]

    def rewind(self, generation: int) -> int:
        """Makes the workspace ``generation``. The workspace as it was is
        saved first as a new generation, whose number is returned (rewind to
        it to undo this). Background processes do not survive a rewind."""
        reply = self.client._json(
            "POST", f"{self._path}/rewind", json_body={"generation": generation}
        )
        return reply["saved_as"]

    def egress(self) -> dict:
        """The egress policy (``policy``: ``allow_hosts``, ``deny_hosts``,
        ``allow_cidrs``) and the log of connections (``connections``: each
        with ``host``, ``port``, ``bytes_out``, ``bytes_in``, ``verdict``
        and the ``rule`` that allowed it or the ``reason`` it was denied)."""
        return self.client._json("GET", f"{self._path}/egress")

    def set_egress(
        self,
        *,
        allow_hosts: Optional[list] = None,
        deny_hosts: Optional[list] = None,
        allow_cidrs: Optional[list] = None,
    ) -> dict:
        """Replaces the egress policy (from the next connection); returns
        what ``egress()`` does."""
        body = {
            "allow_hosts": list(allow_hosts or []),
            "deny_hosts": list(deny_hosts or []),
            "allow_cidrs": list(allow_cidrs or []),
        }
        return self.client._json("PUT", f"{self._path}/egress", json_body=body)

    def shutdown(self) -> dict:
        """Destroys the running instance; the snapshot stays."""
        return self.client._json("POST", f"{self._path}/shutdown")

    def remove(self, *, keep_snapshot: bool = False, force: bool = False) -> None:
        """Shuts it down, deletes the snapshots Berth made (unless
        ``keep_snapshot``) and forgets it."""
        self.client._json(
            "DELETE", self._path, query={"keep_snapshot": keep_snapshot, "force": force}
        )

    # commands
    def exec(
        self,
        command: Union[str, Sequence[str]],
        *,
        timeout: float = 600.0,
        env: Optional[dict] = None,
        stdin: Optional[bytes] = None,
        stdout_cap: Optional[int] = None,
        stderr_cap: Optional[int] = None,
        checkpoint: Optional[bool] = None,
    ) -> ExecResult:
        """Runs ``command`` in the workspace and collects its output (each
        stream capped; its start and end kept). A string is a command line
        for ``sh -c``; a list of strings is the program and its arguments,
        run with no shell (nothing expanded, no builtin in a program's
        place; one that cannot be started exits 127 or 126). ``checkpoint``
        writes a generation when it ends (by default, when the sandbox was
        created with ``checkpoint_each_exec=True``); ``result.checkpoint``
        says which."""
        body: dict = {**_command(command), "timeout_ms": int(timeout * 1000), "env": env or {}}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        if stdin is not None:
            body["stdin"] = base64.b64encode(stdin).decode()
        if stdout_cap is not None:
            body["stdout_cap"] = stdout_cap
        if stderr_cap is not None:
            body["stderr_cap"] = stderr_cap
        return ExecResult._from_json(
            self.client._json("POST", f"{self._path}/exec", json_body=body)
        )

    def exec_stream(
        self,
        command: Union[str, Sequence[str]],
        *,
        timeout: float = 600.0,
        env: Optional[dict] = None,
        stdin: Optional[bytes] = None,
        pty: Optional[tuple] = None,
        interactive: bool = False,
        checkpoint: Optional[bool] = None,
    ) -> Iterator[ExecEvent]:
        """Runs ``command`` (a command line, or the program and its arguments,
        as for :meth:`exec`) and yields its output as it is produced, uncapped,
        then its ``exit`` event. Closing the iterator early stops the
        command. With ``interactive``, the first event is ``started`` and its
        ``exec_id`` takes :meth:`send_stdin`; ``pty=(rows, cols)`` runs it on a
        terminal. ``checkpoint`` as for :meth:`exec`: the ``exit`` event's
        ``checkpoint`` says which generation was written."""
        body: dict = {
            **_command(command),
            "timeout_ms": int(timeout * 1000),
            "env": env or {},
            "stream": True,
            "interactive": interactive,
            "framing": "binary",
        }
        if stdin is not None:
            body["stdin"] = base64.b64encode(stdin).decode()
        if pty is not None:
            body["pty"] = {"rows": pty[0], "cols": pty[1]}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        yield from self.client._frames("POST", f"{self._path}/exec", json_body=body)

    def send_stdin(self, exec_id: str, data: Union[bytes, IO[bytes]], *, close: bool = True) -> int:
        """Sends bytes to an interactive exec's stdin; closes stdin after
        unless ``close`` is false. Returns the bytes sent."""
        reply = self.client._json(
            "POST",
            f"{API}/execs/{exec_id}/stdin",
            query={"keep_open": not close},
            body=data,
        )
        return reply["bytes"]

    def resize(self, exec_id: str, rows: int, cols: int) -> None:
        """Resizes an interactive exec's terminal."""
        self.client._json("POST", f"{API}/execs/{exec_id}/resize", json_body={"rows": rows, "cols": cols})

    def signal(self, exec_id: str, signal: str = "TERM") -> None:
        """Sends an interactive exec's command a signal."""
        self.client._json("POST", f"{API}/execs/{exec_id}/signal", json_body={"signal": signal})

    # background processes
    def detach(self, command: str, *, name: Optional[str] = None, log_ring: Optional[int] = None) -> Process:
        """Starts ``command`` in the background and returns at once."""
        body: dict = {"command": command}
        if name is not None:
            body["name"] = name
        if log_ring is not None:
            body["log_ring"] = log_ring
        return Process(**self.client._json("POST", f"{self._path}/processes", json_body=body))

    def processes(self) -> list:
        """Its background processes."""
        return [Process(**p) for p in self.client._json("GET", f"{self._path}/processes")]

    def process(self, id: str) -> Process:
        """One background process."""
        return Process(**self.client._json("GET", self._proc(id)))

    def logs(self, id: str, *, follow: bool = False, tail: Optional[int] = None) -> Iterator[ExecEvent]:
        """What a background process's log ring keeps, as events; with
        ``follow``, until it exits."""
        query = {"follow": follow, "tail": tail, "framing": "binary"}
        yield from self.client._frames("GET", f"{self._proc(id)}/logs", query=query)

    def kill(self, id: str, signal: str = "TERM") -> None:
        """Sends a background process a signal."""
        self.client._json("POST", f"{self._proc(id)}/kill", json_body={"signal": signal})

    def wait(self, id: str) -> int:
        """Waits for a background process to exit; its exit code."""
        return self.client._json("POST", f"{self._proc(id)}/wait")["exit_code"]

    def _proc(self, id: str) -> str:
        return f"{self._path}/processes/{urllib.parse.quote(id, safe='')}"

    # the workspace as a tar stream
    def persist(self, out: IO[bytes]) -> int:
        """Writes the workspace as a tar stream to ``out``; bytes written."""
        response = self.client._open("GET", f"{self._path}/archive")
        n = 0
        try:
            while True:
                b = response.read(_CHUNK)
                if not b:
                    return n
                out.write(b)
                n += len(b)
        finally:
            response.close()
            response._berth_conn.close()

    def hydrate(self, archive: Union[bytes, IO[bytes]], length: Optional[int] = None) -> dict:
        """Extracts a tar stream into the workspace once all of it passed the
        hydrate policy: ``bytes`` and ``entries``."""
        return self.client._json(
            "PUT", f"{self._path}/archive", body=archive, length=length, content_type="application/x-tar"
        )

    def ports(self) -> list:
        """Published ports and where they are reached."""
        return self.client._json("GET", f"{self._path}/ports")


class Files:
    """A sandbox's files, every path relative to its workspace root (a path
    that leaves it raises :class:`PathRefused`)."""

    def __init__(self, sandbox: Sandbox):
        self._sandbox = sandbox
        self._client = sandbox.client
        self._path = f"{sandbox._path}/files"

    def read(self, path: str) -> bytes:
        """A whole file."""
        return b"".join(self.iter_read(path))

    def iter_read(self, path: str, chunk: int = _CHUNK) -> Iterator[bytes]:
        """A file's bytes, streamed."""
        response = self._client._open("GET", f"{self._path}/content", query={"path": path})
        try:
            while True:
                b = response.read(chunk)
                if not b:
                    return
                yield b
        finally:
            response.close()
            response._berth_conn.close()

    def write(
        self,
        path: str,
        data: Union[bytes, str, IO[bytes]],
        *,
        mode: Optional[int] = None,
        length: Optional[int] = None,
    ) -> int:
        """Writes a file atomically (it appears whole or not at all). A
        file object needs ``length`` unless it is a real file."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray)) and length is None:
            length = os.fstat(data.fileno()).st_size - data.tell()
        query = {"path": path, "mode": None if mode is None else format(mode, "o")}
        reply = self._client._json("PUT", f"{self._path}/content", query=query, body=data, length=length)
        return reply["bytes"]

    def stat(self, path: str) -> FileEntry:
        """Describes a path (symlinks not followed)."""
        return FileEntry(**self._client._json("GET", f"{self._path}/stat", query={"path": path}))

    def exists(self, path: str) -> bool:
        """Whether a path exists."""
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def list(self, path: str = "") -> list:
        """A directory's entries."""
        return [FileEntry(**e) for e in self._client._json("GET", f"{self._path}/list", query={"path": path})]

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a path."""
        self._client._json("DELETE", self._path, query={"path": path, "recursive": recursive})

    def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Makes a directory."""
        self._client._json("POST", f"{self._path}/mkdir", query={"path": path, "parents": parents})


def _command(command: Union[str, Sequence[str]]) -> dict:
    """The request's ``command`` (a line for ``sh -c``) or ``argv`` (words,
    no shell)."""
    if isinstance(command, str):
        return {"command": command}
    if isinstance(command, (bytes, bytearray)):
        raise TypeError("command: give a str (a command line) or a list of str (argv), not bytes")
    argv = list(command)
    if not argv or not all(isinstance(word, str) for word in argv):
        raise TypeError("command: argv must be a non-empty list of str")
    return {"argv": argv}
