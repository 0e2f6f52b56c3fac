/**
 * The TypeScript client against a real `berth serve` (BERTH_SOCKET) and a
 * real Docker engine (image BERTH_TEST_IMAGE), the same scenarios as the
 * Python client's tests. Run by `cargo xtask test` through
 * tests/server_clients.rs, from a fresh Node project that installed the
 * packed package; by hand: `berth serve &`, then in a project with
 * berth-client installed, `tsc` and `node --test`.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import * as http from "node:http";
import { AddressInfo } from "node:net";
import { PassThrough } from "node:stream";
import { after, before, describe, test } from "node:test";

import {
  Berth,
  BerthError,
  Conflict,
  ExecEvent,
  GenerationNotKept,
  NotFound,
  PathRefused,
  PlacementFailed,
  Sandbox,
  Stale,
  TooLarge,
  Unauthorized,
  errorClass,
} from "berth-client";

const IMAGE = process.env.BERTH_TEST_IMAGE ?? "berth-test:busybox";

function unique(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

/** The first value of `key` anywhere in a JSON document. */
function findKey(value: unknown, key: string): unknown {
  if (value && typeof value === "object") {
    if (!Array.isArray(value) && key in value) return (value as Record<string, unknown>)[key];
    for (const v of Object.values(value)) {
      const found = findKey(v, key);
      if (found !== undefined && found !== null) return found;
    }
  }
  return undefined;
}

async function collect(events: AsyncIterable<ExecEvent>): Promise<{ stdout: Buffer; stderr: Buffer; exit?: ExecEvent }> {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  let exit: ExecEvent | undefined;
  for await (const e of events) {
    if (e.type === "stdout") out.push(e.data);
    else if (e.type === "stderr") err.push(e.data);
    else if (e.type === "exit") exit = e;
  }
  return { stdout: Buffer.concat(out), stderr: Buffer.concat(err), exit };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe("client", () => {
  const berth = new Berth();
  const name = unique("ts");
  let box: Sandbox;

  before(async () => {
    box = await berth.create(name, {
      backend: "docker",
      image: IMAGE,
      workspace: { entries: { "README.md": { type: "file", content: "# task\n" } } },
    });
  });

  after(async () => {
    await box.remove().catch((e) => {
      if (!(e instanceof NotFound)) throw e;
    });
  });

  test("exec collects text, bytes and exit codes", async () => {
    const r = await box.exec("cat README.md; echo err >&2; exit 3");
    assert.equal(r.exit_code, 3);
    assert.equal(r.stdout, "# task\n");
    assert.equal(r.stderr, "err\n");
    const binary = await box.exec("printf '\\377\\000x'");
    assert.deepEqual(binary.stdout_bytes, Buffer.from([0xff, 0x00, 0x78]));
    const fed = await box.exec("tr a-z A-Z", { stdin: "hello" });
    assert.equal(fed.stdout, "HELLO");
    const timed = await box.exec("echo before; sleep 30", { timeoutMs: 3000 });
    assert.ok(timed.timed_out);
    assert.equal(timed.stdout, "before\n");
    const capped = await box.exec("head -c 100000 /dev/zero", { stdoutCap: 1000 });
    assert.ok(capped.truncated);
    assert.equal(capped.stdout_bytes.length, 1000);
  });

  test("exec with argv runs the words with no shell", async () => {
    const words = ["$HOME", "a b", "*", "'", "", "x;y"];
    const r = await box.exec(["printf", "%s|", ...words]);
    assert.equal(r.exit_code, 0);
    assert.equal(r.stdout, words.join("|") + "|");
    const chunks: Buffer[] = [];
    for await (const e of box.execStream(["printf", "%s|", ...words])) if (e.type === "stdout") chunks.push(e.data);
    assert.equal(Buffer.concat(chunks).toString(), words.join("|") + "|");
    const missing = await box.exec(["berth-no-such-program"]);
    assert.equal(missing.exit_code, 127);
    assert.match(missing.stderr, /not found/);
    await assert.rejects(box.exec([]), TypeError);
  });

  test("execStream yields output as it is produced", async () => {
    const started = performance.now();
    const times: number[] = [];
    let out = "";
    let code: number | undefined;
    for await (const e of box.execStream("echo one; sleep 1; echo two")) {
      if (e.type === "stdout") {
        times.push(performance.now() - started);
        out += e.data.toString();
      } else if (e.type === "exit") {
        code = e.exit_code;
      }
    }
    assert.equal(out, "one\ntwo\n");
    assert.equal(code, 0);
    // The first line came before the command ended.
    assert.ok(times[0] < times[times.length - 1] - 500, `${times}`);
    // A megabyte, intact.
    const big = await collect(
      box.execStream("head -c 1048576 /dev/urandom > /tmp/r; cat /tmp/r; sha256sum /tmp/r | cut -d' ' -f1 >&2"),
    );
    assert.equal(big.stdout.length, 1048576);
    assert.equal(createHash("sha256").update(big.stdout).digest("hex"), big.stderr.toString().trim());
  });

  test("leaving a stream early stops its command", async () => {
    for await (const e of box.execStream("echo up; sleep 31; touch never")) {
      assert.equal(e.type, "stdout");
      break;
    }
    const deadline = Date.now() + 10_000;
    let procs = "";
    for (;;) {
      procs = (await box.exec("ps -o args | grep -c '[s]leep 31' || true")).stdout.trim();
      if (procs === "0" || Date.now() > deadline) break;
      await sleep(100);
    }
    assert.equal(procs, "0");
    assert.equal(await box.files.exists("never"), false);
  });

  test("an AbortSignal stops a command", async () => {
    const abort = new AbortController();
    const stream = box.execStream("echo up; sleep 32", { signal: abort.signal });
    const first = await stream.next();
    assert.equal(first.value?.type, "stdout");
    abort.abort();
    await assert.rejects(stream.next(), (e: Error) => e.name === "AbortError");
    const deadline = Date.now() + 10_000;
    let procs = "";
    for (;;) {
      procs = (await box.exec("ps -o args | grep -c '[s]leep 32' || true")).stdout.trim();
      if (procs === "0" || Date.now() > deadline) break;
      await sleep(100);
    }
    assert.equal(procs, "0");
  });

  test("interactive stdin", async () => {
    const stream = box.execStream("cat", { interactive: true });
    const started = (await stream.next()).value;
    assert.ok(started && started.type === "started");
    const feed = new PassThrough();
    const sent = box.sendStdin(started.exec_id, feed);
    feed.write("typed\n");
    feed.end("more\n");
    assert.equal(await sent, 11);
    const rest = await collect(stream);
    assert.equal(rest.stdout.toString(), "typed\nmore\n");
    assert.equal(rest.exit?.type === "exit" && rest.exit.exit_code, 0);
  });

  test("a background process with logs", async () => {
    const p = await box.detach("echo hello; echo oops >&2; sleep 1; echo bye; exit 4", { name: "job" });
    assert.equal(p.id, "job");
    assert.ok((await box.processes()).some((q) => q.id === "job"));
    assert.equal(await box.wait("job"), 4);
    assert.equal((await box.process("job")).state, "exited");
    const logs = await collect(box.logs("job"));
    assert.equal(logs.stdout.toString(), "hello\nbye\n");
    assert.equal(logs.stderr.toString(), "oops\n");
    await assert.rejects(box.process("nope"), NotFound);
  });

  test("files: write, read, stat, list, remove", async () => {
    const payload = randomBytes(300_000);
    await box.files.mkdir("data");
    assert.equal(await box.files.write("data/blob.bin", payload), payload.length);
    assert.deepEqual(await box.files.read("data/blob.bin"), payload);
    assert.equal((await box.files.stat("data/blob.bin")).size, payload.length);
    await box.files.write("data/script.sh", "echo hi\n", { mode: 0o755 });
    assert.equal((await box.files.stat("data/script.sh")).mode & 0o777, 0o755);
    const streamed = new PassThrough();
    const written = box.files.write("data/streamed.bin", streamed, { length: 6 });
    streamed.end("abcdef");
    assert.equal(await written, 6);
    assert.equal((await box.files.read("data/streamed.bin")).toString(), "abcdef");
    assert.deepEqual(
      (await box.files.list("data")).map((e) => e.path).sort(),
      ["data/blob.bin", "data/script.sh", "data/streamed.bin"],
    );
    await box.files.mkdir("deep/er", { parents: true });
    assert.equal((await box.files.stat("deep/er")).type, "dir");
    await box.files.remove("deep", { recursive: true });
    assert.equal(await box.files.exists("deep"), false);
    await assert.rejects(box.files.read("../../etc/passwd"), PathRefused);
    await assert.rejects(box.files.read("missing.txt"), NotFound);
    await assert.rejects(box.files.write("x.bin", new PassThrough()), TypeError);
  });

  test("persist and hydrate", async () => {
    await box.files.write("archived.txt", "in the archive\n");
    const sink = new PassThrough();
    const chunks: Buffer[] = [];
    sink.on("data", (c: Buffer) => chunks.push(c));
    const n = await box.persist(sink);
    const tar = Buffer.concat(chunks);
    assert.equal(tar.length, n);
    assert.ok(tar.includes(Buffer.from("in the archive\n")));
    // A tar of one file, made by the host's tar.
    const made = execFileSync("sh", [
      "-c",
      'd=$(mktemp -d) && printf "hydrated\\n" > "$d/from_tar.txt" && tar -C "$d" -cf - from_tar.txt && rm -r "$d"',
    ]);
    const got = await box.hydrate(made);
    assert.ok((got.entries ?? 0) >= 1);
    assert.equal((await box.files.read("from_tar.txt")).toString(), "hydrated\n");
  });

  test("stop, then resume after the container is gone", async () => {
    await box.files.write("kept.txt", "survives\n");
    await box.stop();
    const record = await box.inspect();
    const container = findKey(record.state, "container_id");
    assert.ok(typeof container === "string" && container, `no container id in ${JSON.stringify(record.state)}`);
    execFileSync("docker", ["rm", "-f", container]);
    assert.throws(() => execFileSync("docker", ["inspect", container], { stdio: "ignore" }));
    // Transparent resume: the next command restores the workspace.
    assert.equal((await box.exec("cat kept.txt")).stdout, "survives\n");
    assert.ok("branch" in (await box.start()));
  });

  test("errors are typed", async () => {
    await assert.rejects(berth.sandbox("no-such-box").exec("true"), NotFound);
    await assert.rejects(berth.create(name, { backend: "docker", image: IMAGE }), (e: unknown) => {
      assert.ok(e instanceof Conflict);
      assert.equal(e.status, 409);
      assert.ok(e.message.includes(e.code));
      return true;
    });
    assert.ok((await berth.sandboxes()).some((s) => s.name === name));
  });

  test("defaults are listed and a disk quota holds", async () => {
    const defaults = await berth.defaults();
    assert.deepEqual(
      defaults.defaults.map((d) => d.key),
      ["memory", "pids", "cpus", "disk"],
    );
    assert.ok(defaults.file.endsWith("config.toml"));
    const small = await berth.create(unique("ts-disk"), { backend: "docker", image: IMAGE, settings: { disk: "32MiB" } });
    try {
      const full = await small.exec("dd if=/dev/zero of=fill bs=1M count=64");
      assert.notEqual(full.exit_code, 0);
      assert.ok(full.stderr.includes("No space left"), full.stderr);
      assert.equal((await small.exec("rm fill && echo room")).stdout, "room\n");
    } finally {
      await small.remove();
    }
  });

  test("an egress policy allows its host, logs the rest, and changes", async () => {
    const server = http.createServer((req, res) => res.end(`hello from ${req.headers.host}\n`));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as AddressInfo).port;
    const fenced = await berth.create(unique("ts-egress"), {
      backend: "docker",
      image: IMAGE,
      egress: {
        allowHosts: [`a.pkg.test:${port}`],
        allowCidrs: [`127.0.0.0/8:${port}`],
        testResolve: ["*.pkg.test=127.0.0.1"],
      },
    });
    try {
      const ok = await fenced.exec(`wget -qO- http://a.pkg.test:${port}/`);
      assert.deepEqual([ok.exit_code, ok.stdout], [0, `hello from a.pkg.test:${port}\n`]);
      assert.notEqual((await fenced.exec(`wget -qO- http://b.pkg.test:${port}/`)).exit_code, 0);
      let report = await fenced.egress();
      assert.ok(report.running);
      assert.deepEqual(
        report.connections.map((c) => [c.host, c.verdict]),
        [
          ["a.pkg.test", "allowed"],
          ["b.pkg.test", "denied"],
        ],
      );
      assert.ok(report.connections[1].reason?.includes("b.pkg.test"));
      report = await fenced.setEgress({ allowHosts: [`b.pkg.test:${port}`], allowCidrs: [`127.0.0.0/8:${port}`] });
      assert.deepEqual(report.policy.allow_hosts, [`b.pkg.test:${port}`]);
      const now = await fenced.exec(`wget -qO- http://b.pkg.test:${port}/`);
      assert.deepEqual([now.exit_code, now.stdout], [0, `hello from b.pkg.test:${port}\n`]);
      assert.notEqual((await fenced.exec(`wget -qO- http://a.pkg.test:${port}/`)).exit_code, 0);
      await assert.rejects(fenced.setEgress({ allowHosts: ["bad host!"] }), (e: unknown) => e instanceof BerthError && e.status === 400);
    } finally {
      await fenced.remove();
      server.close();
    }
  });

  test("a secret is a placeholder inside and never given back", async () => {
    const value = `sk-ts-${randomBytes(16).toString("hex")}`;
    const secrets = { API_KEY: { value, hosts: ["api.pkg.test"] } };
    await assert.rejects(
      berth.create("ts-secret-refused", { backend: "docker", image: IMAGE, egress: { allowHosts: ["other.pkg.test"], secrets } }),
      (e: unknown) => {
        assert.ok(e instanceof BerthError && e.status === 400);
        assert.ok(e.message.includes("--allow-host api.pkg.test"), e.message);
        assert.ok(!e.message.includes(value));
        return true;
      },
    );
    const kept = await berth.create(unique("ts-secret"), {
      backend: "docker",
      image: IMAGE,
      egress: { allowHosts: ["api.pkg.test"], secrets },
    });
    try {
      const placeholder = (await kept.exec('printf %s "$API_KEY"')).stdout;
      assert.ok(placeholder.startsWith("BERTH_SECRET_API_KEY_"), placeholder);
      const report = await kept.egress();
      assert.deepEqual(report.secrets, [{ name: "API_KEY", hosts: ["api.pkg.test"], placeholder }]);
      assert.ok(!JSON.stringify(report).includes(value));
      assert.ok(!JSON.stringify(await kept.inspect()).includes(value));
      const found = await kept.exec(`grep -rlsF '${value}' / --exclude-dir=proc --exclude-dir=sys; env | grep -cF '${value}'`);
      assert.equal(found.stdout.trim(), "0");
    } finally {
      await kept.remove();
    }
  });
});

describe("history", { skip: !process.env.BERTH_TEST_STORE_MANIFEST && "no store given (BERTH_TEST_STORE_MANIFEST)" }, () => {
  const berth = new Berth();
  let box: Sandbox;

  before(async () => {
    box = await berth.create(unique("ts-hist"), {
      backend: "docker",
      image: IMAGE,
      snapshot: `remote:${process.env.BERTH_TEST_STORE_MANIFEST}`,
      checkpointEachExec: true,
    });
  });

  after(async () => {
    await box.remove().catch(() => undefined);
  });

  test("history, diff, checkpoint and rewind", async () => {
    const one = await box.exec("echo one > a.txt");
    const two = await box.exec("echo two > b.txt; rm a.txt");
    assert.ok(one.checkpoint && one.checkpoint.generation !== null);
    assert.equal(one.checkpoint.error ?? null, null);
    const first = one.checkpoint.generation;
    assert.equal(two.checkpoint?.generation, first + 1);
    // A streamed command's exit event says the same.
    const streamed = await collect(box.execStream("echo three > c.txt"));
    assert.ok(streamed.exit?.type === "exit");
    const three = streamed.exit.checkpoint?.generation;
    assert.equal(three, first + 2);
    // Without one, on request.
    assert.equal((await box.exec("true", { checkpoint: false })).checkpoint, null);

    const history = await box.history();
    assert.equal(history.current, three);
    const notes = new Map(history.generations.map((g) => [g.number, g.note]));
    const note = notes.get(first);
    assert.ok(note?.kind === "exec");
    assert.equal(note.command, "echo one > a.txt");
    assert.equal(notes.get(three)?.kind, "exec");

    const diff = await box.diff(first, first + 1);
    assert.deepEqual(
      Object.fromEntries(diff.paths.map((p) => [p.path, p.change])),
      { "a.txt": "removed", "b.txt": "added" },
    );

    await box.files.write("named.txt", "by name\n");
    const named = await box.checkpoint("before the rewind");
    assert.equal(named, three + 1);
    const newest = (await box.history()).generations.at(-1);
    assert.deepEqual(newest?.note, { kind: "checkpoint", message: "before the rewind" });

    const saved = await box.rewind(first);
    assert.equal((await box.exec("cat a.txt; ls", { checkpoint: false })).stdout, "one\na.txt\n");
    await box.rewind(saved);
    assert.equal((await box.files.read("named.txt")).toString(), "by name\n");

    await assert.rejects(box.rewind(999), (e: unknown) => {
      assert.ok(e instanceof GenerationNotKept && e instanceof NotFound);
      assert.ok(e.detail.includes("999"), e.detail);
      return true;
    });
    assert.equal((await box.files.read("named.txt")).toString(), "by name\n");
  });
});

describe("pools", () => {
  test("claims from a warm pool: handed over at once, each workspace its own", async () => {
    const b = new Berth();
    const pool = unique("ts-pool");
    const made = await b.createPool(pool, 2, { backend: "docker", image: IMAGE });
    assert.deepEqual([made.name, made.size], [pool, 2]);
    assert.ok((await b.pools()).some((p) => p.name === pool));
    const deadline = Date.now() + 120_000;
    while ((await b.pool(pool)).ready < 2) {
      assert.ok(Date.now() < deadline, "the pool never filled");
      await new Promise((r) => setTimeout(r, 100));
    }
    const boxes: Sandbox[] = [];
    try {
      for (const i of [0, 1]) {
        const name = `${pool}-task${i}`;
        const { sandbox, claimed } = await b.claim(name, pool, {
          workspace: { entries: { "task.txt": { type: "file", content: name } } },
        });
        boxes.push(sandbox);
        assert.deepEqual([claimed.pool, claimed.warm], [pool, true]);
        assert.equal((await sandbox.exec("ls -A")).stdout, "task.txt\n");
        assert.equal((await sandbox.files.read("task.txt")).toString(), name);
      }
      await assert.rejects(b.claim(boxes[0].name, pool), Conflict);
      await assert.rejects(b.pool("no-such-pool"), NotFound);
      // Refilled to its size, then removed with both members.
      while ((await b.pool(pool)).ready < 2) {
        assert.ok(Date.now() < deadline, "the pool never refilled");
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.equal(await b.removePool(pool), 2);
      await assert.rejects(b.pool(pool), NotFound);
      // Claimed sandboxes are not members: they outlive the pool.
      assert.equal((await boxes[0].exec("cat task.txt")).stdout, boxes[0].name);
    } finally {
      await b.removePool(pool).catch(() => undefined);
      for (const box of boxes) await box.remove();
    }
  });
});

describe("tcp and limits", { skip: !process.env.BERTH_TCP_URL && "no TCP server given (BERTH_TCP_URL)" }, () => {
  const url = process.env.BERTH_TCP_URL ?? "";
  const token = process.env.BERTH_TOKEN ?? "";
  const limit = Number(process.env.BERTH_MAX_FILE ?? 0);

  test("a missing or wrong token is unauthorized", async () => {
    for (const wrong of [undefined, "wrong", `${token}x`, `${token.slice(0, -1)}0`]) {
      if (wrong === token) continue;
      await assert.rejects(new Berth({ url, token: wrong }).sandboxes(), Unauthorized);
    }
    assert.ok(Array.isArray(await new Berth({ url, token }).sandboxes()));
  });

  test("a file over the limit is too large and writes nothing", async () => {
    const berth = new Berth({ url, token });
    const box = await berth.create(unique("ts-lim"), { snapshot: "noop" });
    try {
      await assert.rejects(box.files.write("big.bin", Buffer.alloc(limit + 1, "x")), TooLarge);
      assert.equal(await box.files.exists("big.bin"), false);
      // Streamed, with its length said: refused before a byte is written.
      const big = new PassThrough();
      const refused = box.files.write("big2.bin", big, { length: limit + 1 });
      big.end(Buffer.alloc(limit + 1, "z"));
      await assert.rejects(refused, TooLarge);
      assert.equal(await box.files.exists("big2.bin"), false);
      await box.files.write("ok.bin", Buffer.alloc(limit, "y"));
      assert.equal((await box.files.stat("ok.bin")).size, limit);
    } finally {
      await box.remove();
    }
  });
});

describe("error mapping", () => {
  // Which class a status and an error code raise (pure logic; each is
  // also raised by a real server: above for Unauthorized, TooLarge,
  // NotFound, Conflict, PathRefused and GenerationNotKept).
  test("statuses and codes map to their classes", () => {
    const cases: [number, string, unknown][] = [
      [401, "unauthorized", Unauthorized],
      [403, "path_refused", PathRefused],
      [413, "too_large", TooLarge],
      [400, "too_large", TooLarge],
      [409, "stale", Stale],
      [409, "exists", Conflict],
      [404, "not_found", NotFound],
      [404, "generation_not_kept", GenerationNotKept],
      [503, "placement", PlacementFailed],
      [500, "internal", BerthError],
    ];
    for (const [status, code, cls] of cases) assert.equal(errorClass(status, code), cls, `${status} ${code}`);
    assert.ok(new Stale(409, "stale", "m") instanceof Conflict);
  });
});
