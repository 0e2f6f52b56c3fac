//! A stop killed between its first upload and its commit: what it left
//! (packs only its journal names) is collected by `gc`, or by the next
//! stop, which writes its journal under the same name.

use std::path::PathBuf;
use std::process::Command;

use berth_tests::{berth_bin, berth_ok, berth_state, fs_store_manifest, local_root};

use super::{objects, packs, record};

/// A sandbox `k` whose stop was killed after it announced a pack and
/// before its commit: its home, its store, the objects before the stop,
/// and the objects once the store is still.
struct KilledStop {
    _dir: tempfile::TempDir,
    home: PathBuf,
    store: PathBuf,
    committed: Vec<String>,
    left: Vec<String>,
}

fn kill_a_stop_mid_way() -> KilledStop {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = dir.path().join("store");
    let manifest = fs_store_manifest(dir.path(), &store);
    let snapshot = format!("remote:{}", manifest.display());
    berth_ok(&home, &["create", "k", "--snapshot", &snapshot, "--dedup"]);
    berth_ok(&home, &["exec", "k", "--", "echo one > a.txt"]);
    berth_ok(&home, &["stop", "k"]);
    let committed = objects(&store);
    let mut killed_mid_way = false;
    for attempt in 0..5 {
        let size = 200u64 << (20 + attempt.min(2));
        berth_ok(
            &home,
            &[
                "exec",
                "k",
                "--",
                &format!("head -c {size} /dev/urandom > big{attempt}.bin"),
            ],
        );
        let mut child = Command::new(berth_bin())
            .env("BERTH_HOME", &home)
            .args(["stop", "k"])
            .spawn()
            .unwrap();
        // Kill it as soon as it announced a pack.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if objects(&store).iter().any(|o| o.ends_with(".journal")) {
                break;
            }
            if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        // Let a pack or two land.
        std::thread::sleep(std::time::Duration::from_millis(150));
        let _ = child.kill();
        let status = child.wait().unwrap();
        if !status.success() && !objects(&store).iter().any(|o| o.ends_with(".g2.idx")) {
            killed_mid_way = true;
            break;
        }
        println!("attempt {attempt}: the stop finished before the kill; again, bigger");
        berth_ok(&home, &["exec", "k", "--", &format!("rm big{attempt}.bin")]);
        berth_ok(&home, &["stop", "k"]);
        berth_ok(&home, &["gc", "k"]);
    }
    assert!(killed_mid_way, "could not kill a stop mid-way");
    // The stop ran in the server the CLI reached: its handler ends when
    // the client goes, but an upload already handed to the store finishes.
    // Wait until the store is still.
    let mut left = objects(&store);
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = objects(&store);
        if now == left {
            break;
        }
        left = now;
    }
    assert!(left.iter().any(|o| o.ends_with(".journal")), "{left:?}");
    let orphans: Vec<_> = packs(&left)
        .into_iter()
        .filter(|p| !packs(&committed).contains(p))
        .collect();
    println!("orphans: {orphans:?}");
    KilledStop {
        _dir: dir,
        home,
        store,
        committed,
        left,
    }
}

/// After the killed stop's cleanup (by `gc` or by the next stop): no
/// journal, the newest generation's index there, and the sandbox still
/// stops and restores.
fn only_the_newest_generation_is_left(k: &KilledStop) {
    let (home, store) = (&k.home, &k.store);
    let after = objects(store);
    assert!(!after.iter().any(|o| o.ends_with(".journal")), "{after:?}");
    let state = record(&berth_state(home, "k"));
    let current = state.generations.last().unwrap().index.clone();
    assert!(after.contains(&current));
    let want = berth_ok(home, &["exec", "k", "--", "sha256sum big*.bin a.txt"]);
    berth_ok(home, &["stop", "k"]);
    berth_tests::remove_workspace(local_root(&berth_state(home, "k")));
    assert_eq!(
        berth_ok(home, &["exec", "k", "--", "sha256sum big*.bin a.txt"]),
        want
    );
}

#[test]
fn gc_removes_what_a_killed_stop_left() {
    let k = kill_a_stop_mid_way();
    let (home, store, committed, left) = (&k.home, &k.store, &k.committed, &k.left);
    let dry = berth_ok(home, &["gc", "k", "--dry-run"]);
    assert!(dry.contains("would delete"), "{dry}");
    assert_eq!(&objects(store), left, "a dry run deleted something");
    berth_ok(home, &["gc", "k"]);
    // What is left is the committed generation's objects: no orphan pack.
    let after = objects(store);
    assert!(
        packs(&after).len() <= packs(committed).len().max(1),
        "orphans left: {after:?} (committed: {committed:?})"
    );
    only_the_newest_generation_is_left(&k);
}

/// The next stop after a killed one writes its journal under the same
/// name: it takes over the killed stop's packs and collects those its
/// generation does not use — nothing is left for a `gc` that may never run.
#[test]
fn the_stop_after_a_killed_one_collects_what_it_left() {
    let k = kill_a_stop_mid_way();
    let (home, store) = (&k.home, &k.store);
    berth_ok(
        home,
        &["exec", "k", "--", "rm -f big*.bin && echo two > a.txt"],
    );
    berth_ok(home, &["stop", "k"]);
    let after = objects(store);
    let state = record(&berth_state(home, "k"));
    let current = state.generations.last().unwrap();
    assert_eq!(
        state.generations.len(),
        1,
        "keep 1: {:?}",
        state.generations
    );
    // The new generation holds a.txt only: the killed stop's packs (the
    // big files) are referenced by nothing, so none may be left.
    let killed: Vec<_> = packs(&k.left)
        .into_iter()
        .filter(|p| !packs(&k.committed).contains(p))
        .collect();
    let leaked: Vec<_> = killed.iter().filter(|p| after.contains(p)).collect();
    assert!(
        leaked.is_empty(),
        "leaked {leaked:?} ({} is current)",
        current.index
    );
    assert!(!after.iter().any(|o| o.ends_with(".journal")), "{after:?}");
    berth_ok(
        home,
        &["exec", "k", "--", "head -c 1000 /dev/urandom > big9.bin"],
    );
    only_the_newest_generation_is_left(&k);
}
