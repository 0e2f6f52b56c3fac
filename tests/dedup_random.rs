//! Generated edits between cached stops: every generation restores exactly,
//! on the local backend and on Docker; a rewind can be undone and a
//! collected generation is refused.

use super::*;

/// Every entry of a directory, sorted: kind, path, mode, size, mtime in
/// nanoseconds (files, directories and the root itself), link count and
/// content hash (files), target (symlinks).
pub(crate) fn manifest_ns(root: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
        let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            let rel = rel.join(&name);
            let full = root.join(&rel);
            let m = std::fs::symlink_metadata(&full).unwrap();
            let time = format!("{}.{:09}", m.mtime(), m.mtime_nsec());
            if m.file_type().is_symlink() {
                let target = std::fs::read_link(&full).unwrap();
                out.push(format!("L|{}|{}", rel.display(), target.display()));
            } else if m.is_dir() {
                out.push(format!("D|{}|{:o}|{time}", rel.display(), m.mode() & 0o777));
                walk(root, &rel, out);
            } else {
                let data = std::fs::read(&full).unwrap();
                out.push(format!(
                    "F|{}|{:o}|{}|{}|{time}|{}",
                    rel.display(),
                    m.mode() & 0o777,
                    m.len(),
                    m.nlink(),
                    blake3::hash(&data).to_hex()
                ));
            }
        }
    }
    let m = std::fs::metadata(root).unwrap();
    let mut out = vec![format!("ROOT|{}.{:09}", m.mtime(), m.mtime_nsec())];
    walk(root, Path::new(""), &mut out);
    out
}

/// The paths two trees (as [`manifest_ns`] lists them) differ by, sorted,
/// leaving out times and link counts as a generation's index and its diff
/// do (a link elsewhere changes a file's count).
pub(crate) fn paths_differing(older: &[String], newer: &[String]) -> Vec<String> {
    let strip = |lines: &[String]| -> std::collections::BTreeMap<String, String> {
        lines
            .iter()
            .skip(1)
            .map(|l| {
                let parts: Vec<&str> = l.split('|').collect();
                let rest = match parts[0] {
                    "F" => format!("F|{}|{}|{}", parts[2], parts[3], parts[6]),
                    "D" => format!("D|{}", parts[2]),
                    _ => l.clone(),
                };
                (parts[1].to_string(), rest)
            })
            .collect()
    };
    let (older, newer) = (strip(older), strip(newer));
    let mut paths: Vec<String> = older
        .keys()
        .chain(newer.keys())
        .filter(|k| older.get(*k) != newer.get(*k))
        .cloned()
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// One random edit of the kinds a files cache can get wrong, as a shell
/// script run in the workspace.
pub(crate) fn random_edit(rng: &mut impl rand::Rng, step: usize) -> String {
    let n = step;
    match rng.gen_range(0..9) {
        // Same size, old mtime put back (busybox's touch too: -r).
        1 => "touch -r tree/a.bin tree/.ref; s=$(wc -c < tree/a.bin); head -c $s /dev/urandom > tree/a.tmp; cat tree/a.tmp > tree/a.bin; rm tree/a.tmp; touch -r tree/.ref tree/a.bin; rm tree/.ref".into(),
        // Append.
        0 => format!("head -c {} /dev/urandom >> tree/a.bin", rng.gen_range(1..200_000)),
        // Rename.
        2 => format!("d=$(ls -d tree/small* | head -n1); f=$(ls \"$d\" | head -n1); [ -n \"$f\" ] && mv \"$d/$f\" \"$d/r{n}\"; mv \"$d\" tree/small{n}"),
        // chmod.
        3 => format!("chmod {} tree/b.txt", ["600", "640", "755", "700"][rng.gen_range(0..4)]),
        // A hardlink added, or broken by a copy over it.
        4 => "if [ -e tree/link ]; then cp tree/link tree/link.tmp && mv tree/link.tmp tree/link; else ln tree/b.txt tree/link; fi".into(),
        // Deleted and re-made at once (the inode may be reused).
        5 => format!("rm tree/b.txt; printf 'again {n}' > tree/b.txt"),
        // A sparse file grown.
        6 => format!("truncate -s {}M tree/sparse; printf x >> tree/sparse", rng.gen_range(1..8)),
        // A directory replaced by a file, or back.
        7 => "if [ -d tree/d ]; then rm -rf tree/d; printf file > tree/d; else rm -f tree/d; mkdir -p tree/d/e; printf in > tree/d/e/f; fi".into(),
        // An old time, set on purpose.
        _ => format!("touch -d @{} tree/b.txt", rng.gen_range(1_000_000_000..1_600_000_000u64)),
    }
}

/// The files cache's promise, over random edit sequences: every kept
/// generation restores exactly as the workspace was at its stop (times in
/// nanoseconds, the root's too), whether its files were read or reused;
/// and `diff` between two generations names the paths whose restored
/// trees differ.
#[tokio::test(flavor = "multi_thread")]
async fn random_edits_between_cached_stops_restore_every_generation_exactly() {
    use rand::{Rng, SeedableRng};
    for seed in seeds(&[1, 2, 3]) {
        println!("files cache edits: seed {seed} (BERTH_DEDUP_SEEDS={seed} replays it)");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let host = host_with_cache(&dir.path().join("compiled"));
        let scratch = dir.path().join("store");
        std::fs::create_dir_all(&scratch).unwrap();
        let plugin = host
            .load(scratch_manifest("fs_store", World::RemoteClient, &scratch))
            .await
            .unwrap();
        let spec = SnapshotSpec::loaded_plugin(plugin).deduplicated(50);
        let client = berth_tests::client_builder(&home).plugin_host(host).build();
        let mut sb = client
            .create(
                SandboxSpec::new(WorkspaceSpec::default())
                    .snapshot(spec.clone())
                    .backend(BackendSpec::local()),
            )
            .await
            .unwrap();
        sb.start().await.unwrap();
        let root = local_root(&sb.state());
        sh_in(
            &root,
            "mkdir -p tree/small tree/d/e && head -c 300000 /dev/urandom > tree/a.bin && printf hello > tree/b.txt \
             && printf in > tree/d/e/f && truncate -s 1M tree/sparse && for i in 1 2 3; do printf $i > tree/small/f$i; done",
        );
        let mut manifests = Vec::new();
        let steps = 7;
        let mut unchanged_seen = 0;
        for step in 0..steps {
            if step > 0 {
                let edits = rng.gen_range(1..4);
                for k in 0..edits {
                    sh_in(&root, &random_edit(&mut rng, step * 10 + k));
                }
            }
            // Every other stop waits out the racy window, so the cache's
            // comparison (not the racy rule) decides what is read.
            if step % 2 == 1 {
                tokio::time::sleep(
                    berth::workspace::tree::RACY_WINDOW + std::time::Duration::from_millis(100),
                )
                .await;
            }
            manifests.push(manifest_ns(&root));
            sb.stop().await.unwrap();
            let stats = record(&sb.state()).last_stop.unwrap();
            unchanged_seen += stats.files_unchanged;
            sb.attach().await.unwrap();
        }
        assert!(
            unchanged_seen > 0,
            "seed {seed}: the files cache never matched a file"
        );
        let state = sb.state();
        let history = sb.history().unwrap();
        assert_eq!(history.generations.len(), steps);
        let mut trees = Vec::new();
        for (i, expected) in manifests.iter().enumerate() {
            let number = i as u64 + 1;
            let mut sb = client
                .resume(state.clone(), Some(spec.clone()), Default::default())
                .await
                .unwrap();
            sb.shutdown().await.unwrap();
            sb.select_generation(number).unwrap();
            sb.start().await.unwrap();
            let got = manifest_ns(&local_root(&sb.state()));
            assert_eq!(
                &got, expected,
                "seed {seed}: generation {number} did not come back identically"
            );
            trees.push(got);
            sb.shutdown().await.unwrap();
        }
        // diff agrees with the restored trees (times aside).
        let sb = client
            .resume(state.clone(), Some(spec.clone()), Default::default())
            .await
            .unwrap();
        for a in 1..steps {
            let expected = paths_differing(&trees[a - 1], &trees[a]);
            let diff = sb.diff(a as u64, a as u64 + 1).await.unwrap();
            let mut got: Vec<String> = diff.paths.iter().map(|p| p.path.clone()).collect();
            got.sort();
            assert_eq!(got, expected, "seed {seed}: diff {a} {}", a + 1);
        }
    }
}

/// A rewind saves the workspace first, so it can be undone; a rewind to a
/// generation that is no longer kept is refused before anything changes.
#[tokio::test(flavor = "multi_thread")]
async fn a_rewind_can_be_undone_and_a_collected_generation_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let host = host_with_cache(&dir.path().join("compiled"));
    let scratch = dir.path().join("store");
    std::fs::create_dir_all(&scratch).unwrap();
    let plugin = host
        .load(scratch_manifest("fs_store", World::RemoteClient, &scratch))
        .await
        .unwrap();
    let spec = SnapshotSpec::loaded_plugin(plugin).deduplicated(2);
    let client = berth_tests::client_builder(&home).plugin_host(host).build();
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(spec)
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    let root = local_root(&sb.state());
    let mut manifests = Vec::new();
    for n in 1..=3 {
        sh_in(&local_root(&sb.state()), &format!("printf {n} > f{n}"));
        manifests.push(manifest_ns(&local_root(&sb.state())));
        sb.stop().await.unwrap();
        sb.attach().await.unwrap();
    }
    let _ = root;
    // Generation 1 was collected (keep 2): refused, nothing changed.
    let before = manifest_ns(&local_root(&sb.state()));
    let e = sb.rewind(1).await.unwrap_err().to_string();
    assert!(e.contains("generation 1") && e.contains("not kept"), "{e}");
    assert_eq!(manifest_ns(&local_root(&sb.state())), before);
    // A rewind to 2 saves the live workspace (with a change) as 4 first.
    sh_in(&local_root(&sb.state()), "rm f1; printf late > late");
    let live = manifest_ns(&local_root(&sb.state()));
    let saved = sb.rewind(2).await.unwrap();
    assert_eq!(saved, 4);
    assert_eq!(manifest_ns(&local_root(&sb.state())), manifests[1]);
    // And undone.
    sb.rewind(saved).await.unwrap();
    assert_eq!(manifest_ns(&local_root(&sb.state())), live);
}

/// The same promise on Docker, whose stops go through the in-container
/// agent's walk: every kept generation of a random edit sequence comes
/// back in a new container exactly as it was at its stop (times to the
/// nanosecond, as busybox's `stat -c %y` prints them).
#[tokio::test(flavor = "multi_thread")]
async fn docker_random_edits_between_cached_stops_restore_every_generation() {
    use rand::SeedableRng;
    if docker_or_skip("docker_random_edits_between_cached_stops_restore_every_generation")
        .await
        .is_none()
    {
        return;
    }
    const LISTING: &str = r#"find tree | sort | while IFS= read -r p; do
  if [ -L "$p" ]; then echo "L|$p|$(readlink "$p")";
  elif [ -d "$p" ]; then echo "D|$p|$(stat -c '%a|%y' "$p")";
  else echo "F|$p|$(stat -c '%a|%s|%h|%y' "$p")|$(sha256sum < "$p" | cut -d' ' -f1)"; fi
done"#;
    let seed = seeds(&[1, 2, 3])[0];
    println!("docker files cache edits: seed {seed} (BERTH_DEDUP_SEEDS={seed} replays it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = dir.path().join("store");
    let manifest = fs_store_manifest(dir.path(), &store);
    let snapshot = format!("remote:{}", manifest.display());
    let image = test_image();
    berth_ok(
        &home,
        &[
            "create",
            "dr",
            "--snapshot",
            &snapshot,
            "--dedup",
            "--keep",
            "20",
            "--backend",
            "docker",
            "--image",
            &image,
        ],
    );
    let exec = |script: &str| berth_ok(&home, &["exec", "dr", "--", script]);
    exec("mkdir -p tree/small tree/d/e && head -c 300000 /dev/urandom > tree/a.bin && printf hello > tree/b.txt \
          && printf in > tree/d/e/f && truncate -s 1M tree/sparse && for i in 1 2 3; do printf $i > tree/small/f$i; done");
    let steps = 5;
    let mut listings = Vec::new();
    let mut unchanged = 0;
    for step in 0..steps {
        if step > 0 {
            for k in 0..2 {
                exec(&random_edit(&mut rng, step * 10 + k));
            }
        }
        if step % 2 == 1 {
            tokio::time::sleep(
                berth::workspace::tree::RACY_WINDOW + std::time::Duration::from_millis(100),
            )
            .await;
        }
        listings.push(exec(LISTING));
        berth_ok(&home, &["stop", "dr"]);
        unchanged += record(&berth_state(&home, "dr"))
            .last_stop
            .unwrap()
            .files_unchanged;
    }
    assert!(
        unchanged > 0,
        "the files cache never matched a file in the container"
    );
    for (i, expected) in listings.iter().enumerate() {
        let number = (i + 1).to_string();
        berth_ok(
            &home,
            &[
                "start",
                "dr",
                "--snapshot-generation",
                &number,
                "--discard-workspace",
            ],
        );
        assert_eq!(
            &exec(LISTING),
            expected,
            "seed {seed}: generation {number} did not come back identically in a new container"
        );
    }
    berth_ok(&home, &["rm", "dr"]);
}
