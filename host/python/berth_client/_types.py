"""What the API's replies become: results, events, records."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Optional

from ._errors import BerthError

API = "/v1"
_CHUNK = 256 * 1024


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
    checkpoint: Optional["Checkpointed"] = None
    """The generation written after it, when the sandbox checkpoints every
    command (or ``checkpoint=True`` was given)."""

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
            checkpoint=Checkpointed._from_json(d.get("checkpoint")),
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
    checkpoint: Optional["Checkpointed"] = None


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
            checkpoint=Checkpointed._from_json(d.get("checkpoint")),
        )
    if kind == "started":
        return ExecEvent("started", exec_id=d["exec_id"])
    if kind == "error":
        err = d["error"]
        raise BerthError(502, err["code"], err["message"])
    raise BerthError(502, "protocol", f"unknown event type {kind!r}")


@dataclass
class Checkpointed:
    """A checkpoint: the ``generation`` it wrote (``None`` when it failed,
    ``error`` then says why; a command's own result stands) and how long it
    took."""

    generation: Optional[int]
    duration_ms: int = 0
    error: Optional[dict] = None

    @classmethod
    def _from_json(cls, d: Optional[dict]) -> Optional["Checkpointed"]:
        if d is None:
            return None
        return cls(d.get("generation"), d.get("duration_ms", 0), d.get("error"))


@dataclass
class Generation:
    """One kept generation of a deduplicated snapshot.

    ``note`` says what wrote it: ``{"kind": "exec", "command", "exit_code",
    "started_ms", "duration_ms"}`` (a command's checkpoint), ``{"kind":
    "checkpoint", "message"}``, ``{"kind": "before-rewind", "to"}``, or
    ``None`` (a stop). ``changes`` counts the paths ``added``, ``changed``
    and ``removed`` since its parent."""

    number: int
    index: str
    digest: str
    size: int
    created: Optional[int] = None
    note: Optional[dict] = None
    changes: Optional[dict] = None
    stored_bytes: Optional[int] = None


@dataclass
class History:
    """The kept generations, oldest first, and the one the workspace
    descends from (``current``)."""

    generations: list
    current: Optional[int] = None

    @classmethod
    def _from_json(cls, d: dict) -> "History":
        return cls([Generation(**g) for g in d["generations"]], d.get("current"))


@dataclass
class PathDiff:
    """One path two generations differ by: ``change`` is ``added``,
    ``removed`` or ``modified`` (``what`` then lists ``kind``, ``mode``,
    ``size``, ``content``, ``target``)."""

    path: str
    change: str
    what: list
    kind: str


@dataclass
class Diff:
    """The paths generation ``from_`` and generation ``to`` differ by,
    sorted."""

    from_: int
    to: int
    paths: list

    @classmethod
    def _from_json(cls, d: dict) -> "Diff":
        return cls(d["from"], d["to"], [PathDiff(**p) for p in d["paths"]])
