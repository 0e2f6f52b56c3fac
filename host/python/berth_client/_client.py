"""The connection to a server: requests, replies, streams."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import urllib.parse
from typing import IO, Any, Iterator, Optional, Union

from ._errors import BerthError, _error_class
from ._sandbox import Sandbox
from ._types import API, _CHUNK, ExecEvent, _event


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

    def _blocks(self, method: str, path: str, **kw: Any) -> Iterator[bytes]:
        """The body of a streamed response in whole blocks (far cheaper to
        split here than ``readline`` on a chunked body). Closing it — or a
        reader that stops early — closes the connection, which stops the
        command (the server sees the connection go)."""
        response = self._open(method, path, **kw)
        try:
            while True:
                block = response.read1(1 << 20)
                if not block:
                    return
                yield block
        finally:
            response.close()
            response._berth_conn.close()

    def _frames(self, method: str, path: str, **kw: Any) -> Iterator[ExecEvent]:
        """Events of a stream in binary frames (``framing: "binary"``):
        a kind byte (1 stdout, 2 stderr, 0 a JSON event), a 4-byte
        big-endian length, the payload — output with no base64 and no JSON
        parse."""
        with contextlib.closing(self._blocks(method, path, **kw)) as blocks:
            pending = b""
            for block in blocks:
                pending = pending + block if pending else block
                at, end = 0, len(pending)
                while end - at >= 5:
                    size = int.from_bytes(pending[at + 1 : at + 5], "big")
                    if end - at - 5 < size:
                        break
                    kind, body = pending[at], pending[at + 5 : at + 5 + size]
                    at += 5 + size
                    if kind == 1:
                        yield ExecEvent("stdout", data=body)
                    elif kind == 2:
                        yield ExecEvent("stderr", data=body)
                    elif kind == 0:
                        yield _event(json.loads(body))
                    else:
                        raise BerthError(502, "protocol", f"unknown frame kind {kind}")
                pending = pending[at:]
            if pending:
                raise BerthError(502, "protocol", "the stream ended inside a frame")

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

    # -- warm pools -----------------------------------------------------------

    def create_pool(
        self,
        name: str,
        size: int,
        *,
        backend: Union[str, dict, None] = None,
        image: Optional[str] = None,
        snapshot: Optional[str] = None,
        **options: Any,
    ) -> dict:
        """Makes a warm pool: the server keeps ``size`` sandboxes of this
        template started and open, refilled in the background, so that
        :meth:`claim` hands one over at once. ``backend``, ``image``,
        ``snapshot`` and ``options`` are as :meth:`create` takes them
        (``memory="2GiB"``, ``dedup_keep=...``). Returns the pool:
        ``name``, ``size``, ``ready``, ``members``, ``making``,
        ``template``."""
        body = {"name": name, "size": size, **options}
        for key, value in (("backend", backend), ("image", image), ("snapshot", snapshot)):
            if value is not None:
                body[key] = value
        return self._json("POST", f"{API}/pools", json_body=body)

    def pools(self) -> list:
        """Every warm pool, with its members ready in the server."""
        return self._json("GET", f"{API}/pools")

    def pool(self, name: str) -> dict:
        """One warm pool (``ready``: members a claim gets at once)."""
        return self._json("GET", f"{API}/pools/{urllib.parse.quote(name, safe='')}")

    def remove_pool(self, name: str) -> int:
        """Removes a warm pool: every member shut down and forgotten
        (sandboxes claimed from it stay). Returns how many were removed."""
        reply = self._json("DELETE", f"{API}/pools/{urllib.parse.quote(name, safe='')}")
        return int(reply["members_removed"])

    def claim(self, name: str, pool: str, *, workspace: Optional[dict] = None) -> "Sandbox":
        """A sandbox ``name`` from warm pool ``pool``: a started member
        handed over with ``workspace`` applied (no bind mounts, the default
        root), or, when none is ready, one created cold from the pool's
        template. Either way it is running when this returns; the
        sandbox's ``claimed`` says which (``{"pool", "warm", "reason"}``)."""
        body: dict = {"name": name, "from_pool": pool}
        if workspace is not None:
            body["workspace"] = workspace
        reply = self._json("POST", f"{API}/sandboxes", json_body=body)
        sandbox = Sandbox(self, name)
        sandbox.claimed = reply.get("claimed")
        return sandbox


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
