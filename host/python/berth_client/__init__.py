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

A sandbox created with ``checkpoint_each_exec=True`` (and a ``remote:``
snapshot) writes a generation after every command, on the server:
``box.history()``, ``box.diff(1, 3)``, ``box.rewind(2)``,
``box.checkpoint("before the refactor")``.

Every method raises :class:`BerthError` (or one of its subclasses) with the
server's code and message when the server refuses.
"""

from ._client import Berth, default_socket
from ._errors import (
    BerthError,
    Conflict,
    GenerationNotKept,
    NotFound,
    PathRefused,
    PlacementFailed,
    Stale,
    TooLarge,
    Unauthorized,
)
from ._sandbox import Files, Sandbox
from ._types import (
    Checkpointed,
    Diff,
    ExecEvent,
    ExecResult,
    FileEntry,
    Generation,
    History,
    PathDiff,
    Process,
)

__all__ = [
    "Berth",
    "Sandbox",
    "Files",
    "ExecResult",
    "ExecEvent",
    "Process",
    "FileEntry",
    "Checkpointed",
    "Generation",
    "History",
    "Diff",
    "PathDiff",
    "BerthError",
    "NotFound",
    "Conflict",
    "PathRefused",
    "Unauthorized",
    "PlacementFailed",
    "Stale",
    "TooLarge",
    "GenerationNotKept",
    "default_socket",
]
