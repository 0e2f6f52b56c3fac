"""A Python client for `berth serve`, Berth's HTTP/JSON API.

Standard library only. It talks to the server on its unix socket (by default
``$BERTH_HOME/berth.sock``) or over TCP with a bearer token::

    from berth_client import Berth

    b = Berth()                                   # the local server
    box = b.create("box", backend="docker", image="berth-test:busybox")
    print(box.exec("ls -la").stdout)
    for event in box.exec_stream("make test"):    # output as it comes
        if event.kind == "stdout":
            sys.stdout.buffer.write(event.data)
    box.files.write("notes.txt", b"hello\\n")
    box.stop()                                    # persist the workspace

Every method raises :class:`BerthError` (or one of its subclasses) with the
server's code and message when the server refuses.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import urllib.parse
from dataclasses import dataclass, field
from typing import IO, Any, Iterator, Optional, Union

__all__ = [
    "Berth",
    "Sandbox",
    "Files",
    "ExecResult",
    "ExecEvent",
    "Process",
    "FileEntry",
    "BerthError",
    "NotFound",
    "Conflict",
    "PathRefused",
    "Unauthorized",
    "PlacementFailed",
    "Stale",
    "TooLarge",
    "default_socket",
]

API = "/v1"
_CHUNK = 256 * 1024


def default_socket() -> str:
    """``$BERTH_SOCKET``, else ``$BERTH_HOME/berth.sock``, else the XDG data
    directory's ``berth/berth.sock`` (as the ``berth`` CLI finds it)."""
    if os.environ.get("BERTH_SOCKET"):
        return os.environ["BERTH_SOCKET"]
    home = os.environ.get("BERTH_HOME")
    if not home:
        data = os.environ.get("XDG_DATA_HOME") or os.path.join(
            os.path.expanduser("~"), ".local", "share"
        )
        home = os.path.join(data, "berth")
    return os.path.join(home, "berth.sock")


class BerthError(Exception):
    """The server refused a request: ``status`` (HTTP), ``code`` (stable,
    e.g. ``not_found``, ``path_refused``) and ``message`` (for people)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{message} ({code})")
        self.status = status
        self.code = code
        self.message = message


class NotFound(BerthError):
    """No such sandbox, file, process or exec."""


class Conflict(BerthError):
    """The sandbox is not in a state for this (exists, not started, a stop
    refused to protect the snapshot, a process still running)."""


class PathRefused(BerthError):
    """A path that leaves the workspace."""


class Unauthorized(BerthError):
    """No bearer token, or the wrong one."""


class TooLarge(BerthError):
    """A body over the server's limits."""


class PlacementFailed(BerthError):
    """A scheduler (the swarm) did not run the sandbox in time; ``message``
    carries its reason (``no suitable node …``). A create that fails so
    leaves nothing behind."""


class Stale(Conflict):
    """The sandbox's instance was replaced by its scheduler (node lost);
    the command did not run. Running it again resumes the sandbox where
    it was placed."""


def _error_class(status: int, code: str) -> type:
    if status == 401:
        return Unauthorized
    if code == "path_refused":
        return PathRefused
    if status == 413 or code == "too_large":
        return TooLarge
    if code == "placement":
        return PlacementFailed
    if code == "stale":
        return Stale
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    return BerthError


@dataclass
class ExecResult:
    """A command's collected result."""

    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    truncated: bool = False
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    timed_out: bool = False
    duration_ms: int = 0
    signal: Optional[int] = None
    notes: list = field(default_factory=list)

    @property
    def stdout(self) -> str:
        """Stdout as text (invalid UTF-8 replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """Stderr as text (invalid UTF-8 replaced)."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @classmethod
    def _from_json(cls, d: dict) -> "ExecResult":
        def raw(name: str) -> bytes:
            if d.get(name + "_base64") is not None:
                return base64.b64decode(d[name + "_base64"])
            return d.get(name, "").encode("utf-8")

        return cls(
            exit_code=d["exit_code"],
            stdout_bytes=raw("stdout"),
            stderr_bytes=raw("stderr"),
            truncated=d.get("truncated", False),
            stdout_dropped=d.get("stdout_dropped", 0),
            stderr_dropped=d.get("stderr_dropped", 0),
            timed_out=d.get("timed_out", False),
            duration_ms=d.get("duration_ms", 0),
            signal=d.get("signal"),
            notes=list(d.get("notes", [])),
        )


@dataclass
class ExecEvent:
    """One event of a streamed command: ``kind`` is ``started`` (``exec_id``
    set), ``stdout`` or ``stderr`` (``data`` set) or ``exit`` (``exit_code``,
    ``timed_out``, ``signal``, ``notes`` set)."""

    kind: str
    data: bytes = b""
    exit_code: Optional[int] = None
    timed_out: bool = False
    signal: Optional[int] = None
    duration_ms: int = 0
    notes: list = field(default_factory=list)
    exec_id: Optional[str] = None


@dataclass
class Process:
    """A background process."""

    id: str
    command: str
    state: str
    started_ms: int
    exit_code: Optional[int] = None
    pid: Optional[int] = None


@dataclass
class FileEntry:
    """A path in a workspace."""

    path: str
    type: str
    size: int
    mode: int
    mtime: int
    target: Optional[str] = None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]):
        super().__init__("berth", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


Body = Union[None, bytes, IO[bytes]]


class Berth:
    """A connection to a Berth server.

    By default it uses the unix socket :func:`default_socket` finds. Give
    ``url="http://127.0.0.1:PORT"`` and ``token=...`` for a server started
    with ``--listen``. ``timeout`` bounds each socket operation (seconds; by
    default none, since commands may run for long).
    """

    def __init__(
        self,
        socket_path: Optional[str] = None,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
    ):
        self._url = urllib.parse.urlsplit(url) if url else None
        self._socket = None if url else (socket_path or default_socket())
        self._token = token
        self._timeout = timeout

    # -- plumbing -----------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._url is not None:
            if self._url.scheme != "http":
                raise ValueError("only http:// URLs (loopback TCP) are supported")
            return http.client.HTTPConnection(
                self._url.hostname, self._url.port or 80, timeout=self._timeout
            )
        return _UnixConnection(self._socket, self._timeout)

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Optional[dict] = None,
        json_body: Any = None,
        body: Body = None,
        length: Optional[int] = None,
        content_type: str = "application/octet-stream",
    ) -> http.client.HTTPResponse:
        """Sends a request; returns the response once its status is OK (the
        caller reads and closes it)."""
        if query:
            pairs = {k: _query_value(v) for k, v in query.items() if v is not None}
            path = path + "?" + urllib.parse.urlencode(pairs)
        headers = {"Host": "berth"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        data: Any = None
        if json_body is not None:
            data = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        elif body is not None:
            headers["Content-Type"] = content_type
            data = body
            if isinstance(body, (bytes, bytearray)):
                length = len(body)
            if length is not None:
                headers["Content-Length"] = str(length)
        conn = self._connection()
        try:
            try:
                if data is not None and not isinstance(data, (bytes, bytearray)) and length is None:
                    conn.request(method, path, body=_chunks(data), headers=headers, encode_chunked=True)
                else:
                    conn.request(method, path, body=data, headers=headers)
            except (BrokenPipeError, ConnectionResetError) as cut:
                # The server refused the body part-way (over a limit) and
                # closed: its reply, already sent, says why.
                try:
                    response = conn.getresponse()
                except (OSError, http.client.HTTPException):
                    raise cut from None
            else:
                response = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if response.status >= 300:
            raw = response.read()
            conn.close()
            try:
                err = json.loads(raw)["error"]
                code, message = err["code"], err["message"]
            except (ValueError, KeyError, TypeError):
                code, message = "http", raw.decode("utf-8", "replace") or response.reason
            raise _error_class(response.status, code)(response.status, code, message)
        response._berth_conn = conn  # closed with the response
        return response

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        response = self._open(method, path, **kw)
        try:
            return json.loads(response.read())
        finally:
            response.close()
            response._berth_conn.close()

    def _events(self, method: str, path: str, **kw: Any) -> Iterator[ExecEvent]:
        for line in self._lines(method, path, **kw):
            yield _fast_event(line) or _event(json.loads(line))

    def _lines(self, method: str, path: str, **kw: Any) -> Iterator[bytes]:
        response = self._open(method, path, **kw)
        try:
            # Whole blocks, split here: far cheaper than readline on a
            # chunked body.
            pending = b""
            while True:
                block = response.read1(1 << 20)
                if not block:
                    if pending.strip():
                        yield pending
                    return
                pending += block
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line:
                        yield line
        finally:
            # Closing mid-stream stops the command (the server sees the
            # connection go).
            response.close()
            response._berth_conn.close()

    # -- the API ------------------------------------------------------------

    def version(self) -> dict:
        """The server's API and Berth versions."""
        return self._json("GET", f"{API}/version")

    def openapi(self) -> dict:
        """The server's OpenAPI document."""
        return self._json("GET", f"{API}/openapi.json")

    def backends(self) -> list:
        """The backend kinds the server can create, each ``{"kind": ...,
        "settings": [{"key", "value", "required", "help"}, ...]}``."""
        return self._json("GET", f"{API}/backends")

    def defaults(self) -> dict:
        """The bounds a new sandbox gets where its settings say nothing:
        ``{"file", "file_exists", "defaults": [{"key", "value",
        "from_file", "help"}, ...]}`` for ``memory``, ``pids``, ``cpus`` and
        ``disk``, from the server's ``$BERTH_HOME/config.toml`` over Berth's
        own. A create overrides each with its ``backend`` settings
        (``{"type": "local", "disk": "20GiB"}``)."""
        return self._json("GET", f"{API}/defaults")

    def sandboxes(self) -> list:
        """Every sandbox: ``name``, ``backend``, ``snapshot``, ``ready``, …"""
        return self._json("GET", f"{API}/sandboxes")

    def sandbox(self, name: str) -> "Sandbox":
        """A handle on sandbox ``name`` (nothing is sent until it is used)."""
        return Sandbox(self, name)

    def create(
        self,
        name: str,
        *,
        backend: Union[str, dict, None] = None,
        image: Optional[str] = None,
        workspace: Optional[dict] = None,
        snapshot: Optional[str] = None,
        start: bool = True,
        allow_hosts: Optional[list] = None,
        deny_hosts: Optional[list] = None,
        allow_cidrs: Optional[list] = None,
        test_resolve: Optional[list] = None,
        secrets: Optional[dict] = None,
        **options: Any,
    ) -> "Sandbox":
        """Creates (and by default starts) a sandbox.

        ``backend`` is a kind's name (``"local"``, ``"docker"``, ``"swarm"``,
        or one the server's program registered) or a dict with the kind
        under ``"type"`` and its settings beside it:
        ``{"type": "docker", "image": "alpine", "memory": "2GiB"}``.
        ``backends()`` lists every kind's settings. ``options`` are further
        fields of ``POST /v1/sandboxes`` (``compress``, ``dedup_keep``) or
        the kind's settings given flat (``image=..., memory=...``). A key
        the kind does not take raises ``BerthError`` (400) naming the keys
        it does. A create whose start fails raises, and leaves no sandbox
        of that name: the same call can be made again.

        ``allow_hosts`` (``["api.example.com", "*.example.org:443"]``),
        ``deny_hosts`` and ``allow_cidrs`` hold the sandbox to an egress
        policy: default deny, enforced on the server's host; its tools reach
        the allowed hosts through the proxy variables Berth sets. An empty
        list is a policy too (it reaches nothing). ``test_resolve``
        (``["*.pkg.test=127.0.0.1"]``) is for tests: names under ``.test``
        only.

        ``secrets`` keeps credentials out of the sandbox:
        ``{"OPENAI_KEY": {"value": key, "hosts": ["api.openai.com"]}}``.
        The sandbox sees ``OPENAI_KEY`` set to a placeholder; the egress
        point puts the value in its place in the request headers of HTTPS
        connections to those hosts only (each must be allowed). The server
        keeps the value (mode 0600) and never gives it back."""
        body = {"name": name, "start": start, **options}
        if any(v is not None for v in (allow_hosts, deny_hosts, allow_cidrs)):
            body["egress"] = {
                "allow_hosts": list(allow_hosts or []),
                "deny_hosts": list(deny_hosts or []),
                "allow_cidrs": list(allow_cidrs or []),
                "test_resolve": list(test_resolve or []),
                "secrets": [
                    {"name": key, "value": spec["value"], "hosts": list(spec["hosts"])}
                    for key, spec in (secrets or {}).items()
                ],
            }
        elif test_resolve or secrets:
            raise ValueError(
                "test_resolve and secrets need a policy: give allow_hosts (an empty list denies everything)"
            )
        for key, value in (
            ("backend", backend),
            ("image", image),
            ("workspace", workspace),
            ("snapshot", snapshot),
        ):
            if value is not None:
                body[key] = value
        self._json("POST", f"{API}/sandboxes", json_body=body)
        return Sandbox(self, name)


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _chunks(f: Any) -> Iterator[bytes]:
    if isinstance(f, (bytes, bytearray)):
        yield bytes(f)
        return
    if hasattr(f, "read"):
        while True:
            b = f.read(_CHUNK)
            if not b:
                return
            yield b
    else:
        yield from f


_STDOUT = b'{"type":"stdout","data":"'
_STDERR = b'{"type":"stderr","data":"'


def _fast_event(line: bytes) -> Optional[ExecEvent]:
    """An output line as the server writes it, without a JSON parse (most of
    a big stream's cost); None for anything else."""
    if line.endswith(b'"}'):
        if line.startswith(_STDOUT):
            return ExecEvent("stdout", data=base64.b64decode(line[len(_STDOUT) : -2]))
        if line.startswith(_STDERR):
            return ExecEvent("stderr", data=base64.b64decode(line[len(_STDERR) : -2]))
    return None


def _event(d: dict) -> ExecEvent:
    kind = d["type"]
    if kind in ("stdout", "stderr"):
        return ExecEvent(kind, data=base64.b64decode(d["data"]))
    if kind == "exit":
        return ExecEvent(
            "exit",
            exit_code=d["exit_code"],
            timed_out=d.get("timed_out", False),
            signal=d.get("signal"),
            duration_ms=d.get("duration_ms", 0),
            notes=list(d.get("notes", [])),
        )
    if kind == "started":
        return ExecEvent("started", exec_id=d["exec_id"])
    if kind == "error":
        err = d["error"]
        raise BerthError(502, err["code"], err["message"])
    raise BerthError(502, "protocol", f"unknown event type {kind!r}")


class Sandbox:
    """One sandbox on the server."""

    def __init__(self, client: Berth, name: str):
        self.client = client
        self.name = name
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
        command: str,
        *,
        timeout: float = 600.0,
        env: Optional[dict] = None,
        stdin: Optional[bytes] = None,
        stdout_cap: Optional[int] = None,
        stderr_cap: Optional[int] = None,
    ) -> ExecResult:
        """Runs ``command`` with ``sh -c`` in the workspace and collects its
        output (each stream capped; its start and end kept)."""
        body: dict = {"command": command, "timeout_ms": int(timeout * 1000), "env": env or {}}
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
        command: str,
        *,
        timeout: float = 600.0,
        env: Optional[dict] = None,
        stdin: Optional[bytes] = None,
        pty: Optional[tuple] = None,
        interactive: bool = False,
    ) -> Iterator[ExecEvent]:
        """Runs ``command`` and yields its output as it is produced, uncapped,
        then its ``exit`` event. Closing the iterator early stops the
        command. With ``interactive``, the first event is ``started`` and its
        ``exec_id`` takes :meth:`send_stdin`; ``pty=(rows, cols)`` runs it on a
        terminal."""
        body: dict = {
            "command": command,
            "timeout_ms": int(timeout * 1000),
            "env": env or {},
            "stream": True,
            "interactive": interactive,
        }
        if stdin is not None:
            body["stdin"] = base64.b64encode(stdin).decode()
        if pty is not None:
            body["pty"] = {"rows": pty[0], "cols": pty[1]}
        yield from self.client._events("POST", f"{self._path}/exec", json_body=body)

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
        query = {"follow": follow, "tail": tail}
        yield from self.client._events("GET", f"{self._proc(id)}/logs", query=query)

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
