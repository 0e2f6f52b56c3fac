"""The Python client against a real `berth serve` (BERTH_SOCKET) and a real
Docker engine (image BERTH_TEST_IMAGE). Run by `cargo xtask test` through
tests/server.rs; by hand: `berth serve &` then
`BERTH_SOCKET=... python3 -m unittest discover -s tests -t .` here."""

import contextlib
import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
import unittest
import uuid

from berth_client import (
    Berth,
    BerthError,
    Conflict,
    Diff,
    GenerationNotKept,
    History,
    NotFound,
    PathRefused,
    PlacementFailed,
    Stale,
    TooLarge,
    Unauthorized,
)
from berth_client._errors import _error_class

from tests import find_key

IMAGE = os.environ.get("BERTH_TEST_IMAGE", "berth-test:busybox")




class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.berth = Berth()
        cls.name = "py-" + uuid.uuid4().hex[:8]
        cls.box = cls.berth.create(
            cls.name,
            backend="docker",
            image=IMAGE,
            workspace={"entries": {"README.md": {"type": "file", "content": "# task\n"}}},
        )

    @classmethod
    def tearDownClass(cls):
        try:
            cls.box.remove()
        except NotFound:
            pass

    def test_a_exec_collects_text_bytes_and_exit_codes(self):
        r = self.box.exec("cat README.md; echo err >&2; exit 3")
        self.assertEqual(r.exit_code, 3)
        self.assertEqual(r.stdout, "# task\n")
        self.assertEqual(r.stderr, "err\n")
        binary = self.box.exec("printf '\\377\\000x'")
        self.assertEqual(binary.stdout_bytes, b"\xff\x00x")
        fed = self.box.exec("tr a-z A-Z", stdin=b"hello")
        self.assertEqual(fed.stdout, "HELLO")
        timed = self.box.exec("echo before; sleep 30", timeout=3)
        self.assertTrue(timed.timed_out)
        self.assertEqual(timed.stdout, "before\n")
        capped = self.box.exec("head -c 100000 /dev/zero", stdout_cap=1000)
        self.assertTrue(capped.truncated)
        self.assertEqual(len(capped.stdout_bytes), 1000)

    def test_a_exec_argv_runs_the_words_with_no_shell(self):
        words = ["$HOME", "a b", "*", "'", "", "x;y"]
        r = self.box.exec(["printf", "%s|", *words])
        self.assertEqual((r.exit_code, r.stdout), (0, "|".join(words) + "|"))
        streamed = b"".join(
            e.data for e in self.box.exec_stream(["printf", "%s|", *words]) if e.kind == "stdout"
        )
        self.assertEqual(streamed, ("|".join(words) + "|").encode())
        missing = self.box.exec(["berth-no-such-program"])
        self.assertEqual(missing.exit_code, 127)
        self.assertIn("not found", missing.stderr)
        with self.assertRaises(TypeError):
            self.box.exec([])
        with self.assertRaises(BerthError) as refused:
            self.box.client._json("POST", f"{self.box._path}/exec", json_body={"argv": []})
        self.assertEqual(refused.exception.status, 400)

    def test_b_exec_stream_yields_output_as_it_is_produced(self):
        times = []
        started = time.monotonic()
        out = b""
        code = None
        for event in self.box.exec_stream("echo one; sleep 1; echo two"):
            if event.kind == "stdout":
                times.append(time.monotonic() - started)
                out += event.data
            elif event.kind == "exit":
                code = event.exit_code
        self.assertEqual(out, b"one\ntwo\n")
        self.assertEqual(code, 0)
        # The first line came before the command ended.
        self.assertLess(times[0], times[-1] - 0.5)
        # A megabyte, intact.
        data = b""
        digest = None
        for event in self.box.exec_stream(
            "head -c 1048576 /dev/urandom > /tmp/r; cat /tmp/r; sha256sum /tmp/r | cut -d' ' -f1 >&2"
        ):
            if event.kind == "stdout":
                data += event.data
            elif event.kind == "stderr":
                digest = event.data.decode().strip()
        self.assertEqual(hashlib.sha256(data).hexdigest(), digest)

    def test_c_closing_a_stream_stops_its_command(self):
        stream = self.box.exec_stream("echo up; sleep 31; touch never")
        first = next(stream)
        self.assertEqual(first.kind, "stdout")
        stream.close()
        deadline = time.monotonic() + 10
        while True:
            procs = self.box.exec("ps -o args | grep -c '[s]leep 31' || true").stdout.strip()
            if procs == "0" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual(procs, "0")

    def test_d_interactive_stdin(self):
        stream = self.box.exec_stream("cat", interactive=True)
        started = next(stream)
        self.assertEqual(started.kind, "started")
        self.box.send_stdin(started.exec_id, b"typed\n")
        out = b""
        for event in stream:
            if event.kind == "stdout":
                out += event.data
            if event.kind == "exit":
                self.assertEqual(event.exit_code, 0)
        self.assertEqual(out, b"typed\n")

    def test_e_background_process_with_logs(self):
        p = self.box.detach("echo hello; echo oops >&2; sleep 1; echo bye; exit 4", name="job")
        self.assertEqual(p.id, "job")
        self.assertIn("job", [q.id for q in self.box.processes()])
        self.assertEqual(self.box.wait("job"), 4)
        self.assertEqual(self.box.process("job").state, "exited")
        out = b"".join(e.data for e in self.box.logs("job") if e.kind == "stdout")
        self.assertEqual(out, b"hello\nbye\n")
        err = b"".join(e.data for e in self.box.logs("job", tail=1) if e.kind == "stderr")
        self.assertEqual(err, b"oops\n")
        with self.assertRaises(BerthError) as refused:
            self.box.client._json("GET", f"{self.box._path}/processes/job/logs", query={"framing": "morse"})
        self.assertEqual(refused.exception.status, 400)
        with self.assertRaises(NotFound):
            self.box.process("nope")

    def test_f_files_write_read_stat_list_remove(self):
        payload = os.urandom(300_000)
        self.box.files.mkdir("data")
        self.assertEqual(self.box.files.write("data/blob.bin", payload), len(payload))
        self.assertEqual(self.box.files.read("data/blob.bin"), payload)
        self.assertEqual(self.box.files.stat("data/blob.bin").size, len(payload))
        self.box.files.write("data/script.sh", "echo hi\n", mode=0o755)
        self.assertEqual(self.box.files.stat("data/script.sh").mode & 0o777, 0o755)
        self.assertEqual(
            sorted(e.path for e in self.box.files.list("data")),
            ["data/blob.bin", "data/script.sh"],
        )
        self.box.files.mkdir("deep/er", parents=True)
        self.assertEqual(self.box.files.stat("deep/er").type, "dir")
        self.box.files.remove("deep", recursive=True)
        self.assertFalse(self.box.files.exists("deep"))
        with self.assertRaises(PathRefused):
            self.box.files.read("../../etc/passwd")
        with self.assertRaises(NotFound):
            self.box.files.read("missing.txt")

    def test_g_persist_and_hydrate(self):
        self.box.files.write("archived.txt", b"in the archive\n")
        buf = io.BytesIO()
        n = self.box.persist(buf)
        self.assertGreater(n, 0)
        buf.seek(0)
        names = tarfile.open(fileobj=buf).getnames()
        self.assertIn("archived.txt", [x.lstrip("./") for x in names])
        tar = io.BytesIO()
        with tarfile.open(fileobj=tar, mode="w") as t:
            data = b"hydrated\n"
            info = tarfile.TarInfo("from_tar.txt")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        got = self.box.hydrate(tar.getvalue())
        self.assertGreaterEqual(got["entries"], 1)
        self.assertEqual(self.box.files.read("from_tar.txt"), b"hydrated\n")

    def test_h_stop_then_resume_after_the_container_is_gone(self):
        self.box.files.write("kept.txt", b"survives\n")
        self.box.stop()
        record = self.box.inspect()
        container = find_key(record["state"], "container_id")
        self.assertTrue(container, f"no container id in {record['state']}")
        removed = subprocess.run(
            ["docker", "rm", "-f", container], capture_output=True, text=True
        )
        self.assertEqual(removed.returncode, 0, removed.stderr)
        gone = subprocess.run(["docker", "inspect", container], capture_output=True, text=True)
        self.assertNotEqual(gone.returncode, 0, "the container is still there")
        # Transparent resume: the next command restores the workspace.
        self.assertEqual(self.box.exec("cat kept.txt").stdout, "survives\n")
        started = self.box.start()
        self.assertIn("branch", started)

    def test_i_errors_are_typed(self):
        with self.assertRaises(NotFound):
            self.berth.sandbox("no-such-box").exec("true")
        with self.assertRaises(Conflict):
            self.berth.create(self.name, backend="docker", image=IMAGE)
        names = [s["name"] for s in self.berth.sandboxes()]
        self.assertIn(self.name, names)

    def test_j_defaults_are_listed_and_a_disk_quota_holds(self):
        defaults = self.berth.defaults()
        keys = [d["key"] for d in defaults["defaults"]]
        self.assertEqual(keys, ["memory", "pids", "cpus", "disk"])
        self.assertTrue(defaults["file"].endswith("config.toml"))
        name = "py-disk-" + uuid.uuid4().hex[:8]
        box = self.berth.create(name, backend="docker", image=IMAGE, disk="32MiB")
        try:
            full = box.exec("dd if=/dev/zero of=fill bs=1M count=64")
            self.assertNotEqual(full.exit_code, 0)
            self.assertIn("No space left", full.stderr)
            self.assertEqual(box.exec("rm fill && echo room").stdout, "room\n")
        finally:
            box.remove()


    def test_k_an_egress_policy_allows_its_host_logs_the_rest_and_changes(self):
        import http.server
        import threading

        class Hello(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = ("hello from " + self.headers.get("Host", "-") + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        name = "py-egress-" + uuid.uuid4().hex[:8]
        box = self.berth.create(
            name,
            backend="docker",
            image=IMAGE,
            allow_hosts=[f"a.pkg.test:{port}"],
            allow_cidrs=[f"127.0.0.0/8:{port}"],
            test_resolve=["*.pkg.test=127.0.0.1"],
        )
        try:
            ok = box.exec(f"wget -qO- http://a.pkg.test:{port}/")
            self.assertEqual((ok.exit_code, ok.stdout), (0, f"hello from a.pkg.test:{port}\n"))
            self.assertNotEqual(box.exec(f"wget -qO- http://b.pkg.test:{port}/").exit_code, 0)
            report = box.egress()
            self.assertTrue(report["running"])
            verdicts = [(c["host"], c["verdict"]) for c in report["connections"]]
            self.assertEqual(verdicts, [("a.pkg.test", "allowed"), ("b.pkg.test", "denied")])
            self.assertIn("b.pkg.test", report["connections"][1]["reason"])
            report = box.set_egress(
                allow_hosts=[f"b.pkg.test:{port}"], allow_cidrs=[f"127.0.0.0/8:{port}"]
            )
            self.assertEqual(report["policy"]["allow_hosts"], [f"b.pkg.test:{port}"])
            ok = box.exec(f"wget -qO- http://b.pkg.test:{port}/")
            self.assertEqual((ok.exit_code, ok.stdout), (0, f"hello from b.pkg.test:{port}\n"))
            self.assertNotEqual(box.exec(f"wget -qO- http://a.pkg.test:{port}/").exit_code, 0)
            with self.assertRaises(BerthError) as refused:
                box.set_egress(allow_hosts=["bad host!"])
            self.assertEqual(refused.exception.status, 400)
        finally:
            box.remove()
            server.shutdown()

    def test_l_a_secret_is_a_placeholder_inside_and_never_given_back(self):
        value = "sk-py-" + uuid.uuid4().hex
        with self.assertRaises(BerthError) as refused:
            self.berth.create(
                "py-secret-refused",
                backend="docker",
                image=IMAGE,
                allow_hosts=["other.pkg.test"],
                secrets={"API_KEY": {"value": value, "hosts": ["api.pkg.test"]}},
            )
        self.assertEqual(refused.exception.status, 400)
        self.assertIn("--allow-host api.pkg.test", str(refused.exception))
        self.assertNotIn(value, str(refused.exception))
        name = "py-secret-" + uuid.uuid4().hex[:8]
        box = self.berth.create(
            name,
            backend="docker",
            image=IMAGE,
            allow_hosts=["api.pkg.test"],
            secrets={"API_KEY": {"value": value, "hosts": ["api.pkg.test"]}},
        )
        try:
            placeholder = box.exec('printf %s "$API_KEY"').stdout
            self.assertTrue(placeholder.startswith("BERTH_SECRET_API_KEY_"), placeholder)
            report = box.egress()
            self.assertEqual(
                report["secrets"],
                [{"name": "API_KEY", "hosts": ["api.pkg.test"], "placeholder": placeholder}],
            )
            self.assertNotIn(value, json.dumps(report))
            self.assertNotIn(value, json.dumps(box.inspect()))
            found = box.exec(
                f"grep -rlsF '{value}' / --exclude-dir=proc --exclude-dir=sys; env | grep -cF '{value}'"
            )
            self.assertEqual(found.stdout.strip(), "0")
        finally:
            box.remove()


class HistoryTest(unittest.TestCase):
    """A sandbox that checkpoints every command, on a deduplicated store
    (tests/server.rs names a compiled fs-store's manifest in
    BERTH_TEST_STORE_MANIFEST): history, diff, checkpoint and rewind."""

    @classmethod
    def setUpClass(cls):
        manifest = os.environ.get("BERTH_TEST_STORE_MANIFEST")
        if not manifest:
            raise unittest.SkipTest("no store given (BERTH_TEST_STORE_MANIFEST)")
        cls.berth = Berth()
        cls.box = cls.berth.create(
            "py-hist-" + uuid.uuid4().hex[:8],
            backend="docker",
            image=IMAGE,
            snapshot="remote:" + manifest,
            checkpoint_each_exec=True,
        )

    @classmethod
    def tearDownClass(cls):
        try:
            cls.box.remove()
        except NotFound:
            pass

    def test_history_diff_checkpoint_and_rewind(self):
        box = self.box
        one = box.exec("echo one > a.txt")
        two = box.exec("echo two > b.txt; rm a.txt")
        self.assertIsNotNone(one.checkpoint)
        self.assertIsNone(one.checkpoint.error)
        self.assertEqual(two.checkpoint.generation, one.checkpoint.generation + 1)
        # A streamed command's exit event says the same.
        events = list(box.exec_stream("echo three > c.txt"))
        exit_event = events[-1]
        self.assertEqual(exit_event.kind, "exit")
        three = exit_event.checkpoint.generation
        self.assertEqual(three, two.checkpoint.generation + 1)
        # Without one, on request.
        self.assertIsNone(box.exec("true", checkpoint=False).checkpoint)

        history = box.history()
        self.assertIsInstance(history, History)
        self.assertEqual(history.current, three)
        notes = {g.number: g.note for g in history.generations}
        self.assertEqual(notes[one.checkpoint.generation]["command"], "echo one > a.txt")
        self.assertEqual(notes[three]["kind"], "exec")

        diff = box.diff(one.checkpoint.generation, two.checkpoint.generation)
        self.assertIsInstance(diff, Diff)
        changes = {p.path: p.change for p in diff.paths}
        self.assertEqual(changes, {"a.txt": "removed", "b.txt": "added"})

        box.files.write("named.txt", b"by name\n")
        named = box.checkpoint("before the rewind")
        self.assertEqual(named, three + 1)
        self.assertEqual(
            box.history().generations[-1].note,
            {"kind": "checkpoint", "message": "before the rewind"},
        )

        saved = box.rewind(one.checkpoint.generation)
        self.assertEqual(box.exec("cat a.txt; ls", checkpoint=False).stdout, "one\na.txt\n")
        box.rewind(saved)
        self.assertEqual(box.files.read("named.txt"), b"by name\n")

        with self.assertRaises(GenerationNotKept) as refused:
            box.rewind(999)
        self.assertIn("999", refused.exception.message)
        self.assertEqual(box.files.read("named.txt"), b"by name\n")


class PoolTest(unittest.TestCase):
    """A warm pool on Docker: claims handed over at once, each workspace
    the claim's own; the pool refilled; removed with its members."""

    def test_claims_from_a_warm_pool(self):
        b = Berth()
        pool = "py-pool-" + uuid.uuid4().hex[:6]
        made = b.create_pool(pool, 2, backend="docker", image=IMAGE)
        self.assertEqual((made["name"], made["size"]), (pool, 2))
        self.assertIn(pool, [p["name"] for p in b.pools()])
        deadline = time.time() + 120
        while b.pool(pool)["ready"] < 2:
            self.assertLess(time.time(), deadline, b.pool(pool))
            time.sleep(0.1)
        names = [f"{pool}-task{i}" for i in range(3)]
        boxes = []
        try:
            for name in names:
                box = b.claim(
                    name,
                    pool,
                    workspace={"entries": {"task.txt": {"type": "file", "content": name}}},
                )
                boxes.append(box)
                self.assertEqual(box.claimed["pool"], pool)
                self.assertEqual(box.exec("ls -A").stdout, "task.txt\n")
                self.assertEqual(box.files.read("task.txt"), name.encode())
            # Two were warm; the third came warm if the pool refilled in
            # time, else cold, with a reason.
            self.assertTrue(boxes[0].claimed["warm"] and boxes[1].claimed["warm"])
            if not boxes[2].claimed["warm"]:
                self.assertTrue(boxes[2].claimed["reason"])
            with self.assertRaises(Conflict):
                b.claim(names[0], pool)
            with self.assertRaises(NotFound):
                b.claim("py-nowhere", "no-such-pool")
            # Refilled to its size, then removed with both members.
            while b.pool(pool)["ready"] < 2:
                self.assertLess(time.time(), deadline, b.pool(pool))
                time.sleep(0.1)
            self.assertEqual(b.remove_pool(pool), 2)
            with self.assertRaises(NotFound):
                b.pool(pool)
            # Claimed sandboxes are not members: they outlive the pool.
            self.assertEqual(boxes[0].exec("cat task.txt").stdout, names[0])
        finally:
            with contextlib.suppress(NotFound):
                b.remove_pool(pool)
            for box in boxes:
                box.remove()


class TcpAndLimitsTest(unittest.TestCase):
    """A server on loopback TCP with a token and a file-size limit
    (tests/server.rs starts it and names it in BERTH_TCP_URL, BERTH_TOKEN
    and BERTH_MAX_FILE)."""

    @classmethod
    def setUpClass(cls):
        url = os.environ.get("BERTH_TCP_URL")
        if not url:
            raise unittest.SkipTest("no TCP server given (BERTH_TCP_URL)")
        cls.url = url
        cls.token = os.environ["BERTH_TOKEN"]
        cls.limit = int(os.environ["BERTH_MAX_FILE"])
        cls.berth = Berth(url=url, token=cls.token)

    def test_a_a_missing_or_wrong_token_is_unauthorized(self):
        for token in (None, "wrong", self.token + "x", self.token[:-1] + "0"):
            if token == self.token:
                continue
            with self.assertRaises(Unauthorized):
                Berth(url=self.url, token=token).sandboxes()
        self.assertIsInstance(self.berth.sandboxes(), list)

    def test_b_a_file_over_the_limit_is_too_large_and_writes_nothing(self):
        box = self.berth.create("py-lim-" + uuid.uuid4().hex[:8], snapshot="noop")
        try:
            with self.assertRaises(TooLarge):
                box.files.write("big.bin", b"x" * (self.limit + 1))
            self.assertFalse(box.files.exists("big.bin"))
            box.files.write("ok.bin", b"y" * self.limit)
            self.assertEqual(box.files.stat("ok.bin").size, self.limit)
        finally:
            box.remove()


class ErrorMappingTest(unittest.TestCase):
    """Which exception a status and an error code raise (pure logic; each
    is also raised by a real server: tests/server_clients.rs for
    Unauthorized and TooLarge, tests/swarm.rs for Stale and
    PlacementFailed)."""

    def test_statuses_and_codes_map_to_their_classes(self):
        cases = [
            (401, "unauthorized", Unauthorized),
            (403, "path_refused", PathRefused),
            (413, "too_large", TooLarge),
            (400, "too_large", TooLarge),
            (409, "stale", Stale),
            (409, "exists", Conflict),
            (404, "not_found", NotFound),
            (404, "generation_not_kept", GenerationNotKept),
            (503, "placement", PlacementFailed),
            (500, "internal", BerthError),
        ]
        for status, code, cls in cases:
            self.assertIs(_error_class(status, code), cls, (status, code))
        self.assertTrue(issubclass(Stale, Conflict))


if __name__ == "__main__":
    unittest.main()
