"""The OpenAI Agents SDK provider (berth_agents) against a real `berth serve`
(BERTH_SOCKET) and a real Docker engine, driven through the SDK's session
and tool layer without a model. Needs `openai-agents` (the version pinned in
host/python/requirements-agents.txt); `cargo xtask test` runs it in the venv
it makes for it."""

import asyncio
import io
import json
import os
import shutil
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

from berth_agents import BerthSandboxClient, BerthSandboxClientOptions, BerthSecret
from berth_client import NotFound

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


class AgentsProviderLikeTheSdksTest(unittest.TestCase):
    """Where the SDK's own providers set the behaviour: a sandbox the
    SDK's runner deleted (as it does when a run pauses for approval) comes
    back on resume, and a refused mount's error is redacted."""

    def test_a_resume_after_the_sdk_deleted_the_sandbox_makes_it_again(self):
        asyncio.run(self._deleted_then_resumed())

    async def _deleted_then_resumed(self):
        from agents.sandbox.snapshot import LocalSnapshotSpec

        client = BerthSandboxClient()
        manifest = Manifest(root="/workspace", entries={"README.md": File(content=b"# task\n")})
        # The SDK's own snapshot (its runner's default is a local one):
        # what it restores into the sandbox made again.
        snapshots = tempfile.mkdtemp(prefix="berth-sdk-snapshots-")
        self.addCleanup(shutil.rmtree, snapshots, True)
        session = await client.create(
            manifest=manifest,
            snapshot=LocalSnapshotSpec(base_path=Path(snapshots)),
            options=BerthSandboxClientOptions(image=IMAGE),
        )
        await session.start()
        await session.write(Path("/workspace/work.txt"), io.BytesIO(b"done before the pause\n"))
        await session.stop()
        saved = client.serialize_session_state(session.state)
        name = session.state.sandbox_name
        await client.delete(session)
        with self.assertRaises(NotFound):
            client.berth.sandbox(name).inspect()

        session = await client.resume(client.deserialize_session_state(saved))
        async with session:
            self.assertEqual(await _read(session, Path("/workspace/README.md")), b"# task\n")
            self.assertEqual(await _read(session, Path("/workspace/work.txt")), b"done before the pause\n")
        self.assertIn(name, [s["name"] for s in client.berth.sandboxes()])
        await client.delete(session)

    def test_a_deleted_sandbox_with_secrets_needs_their_values_to_come_back(self):
        asyncio.run(self._secrets_on_resume())

    async def _secrets_on_resume(self):
        value = "sk-agents-" + os.urandom(8).hex()
        secrets = {"API_KEY": BerthSecret(value=value, hosts=("api.pkg.test",))}
        options = BerthSandboxClientOptions(image=IMAGE, allow_hosts=("api.pkg.test",), secrets=secrets)
        client = BerthSandboxClient()
        session = await client.create(manifest=Manifest(root="/workspace"), options=options)
        await session.start()
        await session.stop()
        saved = client.serialize_session_state(session.state)
        self.assertNotIn(value, json.dumps(saved))
        await client.delete(session)

        # A fresh client has no value to give the sandbox made again.
        stranger = BerthSandboxClient()
        with self.assertRaises(ValueError) as refused:
            await stranger.resume(stranger.deserialize_session_state(saved))
        self.assertIn("API_KEY", str(refused.exception))
        self.assertNotIn(value, str(refused.exception))

        # Given the values, it comes back holding the placeholder.
        friend = BerthSandboxClient(secrets=secrets)
        session = await friend.resume(friend.deserialize_session_state(saved))
        async with session:
            shown = (await session.exec('printf %s "$API_KEY"')).stdout.decode()
            self.assertTrue(shown.startswith("BERTH_SECRET_API_KEY_"), shown)
        await friend.delete(session)

    def test_argv_without_a_shell_runs_as_given(self):
        asyncio.run(self._argv())

    async def _argv(self):
        client = BerthSandboxClient()
        session = await client.create(manifest=Manifest(root="/workspace"), options=BerthSandboxClientOptions(image=IMAGE))
        async with session:
            # shell=False: the SDK gives argv, which reaches the program
            # untouched (its Docker provider passes it to `docker exec`).
            words = ["$HOME", "*", "a b", "it's"]
            given = await session.exec("printf", "[%s]", *words, shell=False)
            self.assertEqual(given.stdout.decode(), "".join(f"[{w}]" for w in words))
            # shell=True (the default): the SDK's own `sh -lc LINE`.
            line = await session.exec('printf "[%s]" "$HOME"')
            self.assertNotEqual(line.stdout.decode(), "[$HOME]")
            # A program named as a shell builtin runs, not the builtin (the
            # image's PATH is /bin).
            await session.exec("printf '#!/bin/sh\\necho the program\\n' > /bin/cd && chmod +x /bin/cd")
            self.assertEqual((await session.exec("cd", shell=False)).stdout, b"the program\n")
            missing = await session.exec("berth-no-such-program", shell=False)
            self.assertEqual(missing.exit_code, 127)
        await client.delete(session)

    def test_a_refused_mount_is_redacted_as_the_sdks_providers_do(self):
        asyncio.run(self._refused_mount())

    async def _refused_mount(self):
        import traceback

        from agents.sandbox.entries.mounts.base import DockerVolumeMountStrategy
        from agents.sandbox.entries.mounts.providers.s3 import S3Mount
        from agents.sandbox.errors import MountConfigError

        key, secret = "AKIA" + os.urandom(6).hex().upper(), os.urandom(12).hex()
        manifest = Manifest(
            root="/workspace",
            entries={
                "data": S3Mount(
                    bucket="bucket",
                    access_key_id=key,
                    secret_access_key=secret,
                    mount_strategy=DockerVolumeMountStrategy(driver="rclone"),
                )
            },
        )
        client = BerthSandboxClient()
        before = {s["name"] for s in client.berth.sandboxes()}
        with self.assertRaises(MountConfigError) as refused:
            await client.create(manifest=manifest, options=BerthSandboxClientOptions(image=IMAGE))
        error = refused.exception
        told = "".join(traceback.format_exception(error)) + repr(getattr(error, "context", None))
        for leaked in (key, secret, "s3_mount", "access_key", "secret_access"):
            self.assertNotIn(leaked, told)
        self.assertEqual({s["name"] for s in client.berth.sandboxes()}, before)


async def _read(session, path):
    f = await session.read(path)
    try:
        return f.read()
    finally:
        f.close()




if __name__ == "__main__":
    unittest.main()
