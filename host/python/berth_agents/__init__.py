"""Berth as a sandbox provider for the OpenAI Agents SDK (``openai-agents``).

Shaped like the SDK's own provider extensions (E2B, Daytona, Modal,
Runloop): a client that creates, resumes and deletes sessions and
(de)serialises their state, and a session that runs commands, reads and
writes files, persists and hydrates the workspace, and runs PTY processes.
Sandboxes are Berth's (self-hosted, Docker by default, snapshots in any
Berth store, plugin stores included), reached through ``berth serve``::

    from agents.sandbox import Manifest
    from berth_agents import BerthSandboxClient, BerthSandboxClientOptions

    client = BerthSandboxClient()                      # the local berth server
    session = await client.create(
        manifest=Manifest(root="/workspace"),
        options=BerthSandboxClientOptions(image="python:3.12-slim"),
    )
    async with session:
        result = await session.exec("python --version")
    saved = client.serialize_session_state(session.state)   # JSON-able
    # later, in another process:
    session = await client.resume(client.deserialize_session_state(saved))

``session.stop()`` persists the workspace twice over: through the SDK's
snapshot when one was given, and into the Berth sandbox's own snapshot, so a
resume brings the workspace back even when its container is gone.
"""

from .sandbox import (
    BerthSandboxClient,
    BerthSandboxClientOptions,
    BerthSandboxSession,
    BerthSandboxSessionState,
    BerthSecret,
)

__all__ = [
    "BerthSandboxClient",
    "BerthSandboxClientOptions",
    "BerthSandboxSession",
    "BerthSandboxSessionState",
    "BerthSecret",
]
