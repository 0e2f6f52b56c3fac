//! Crash consistency: `berth stop` is SIGKILLed at random points, 25 times
//! per store (the native local snapshot, the fs-store Wasm plugin, and
//! deduplicated generations in it, half of those stops using the files
//! cache).
//! After every kill the state file parses, the sandbox restores, and what
//! comes back is byte-identical to either the last completed stop or the one
//! that was killed — never a mix, never a partial archive.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth_tests::{berth_bin, guest};

const TRIALS: u32 = 25;

struct Cli {
    home: std::path::PathBuf,
}

impl Cli {
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        // In-process: the kill below must land in the process that stops
        // (a server killed mid-stop is tests/server.rs's).
        let out = Command::new(berth_bin())
            .env("BERTH_NO_SERVER", "1")
            .env("BERTH_HOME", &self.home)
            .env("BERTH_CACHE_DIR", self.home.join("cache"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert_eq!(code, 0, "berth {args:?} failed: {out}{err}");
        out
    }

    fn state(&self, name: &str) -> serde_json::Value {
        let path = self.home.join("sandboxes").join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).unwrap();
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("torn state file {}: {e}\n{text}", path.display()))
    }
}

/// Minimal xorshift so the kill points are reproducible from the seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const LISTING: &str = "sha256sum big.bin marker keep/*";

fn trials(snapshot: &str, home: &Path, seed: u64) {
    let cli = Cli {
        home: home.to_path_buf(),
    };
    let name = "crashy";
    let dedup = snapshot.ends_with(" --dedup");
    let mut create = vec!["create", name, "--snapshot"];
    create.extend(snapshot.split(' '));
    cli.ok(&create);
    cli.ok(&[
        "exec",
        name,
        "--",
        "head -c 33554432 /dev/urandom > big.bin && echo 0 > marker && mkdir keep && for i in $(seq 1 40); do head -c 20000 /dev/urandom > keep/f$i; done",
    ]);
    let t = Instant::now();
    cli.ok(&["stop", name]);
    let stop_time = t.elapsed();
    let mut committed = cli.ok(&["exec", name, "--", LISTING]);
    let root = cli.state(name)["state"]["root_dir"]
        .as_str()
        .unwrap()
        .to_string();
    let mut rng = Rng(seed | 1);
    let (mut killed_before, mut completed, mut mid_persist) = (0, 0, 0);
    let mut cached_stops = 0;
    for i in 1..=TRIALS {
        // Deduplicated, odd trials: a stop the files cache serves is the
        // one killed (the unchanged files' identities are older than the
        // racy window, and the stop before recorded them).
        let cached = dedup && i % 2 == 1;
        if cached {
            std::thread::sleep(berth::workspace::tree::RACY_WINDOW + Duration::from_millis(100));
            cli.ok(&["stop", name]);
            committed = cli.ok(&["exec", name, "--", LISTING]);
        }
        cli.ok(&[
            "exec",
            name,
            "--",
            &format!("echo {i} > marker && dd if=/dev/urandom of=big.bin bs=1048576 count=1 seek={} conv=notrunc 2>/dev/null", i % 32),
        ]);
        let attempted = cli.ok(&["exec", name, "--", LISTING]);
        // Deduplicated stops after the first are shorter than it: kills
        // spread over one first stop's time rather than one and a half.
        let spread = if dedup {
            stop_time.as_micros() as u64
        } else {
            stop_time.as_micros() as u64 * 3 / 2
        };
        let delay = Duration::from_micros(rng.next() % (spread + 1));
        let mut child = Command::new(berth_bin())
            .env("BERTH_NO_SERVER", "1")
            .env("BERTH_HOME", &cli.home)
            .env("BERTH_CACHE_DIR", cli.home.join("cache"))
            .args(["stop", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        if status.success() {
            completed += 1;
        } else {
            killed_before += 1;
        }
        // The state file is whole, and the workspace restores from the store.
        let state = cli.state(name);
        // The kill landed while the archive was being persisted: the
        // state says a persist began and never recorded its end.
        if state["state"]["snapshot"]["persist_pending"] == serde_json::Value::Bool(true) {
            mid_persist += 1;
        }
        if cached && status.success() {
            let stats = &state["state"]["snapshot"]["dedup"]["last_stop"];
            if stats["files_unchanged"].as_u64().unwrap_or(0) > 0 {
                cached_stops += 1;
            }
        }
        let (code, restored, err) = if cached {
            // What the store holds, restored elsewhere (the workspace and
            // its files cache stay for the next trial): a fork of it.
            let (code, out, err) = cli.run(&["fork", name, "check"]);
            let listing = if code == 0 {
                cli.run(&["exec", "check", "--", LISTING])
            } else {
                (code, out, err)
            };
            cli.ok(&["rm", "check"]);
            listing
        } else {
            berth_tests::remove_workspace(&root);
            cli.run(&["exec", name, "--", LISTING])
        };
        assert_eq!(
            code, 0,
            "trial {i} ({snapshot}, delay {delay:?}, {status}): restore failed: {err}\nstate: {}",
            state["state"]["snapshot"]
        );
        assert!(
            restored == committed || restored == attempted,
            "trial {i}: restored workspace is neither the last completed stop nor the attempted one:\n{restored}"
        );
        committed = restored;
    }
    println!("{snapshot}: {TRIALS} trials, stop takes {stop_time:?}; {killed_before} killed, {mid_persist} of them mid-persist, {completed} finished first, {cached_stops} served by the files cache");
    if dedup {
        assert!(
            cached_stops > 0 || completed == 0,
            "{snapshot}: no finished stop of a cached trial used the files cache"
        );
    }
    // Kills spread over 1.5 stop times; about half land while the archive
    // streams (the chance that none of 25 does is below one in a million).
    assert!(
        mid_persist > 0,
        "{snapshot}: no kill landed while a persist was under way, so nothing here tested a torn stop"
    );
    cli.ok(&["rm", name]);
}

#[test]
fn killing_stop_never_loses_or_tears_a_snapshot() {
    let seed = berth_tests::seed("BERTH_CRASH_SEED", "killing stop");

    let local = tempfile::tempdir().unwrap();
    trials("local", local.path(), seed);

    let plugin = tempfile::tempdir().unwrap();
    let store = plugin.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let manifest = plugin.path().join("fs-store.toml");
    std::fs::write(
        &manifest,
        format!(
            "component = {:?}\nworld = \"remote-client-plugin\"\n[config]\nroot = \"/data\"\n[[grants.dirs]]\nhost = {:?}\nguest = \"/data\"\nmode = \"rw\"\n",
            guest("fs_store"),
            store
        ),
    )
    .unwrap();
    trials(
        &format!("remote:{}", manifest.display()),
        plugin.path(),
        seed.rotate_left(17),
    );
    let dedup = tempfile::tempdir().unwrap();
    let dedup_manifest = dedup.path().join("fs-store.toml");
    let dedup_store = dedup.path().join("store");
    std::fs::create_dir(&dedup_store).unwrap();
    std::fs::write(
        &dedup_manifest,
        std::fs::read_to_string(&manifest)
            .unwrap()
            .replace(&format!("{store:?}"), &format!("{dedup_store:?}")),
    )
    .unwrap();
    trials(
        &format!("remote:{} --dedup", dedup_manifest.display()),
        dedup.path(),
        seed.rotate_left(31),
    );
}
