"""The Berth sandbox client and session for the OpenAI Agents SDK.

Every call goes to ``berth serve`` through :mod:`berth_client` (blocking
HTTP on a worker thread, so the event loop never waits on the network).
Paths are the SDK's: absolute under the manifest's root, which is the Berth
workspace's root; the SDK checks them (its path helper runs in the sandbox)
and Berth's file API checks them again (``openat2`` beneath the root).
"""

from __future__ import annotations

import asyncio
import io
import shlex
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Optional

from agents.sandbox._mount_security import redact_mount_error_data
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.runtime_helpers import (
    RESOLVE_WORKSPACE_PATH_HELPER,
    RuntimeHelperScript,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from pydantic import BaseModel, Field, SecretStr

import berth_client
from berth_client import Berth, BerthError, NotFound, PathRefused

# Commands without a timeout still end: a day, as Berth counts.
_UNBOUNDED_EXEC_S = 24 * 3600.0
# Files above this stay on disk while they travel, not in memory.
_SPOOL_BYTES = 4 << 20
# What a command's stdin may carry when a write goes outside the workspace
# (an extra path grant) and so cannot use the file API.
_EXEC_WRITE_MAX = 512 << 10


class BerthSandboxClientOptions(BaseSandboxClientOptions):
    """What to create: a Berth sandbox on ``backend`` (``docker`` by default)
    from ``image``, its snapshot in ``snapshot`` (Berth's grammar: ``local``,
    ``remote:MANIFEST`` for a plugin store, …). ``allow_hosts`` (with
    ``deny_hosts``, ``allow_cidrs``) holds it to an egress policy: default
    deny, enforced on Berth's host; its tools reach the allowed hosts
    through the proxy variables Berth sets. ``secrets`` (name →
    ``BerthSecret``) keeps credentials out of the sandbox: it sees a
    placeholder, which Berth's egress point replaces with the value in
    requests to the secret's hosts only."""

    type: Literal["berth"] = "berth"
    image: Optional[str] = None
    backend: str = "docker"
    snapshot: str = "local"
    name: Optional[str] = None
    network: Optional[str] = None
    memory: Optional[int] = None
    cpus: Optional[float] = None
    exposed_ports: tuple[int, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    allow_hosts: Optional[tuple[str, ...]] = None
    deny_hosts: tuple[str, ...] = ()
    allow_cidrs: tuple[str, ...] = ()
    secrets: dict[str, "BerthSecret"] = Field(default_factory=dict)


class BerthSecret(BaseModel):
    """A secret's value (never shown in a repr or a dump) and the hosts it
    is sent to."""

    value: SecretStr
    hosts: tuple[str, ...]


BerthSandboxClientOptions.model_rebuild()


class BerthSandboxSessionState(SandboxSessionState):
    """What a session needs to come back: the Berth sandbox's name (Berth
    keeps the rest: its container, engine and snapshot) — and what made it,
    so a sandbox the SDK deleted (as its runner does when a run pauses for
    approval) is made again on resume. Secrets are kept by name and hosts
    only: their values never enter the SDK's serialised state."""

    type: Literal["berth"] = "berth"
    sandbox_name: str
    backend: str = "docker"
    image: Optional[str] = None
    berth_snapshot: str = "local"
    base_env: dict[str, str] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)
    secret_hosts: dict[str, tuple[str, ...]] = Field(default_factory=dict)


@dataclass
class _PtyEntry:
    exec_id: Optional[str] = None
    tty: bool = False
    output_chunks: deque = field(default_factory=deque)
    output_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    output_notify: asyncio.Event = field(default_factory=asyncio.Event)
    output_closed: asyncio.Event = field(default_factory=asyncio.Event)
    started: threading.Event = field(default_factory=threading.Event)
    last_used: float = field(default_factory=time.monotonic)
    exit_code: Optional[int] = None
    error: Optional[BaseException] = None
    thread: Optional[threading.Thread] = None


def _run(fn, *args, **kwargs):
    return asyncio.to_thread(fn, *args, **kwargs)


class BerthSandboxSession(BaseSandboxSession):
    """A session on one Berth sandbox."""

    state: BerthSandboxSessionState

    def __init__(self, *, state: BerthSandboxSessionState, berth: Berth):
        self.state = state
        self._berth = berth
        self._box = berth.sandbox(state.sandbox_name)
        self._pty_lock = asyncio.Lock()
        self._pty_processes: dict[int, _PtyEntry] = {}
        self._reserved_pty_process_ids: set[int] = set()

    @classmethod
    def from_state(cls, state: BerthSandboxSessionState, *, berth: Berth) -> "BerthSandboxSession":
        return cls(state=state, berth=berth)

    @property
    def sandbox_name(self) -> str:
        return self.state.sandbox_name

    # -- paths ------------------------------------------------------------

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        return await self._validate_remote_path_access(path, for_write=for_write)

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    def _current_runtime_helper_cache_key(self) -> object | None:
        return self.state.sandbox_name

    def _relative(self, workspace_path: Path) -> Optional[str]:
        """``workspace_path`` relative to the root, or None outside it."""
        root = PurePosixPath(self.state.manifest.root)
        p = PurePosixPath(str(workspace_path))
        if not p.is_absolute():
            return p.as_posix()
        try:
            rel = p.relative_to(root)
        except ValueError:
            return None
        return "" if rel.as_posix() == "." else rel.as_posix()

    # -- commands ---------------------------------------------------------

    async def _env(self) -> dict[str, str]:
        manifest_env = await self.state.manifest.environment.resolve()
        return {**self.state.base_env, **manifest_env}

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        # The SDK hands argv (``sh -lc LINE`` when it wants a shell): run
        # as given, with no shell of Berth's around it, as its Docker
        # provider does.
        argv = [str(c) for c in command]
        limit = _UNBOUNDED_EXEC_S if timeout is None else max(float(timeout), 0.001)
        env = await self._env()
        try:
            result = await _run(self._box.exec, argv, timeout=limit, env=env)
        except BerthError as e:
            raise ExecTransportError(command=command, cause=e, message=e.message) from e
        except OSError as e:
            raise ExecTransportError(command=command, cause=e, retryable=True) from e
        if result.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        return ExecResult(stdout=result.stdout_bytes, stderr=result.stderr_bytes, exit_code=result.exit_code)

    async def _exec_with_stdin(self, text: str, stdin: bytes) -> berth_client.ExecResult:
        return await _run(self._box.exec, text, timeout=300.0, env=await self._env(), stdin=stdin)

    # -- files ------------------------------------------------------------

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        if user is not None:
            await self._check_read_with_exec(path, user=user)
        workspace_path = await self._validate_path_access(path)
        rel = self._relative(workspace_path)
        if rel is None:
            # An extra path grant outside the workspace: the file API stops
            # at the root, so the bytes come through a command.
            r = await _run(self._box.exec, f"cat -- {shlex.quote(str(workspace_path))}", timeout=300.0)
            if r.exit_code != 0:
                if "No such file" in r.stderr:
                    raise WorkspaceReadNotFoundError(path=path)
                raise WorkspaceArchiveReadError(path=path, context={"reason": r.stderr.strip()})
            return io.BytesIO(r.stdout_bytes)

        def fetch() -> io.IOBase:
            out = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)
            for chunk in self._box.files.iter_read(rel):
                out.write(chunk)
            out.seek(0)
            return out

        try:
            return await _run(fetch)
        except NotFound as e:
            raise WorkspaceReadNotFoundError(path=path, cause=e) from e
        except PathRefused as e:
            raise WorkspaceArchiveReadError(path=path, context={"reason": "path_refused"}, cause=e) from e
        except (BerthError, OSError) as e:
            raise WorkspaceArchiveReadError(path=path, cause=e) from e

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        workspace_path = await self._validate_path_access(path, for_write=True)
        rel = self._relative(workspace_path)

        def spool() -> tuple[Any, int]:
            out = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)
            n = 0
            while True:
                chunk = data.read(1 << 20)
                if not chunk:
                    break
                if isinstance(chunk, str):
                    chunk = chunk.encode("utf-8")
                if not isinstance(chunk, (bytes, bytearray, memoryview)):
                    raise WorkspaceWriteTypeError(path=path, actual_type=type(chunk).__name__)
                out.write(chunk)
                n += len(chunk)
            out.seek(0)
            return out, n

        body, length = await _run(spool)
        try:
            if rel is None:
                if length > _EXEC_WRITE_MAX:
                    raise WorkspaceArchiveWriteError(
                        path=workspace_path,
                        context={"reason": f"outside the workspace, writes are capped at {_EXEC_WRITE_MAX} bytes"},
                    )
                target = shlex.quote(str(workspace_path))
                r = await self._exec_with_stdin(
                    f"mkdir -p -- $(dirname -- {target}) && cat > {target}", body.read()
                )
                if r.exit_code != 0:
                    raise WorkspaceArchiveWriteError(path=workspace_path, context={"reason": r.stderr.strip()})
                return
            parent = PurePosixPath(rel).parent.as_posix()
            if parent not in ("", "."):
                await _run(self._box.files.mkdir, parent, parents=True)
            await _run(self._box.files.write, rel, body, length=length)
        except (BerthError, OSError) as e:
            raise WorkspaceArchiveWriteError(path=workspace_path, cause=e) from e
        finally:
            body.close()

    async def running(self) -> bool:
        try:
            record = await _run(self._box.inspect)
        except (BerthError, OSError):
            return False
        return bool(record.get("state", {}).get("workspace_root_ready"))

    # -- the workspace as a tar stream ----------------------------------

    async def persist_workspace(self) -> io.IOBase:
        def fetch() -> io.IOBase:
            out = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)
            self._box.persist(out)
            out.seek(0)
            return out

        try:
            return await _run(fetch)
        except (BerthError, OSError) as e:
            raise WorkspaceArchiveReadError(path=self._workspace_root_path(), cause=e) from e

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        try:
            await _run(self._box.hydrate, data)
        except (BerthError, OSError) as e:
            raise WorkspaceArchiveWriteError(path=self._workspace_root_path(), cause=e) from e

    # -- lifecycle --------------------------------------------------------

    async def _after_stop(self) -> None:
        # The SDK persisted through its own snapshot (if any); Berth persists
        # into the sandbox's snapshot too, which is what a resume restores
        # once the container is gone.
        try:
            await _run(self._box.stop)
        except BerthError as e:
            raise WorkspaceArchiveWriteError(
                path=self._workspace_root_path(), context={"reason": "berth_stop"}, cause=e
            ) from e

    async def _shutdown_backend(self) -> None:
        try:
            await _run(self._box.shutdown)
        except NotFound:
            pass

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        ports = await _run(self._box.ports)
        for p in ports:
            if p["port"].split("/")[0] == str(port):
                host, _, number = p["address"].rpartition(":")
                return ExposedPortEndpoint(host=host, port=int(number))
        return await super()._resolve_exposed_port(port)

    # -- processes on a terminal -----------------------------------------

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        argv = [str(a) for a in self._prepare_exec_command(*command, shell=shell, user=user)]
        limit = _UNBOUNDED_EXEC_S if timeout is None else max(float(timeout), 0.001)
        env = await self._env()
        loop = asyncio.get_running_loop()
        entry = _PtyEntry(tty=tty)

        def pump() -> None:
            def push(chunk: bytes | None, code: Optional[int] = None) -> None:
                if chunk:
                    entry.output_chunks.append(chunk)
                if code is not None:
                    entry.exit_code = code
                    entry.output_closed.set()
                entry.output_notify.set()

            try:
                stream = self._box.exec_stream(
                    argv,
                    timeout=limit,
                    env=env,
                    interactive=True,
                    pty=(24, 80) if tty else None,
                )
                for event in stream:
                    if event.kind == "started":
                        entry.exec_id = event.exec_id
                        entry.started.set()
                    elif event.kind in ("stdout", "stderr"):
                        loop.call_soon_threadsafe(push, event.data)
                    elif event.kind == "exit":
                        loop.call_soon_threadsafe(push, None, event.exit_code)
                        return
                loop.call_soon_threadsafe(push, None, -1)
            except BaseException as e:  # noqa: BLE001 - reported to the waiter
                entry.error = e
                loop.call_soon_threadsafe(push, None, -1)
            finally:
                entry.started.set()

        entry.thread = threading.Thread(target=pump, name="berth-pty", daemon=True)
        entry.thread.start()
        await _run(entry.started.wait, 30)
        if entry.exec_id is None and entry.error is not None:
            raise ExecTransportError(command=command, cause=entry.error)
        pruned: Optional[_PtyEntry] = None
        async with self._pty_lock:
            process_id = allocate_pty_process_id(self._reserved_pty_process_ids)
            self._reserved_pty_process_ids.add(process_id)
            if len(self._pty_processes) >= PTY_PROCESSES_MAX:
                meta = [(pid, e.last_used, e.output_closed.is_set()) for pid, e in self._pty_processes.items()]
                victim = process_id_to_prune_from_meta(meta)
                if victim is not None:
                    self._reserved_pty_process_ids.discard(victim)
                    pruned = self._pty_processes.pop(victim, None)
            self._pty_processes[process_id] = entry
        if pruned is not None:
            await self._terminate(pruned)
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._pty_update(process_id, entry, clamp_pty_yield_time_ms(yield_ms), max_output_tokens)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._pty_processes, session_id=session_id)
        if chars:
            if entry.exit_code is None and entry.exec_id is not None:
                await _run(self._box.send_stdin, entry.exec_id, chars.encode("utf-8"), close=False)
            await asyncio.sleep(0.1)
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        entry.last_used = time.monotonic()
        return await self._pty_update(
            session_id,
            entry,
            resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=chars == ""),
            max_output_tokens,
        )

    async def _pty_update(
        self, process_id: int, entry: _PtyEntry, yield_ms: int, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        output, tokens, closed = await collect_pty_output(
            output_chunks=entry.output_chunks,
            output_lock=entry.output_lock,
            output_notify=entry.output_notify,
            is_done=entry.output_closed.is_set,
            yield_time_ms=yield_ms,
            max_output_tokens=max_output_tokens,
        )
        exit_code = entry.exit_code if closed else None
        live: Optional[int] = process_id
        if exit_code is not None:
            async with self._pty_lock:
                self._pty_processes.pop(process_id, None)
                self._reserved_pty_process_ids.discard(process_id)
            live = None
        return PtyExecUpdate(process_id=live, output=output, exit_code=exit_code, original_token_count=tokens)

    async def _terminate(self, entry: _PtyEntry) -> None:
        if entry.exit_code is not None or entry.exec_id is None:
            return
        try:
            await _run(self._box.signal, entry.exec_id, "KILL")
        except BerthError:
            pass

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._pty_processes.values())
            self._pty_processes.clear()
            self._reserved_pty_process_ids.clear()
        for entry in entries:
            await self._terminate(entry)


class BerthSandboxClient(BaseSandboxClient[BerthSandboxClientOptions]):
    """Creates, resumes and deletes Berth sandboxes for the SDK. By default
    it talks to the local ``berth serve`` (see :func:`berth_client.default_socket`);
    pass a :class:`berth_client.Berth` for another."""

    backend_id = "berth"

    def __init__(
        self,
        berth: Optional[Berth] = None,
        *,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
        secrets: Optional[dict[str, "BerthSecret"]] = None,
    ) -> None:
        """``secrets`` gives the values of secrets a resumed session's
        sandbox needs when it must be made again (the session state keeps
        only their names and hosts); by default those given at create by
        this client."""
        self.berth = berth or Berth()
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies
        self._secrets: dict[str, BerthSecret] = dict(secrets or {})

    @redact_mount_error_data
    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: BerthSandboxClientOptions,
    ) -> SandboxSession:
        if options is None:
            raise ValueError("BerthSandboxClient.create requires options")
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        if options.backend == "docker" and not options.image:
            raise ValueError("BerthSandboxClientOptions needs `image` for the docker backend")
        session_id = uuid.uuid4()
        name = options.name or f"agents-{session_id.hex[:12]}"
        settings: dict[str, Any] = {}
        for key in ("network", "memory", "cpus"):
            value = getattr(options, key)
            if value is not None:
                settings[key] = value
        if options.exposed_ports:
            settings["expose"] = [str(p) for p in options.exposed_ports]
        if options.allow_hosts is not None or options.deny_hosts or options.allow_cidrs:
            settings["allow_hosts"] = list(options.allow_hosts or ())
            settings["deny_hosts"] = list(options.deny_hosts)
            settings["allow_cidrs"] = list(options.allow_cidrs)
        self._secrets.update(options.secrets)
        state = BerthSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_name=name,
            backend=options.backend,
            image=options.image,
            berth_snapshot=options.snapshot,
            base_env=dict(options.env),
            exposed_ports=options.exposed_ports,
            settings=settings,
            secret_hosts={key: tuple(secret.hosts) for key, secret in options.secrets.items()},
        )
        await self._make(state)
        inner = BerthSandboxSession.from_state(state, berth=self.berth)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def _make(self, state: BerthSandboxSessionState) -> None:
        """Creates and starts the Berth sandbox ``state`` describes."""
        settings = dict(state.settings)
        if state.secret_hosts:
            missing = sorted(set(state.secret_hosts) - set(self._secrets))
            if missing:
                raise ValueError(
                    f"sandbox {state.sandbox_name!r} must be made again, and the session state does not "
                    f"keep secret values: give {', '.join(missing)} as "
                    "BerthSandboxClient(secrets={name: BerthSecret(value=..., hosts=[...])})"
                )
            settings["secrets"] = {
                key: {"value": self._secrets[key].value.get_secret_value(), "hosts": list(hosts)}
                for key, hosts in state.secret_hosts.items()
            }
        # The SDK materialises its manifest itself: the Berth workspace is
        # only its root, which Berth makes, keeps and snapshots.
        await _run(
            self.berth.create,
            state.sandbox_name,
            backend=state.backend,
            image=state.image,
            workspace={"root": state.manifest.root, "environment": dict(state.base_env), "entries": {}},
            snapshot=state.berth_snapshot,
            start=True,
            **settings,
        )

    @redact_mount_error_data
    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, BerthSandboxSession):
            raise TypeError("BerthSandboxClient.delete expects a BerthSandboxSession")
        try:
            await _run(self.berth.sandbox(inner.state.sandbox_name).remove)
        except NotFound:
            pass
        return session

    @redact_mount_error_data
    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, BerthSandboxSessionState):
            raise TypeError("BerthSandboxClient.resume expects a BerthSandboxSessionState")
        state.assert_path_grants_rebound()
        box = self.berth.sandbox(state.sandbox_name)
        # Berth brings the sandbox back: reconnects a running container,
        # restarts a stopped one, re-creates a removed one and restores its
        # workspace from Berth's snapshot. A sandbox the SDK deleted is made
        # again from the state, empty: the SDK restores its own snapshot
        # into it, as it does for its Docker provider.
        try:
            started = await _run(box.start)
            preserved = started.get("kind") in ("reused", "attached", "restored")
        except NotFound:
            await self._make(state)
            preserved = False
        if not preserved:
            state.workspace_root_ready = False
        inner = BerthSandboxSession.from_state(state, berth=self.berth)
        inner._set_start_state_preserved(preserved, system=preserved)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, BerthSandboxSessionState)


__all__ = [
    "BerthSandboxClient",
    "BerthSandboxClientOptions",
    "BerthSandboxSession",
    "BerthSandboxSessionState",
    "BerthSecret",
]
