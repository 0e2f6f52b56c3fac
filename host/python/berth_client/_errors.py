"""The errors the server's refusals raise."""

from __future__ import annotations

__all__ = [
    "BerthError",
    "NotFound",
    "Conflict",
    "PathRefused",
    "Unauthorized",
    "TooLarge",
    "PlacementFailed",
    "Stale",
    "GenerationNotKept",
]


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


class GenerationNotKept(NotFound):
    """The generation asked for is not kept (collected, or never written);
    ``message`` lists the kept ones."""


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
    if code == "generation_not_kept":
        return GenerationNotKept
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    return BerthError
