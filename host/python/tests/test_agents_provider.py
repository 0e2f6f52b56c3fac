"""The OpenAI Agents SDK provider (berth_agents) against a real `berth serve`
(BERTH_SOCKET) and a real Docker engine, driven through the SDK's session
and tool layer without a model. Needs `openai-agents` (the version pinned in
host/python/requirements-agents.txt); `cargo xtask test` runs it in the venv
it makes for it."""

import asyncio
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from agents.sandbox import Manifest
from agents.sandbox.capabilities.tools.apply_patch_tool import SandboxApplyPatchTool
from agents.sandbox.capabilities.tools.shell_tool import ExecCommandArgs, ExecCommandTool
from agents.sandbox.entries import Dir, File
from agents.sandbox.errors import InvalidManifestPathError, WorkspaceReadNotFoundError

from berth_agents import BerthSandboxClient, BerthSandboxClientOptions

from tests import find_key

IMAGE = os.environ.get("BERTH_TEST_IMAGE", "berth-test:busybox")
HERE = Path(__file__).resolve().parent.parent

RESUME_SCRIPT = r"""
import asyncio, json, sys
from pathlib import Path
from berth_agents import BerthSandboxClient

async def main():
    client = BerthSandboxClient()
    state = client.deserialize_session_state(json.loads(Path(sys.argv[1]).read_text()))
    session = await client.resume(state)
    async with session:
        out = {}
        for name in ("README.md", "notes/todo.txt", "hello.txt", "blob.bin"):
            f = await session.read(Path("/workspace") / name)
            out[name] = f.read().hex()
            f.close()
        out["ls"] = (await session.exec("ls -a /workspace")).stdout.decode()
    await client.delete(session)
    print(json.dumps(out))

asyncio.run(main())
"""


class AgentsProviderTest(unittest.TestCase):
    def test_session_tools_persist_and_resume_in_a_fresh_process(self):
        asyncio.run(self._scenario())

    async def _scenario(self):
        client = BerthSandboxClient()
        manifest = Manifest(
            root="/workspace",
            entries={
                "README.md": File(content=b"# task\nline two\n"),
                "notes": Dir(children={"todo.txt": File(content=b"first\n")}),
            },
        )
        session = await client.create(
            manifest=manifest, options=BerthSandboxClientOptions(image=IMAGE)
        )
        await session.start()
        root = Path("/workspace")

        # Manifest entries were materialised by the SDK through the provider.
        self.assertEqual(await _read(session, root / "README.md"), b"# task\nline two\n")
        self.assertEqual(await _read(session, root / "notes/todo.txt"), b"first\n")

        # The shell tool, one-shot and on a PTY.
        shell = ExecCommandTool(session=session)
        out = await shell.run(ExecCommandArgs(cmd="cat README.md; echo done"))
        self.assertIn("Process exited with code 0", out)
        self.assertIn("line two", out)
        self.assertIn("done", out)
        failed = await shell.run(ExecCommandArgs(cmd="exit 5"))
        self.assertIn("code 5", failed)
        interactive = await shell.run(ExecCommandArgs(cmd="read x; echo got-$x", tty=True, yield_time_ms=500))
        self.assertIn("Process running with session ID", interactive)
        session_id = int(interactive.split("session ID ")[1].split()[0])
        update = await session.pty_write_stdin(session_id=session_id, chars="hi\n", yield_time_s=3)
        self.assertIn(b"got-hi", update.output)
        self.assertEqual(update.exit_code, 0)

        # apply_patch: add a file, update one.
        patch = SandboxApplyPatchTool(session=session)
        await patch._on_invoke_tool(
            None,
            "*** Begin Patch\n*** Add File: hello.txt\n+hello from a patch\n"
            "*** Update File: notes/todo.txt\n@@\n-first\n+first, patched\n*** End Patch\n",
        )
        # (The SDK's patch format writes added files without a final newline.)
        self.assertEqual((await _read(session, root / "hello.txt")).rstrip(b"\n"), b"hello from a patch")
        self.assertEqual(await _read(session, root / "notes/todo.txt"), b"first, patched\n")

        # Binary writes, byte for byte.
        blob = os.urandom(200_000)
        await session.write(root / "blob.bin", io.BytesIO(blob))
        self.assertEqual(await _read(session, root / "blob.bin"), blob)

        # Escapes are refused as the SDK refuses them.
        for bad in (Path("/etc/passwd"), Path("../outside.txt")):
            with self.assertRaises(InvalidManifestPathError):
                await session.read(bad)
        with self.assertRaises(InvalidManifestPathError):
            await session.write(Path("/etc/evil"), io.BytesIO(b"x"))
        await session.exec("ln -s /etc /workspace/link")
        with self.assertRaises(InvalidManifestPathError):
            await session.read(root / "link/passwd")
        await session.exec("rm /workspace/link")
        with self.assertRaises(WorkspaceReadNotFoundError):
            await session.read(root / "missing.txt")

        # persist_workspace / hydrate_workspace: a tar of the workspace.
        archive = await session.persist_workspace()
        data = archive.read()
        archive.close()
        self.assertGreater(len(data), 200_000)

        # Persist (the SDK's stop also stops the Berth sandbox), serialise,
        # then remove the container behind everyone's back.
        await session.stop()
        saved = client.serialize_session_state(session.state)
        record = client.berth.sandbox(session.state.sandbox_name).inspect()
        container = find_key(record["state"], "container_id")
        self.assertTrue(container)
        subprocess.run(["docker", "rm", "-f", container], check=True, capture_output=True)

        # A fresh Python process resumes from the serialised state alone.
        with tempfile.TemporaryDirectory() as tmp:
            state_file = Path(tmp) / "state.json"
            state_file.write_text(json.dumps(saved))
            done = subprocess.run(
                [sys.executable, "-c", RESUME_SCRIPT, str(state_file)],
                cwd=HERE,
                capture_output=True,
                text=True,
                timeout=300,
            )
        self.assertEqual(done.returncode, 0, done.stderr)
        files = json.loads(done.stdout.strip().splitlines()[-1])
        self.assertEqual(bytes.fromhex(files["README.md"]), b"# task\nline two\n")
        self.assertEqual(bytes.fromhex(files["notes/todo.txt"]), b"first, patched\n")
        self.assertEqual(bytes.fromhex(files["hello.txt"]).rstrip(b"\n"), b"hello from a patch")
        self.assertEqual(bytes.fromhex(files["blob.bin"]), blob)


async def _read(session, path):
    f = await session.read(path)
    try:
        return f.read()
    finally:
        f.close()




if __name__ == "__main__":
    unittest.main()
