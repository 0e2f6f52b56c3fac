//! What a newcomer hit in the first hour, each through the CLI in fresh
//! processes: a read-only bind that was writable, `rm` that left every
//! snapshot behind, `fork` from the selected rather than the newest
//! generation, the local backend's silent root, output that read as debug
//! text, errors that did not name what failed, and README steps that
//! failed as printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use berth_tests::{berth_bin, berth_in, berth_ok, berth_state, guest, repo_root};

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `berth ARGS`, which must fail; its stderr.
fn berth_err(home: &Path, args: &[&str]) -> String {
    let out = berth_in(home, args);
    let (stdout, stderr) = text(&out);
    assert!(
        !out.status.success(),
        "berth {args:?} should have failed: {stdout}{stderr}"
    );
    stderr
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// A scratch directory with a `home` for berth and a host directory
/// `data` holding `in.txt`, to bind into workspaces.
fn bind_fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    write(&data.join("in.txt"), "host data\n");
    (dir, home, data)
}

fn manifest_with_bind(dir: &Path, host: &Path, read_only: bool) -> PathBuf {
    let ws = dir.join("ws.json");
    write(
        &ws,
        &serde_json::json!({"entries": {
            "keep.txt": {"type": "file", "content": "kept\n"},
            "datasets": {"type": "bind_mount", "host_path": host, "read_only": read_only}
        }})
        .to_string(),
    );
    ws
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// `berth plugin check TARGET` with small round trips.
fn quick_check(target: &Path) -> Output {
    Command::new(berth_bin())
        .args([
            "plugin",
            "check",
            "--large-size",
            "0",
            "--medium-size",
            "1MiB",
        ])
        .arg(target)
        .output()
        .unwrap()
}

/// A manifest for the fs-store storing in `dir/store` (not created: the
/// rw grant creates it).
fn fs_store_manifest(dir: &Path) -> PathBuf {
    let path = dir.join("store.toml");
    write(
        &path,
        &format!(
            "name = \"fs-store\"\ncomponent = {:?}\nworld = \"remote-client-plugin\"\n\
             [config]\nroot = \"/data\"\n[[grants.dirs]]\nhost = \"store\"\nguest = \"/data\"\nmode = \"rw\"\n",
            guest("fs_store")
        ),
    );
    path
}

/// Confined (the default), a read-only bind is mounted read-only by the
/// kernel: the command cannot write through it, and reads it.
#[test]
fn a_confined_local_sandbox_mounts_a_read_only_bind_read_only() {
    let (dir, home, data) = bind_fixture();
    let ws = manifest_with_bind(dir.path(), &data, true);
    berth_ok(
        &home,
        &["create", "ro", "--workspace", ws.to_str().unwrap()],
    );
    let out = berth_in(
        &home,
        &[
            "exec",
            "ro",
            "--",
            "cat datasets/in.txt; echo x > datasets/new.txt",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "the write went through: {stdout}");
    assert!(stderr.contains("Read-only file system"), "{stderr}");
    assert!(!stdout.is_empty(), "the bind was not readable");
    assert_eq!(files_under(&data), vec![data.join("in.txt")]);
    berth_ok(&home, &["rm", "ro"]);
    assert!(
        data.join("in.txt").exists(),
        "rm must not touch a bind mount"
    );
}

/// Unconfined, a bind is a link to the host directory, writable by every
/// command: a read-only one is refused rather than made writable.
#[test]
fn an_unconfined_local_sandbox_refuses_a_read_only_bind_rather_than_make_it_writable() {
    let (dir, home, data) = bind_fixture();
    let ws = manifest_with_bind(dir.path(), &data, true);
    let err = berth_err(
        &home,
        &[
            "create",
            "ro",
            "--isolation",
            "none",
            "--workspace",
            ws.to_str().unwrap(),
        ],
    );
    assert!(err.contains("read-only bind mount"), "{err}");
    assert!(err.contains("datasets"), "{err}");
    assert!(err.contains("Docker backend"), "{err}");
    assert!(
        !home.join("sandboxes/ro.json").exists(),
        "a refused create must not leave a sandbox"
    );
    assert_eq!(files_under(&data), vec![data.join("in.txt")]);

    // A sandbox made before the refusal existed (its state says read-only)
    // is refused at start too, before anything is linked.
    let ws_rw = manifest_with_bind(dir.path(), &data, false);
    berth_ok(
        &home,
        &[
            "create",
            "old",
            "--isolation",
            "none",
            "--workspace",
            ws_rw.to_str().unwrap(),
            "--no-start",
        ],
    );
    let state_path = home.join("sandboxes/old.json");
    let mut saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    saved["state"]["manifest"]["entries"]["datasets"]["read_only"] = true.into();
    std::fs::write(&state_path, saved.to_string()).unwrap();
    let err = berth_err(&home, &["exec", "old", "--", "echo x > datasets/new.txt"]);
    assert!(err.contains("read-only bind mount"), "{err}");
    assert_eq!(files_under(&data), vec![data.join("in.txt")]);
    berth_ok(&home, &["rm", "old"]);

    // A writable bind is what it says: the host directory, writable.
    berth_ok(
        &home,
        &[
            "create",
            "rw",
            "--isolation",
            "none",
            "--workspace",
            ws_rw.to_str().unwrap(),
        ],
    );
    berth_ok(&home, &["exec", "rw", "--", "echo x > datasets/new.txt"]);
    assert_eq!(
        std::fs::read_to_string(data.join("new.txt")).unwrap(),
        "x\n"
    );
    berth_ok(&home, &["rm", "rw"]);
    assert!(
        data.join("in.txt").exists(),
        "rm must not touch a bind mount"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_mounts_a_read_only_bind_read_only() {
    if berth_tests::docker_or_skip("docker_mounts_a_read_only_bind_read_only")
        .await
        .is_none()
    {
        return;
    }
    let (dir, home, data) = bind_fixture();
    let ws = manifest_with_bind(dir.path(), &data, true);
    let image = berth_tests::test_image();
    let create = [
        "create",
        "dro",
        "--backend",
        "docker",
        "--image",
        image.as_str(),
        "--workspace",
        ws.to_str().unwrap(),
    ];
    berth_ok(&home, &create);
    let out = berth_in(&home, &["exec", "dro", "--", "cat datasets/in.txt"]);
    let (stdout, _) = text(&out);
    assert_eq!(stdout, "host data\n");
    let out = berth_in(&home, &["exec", "dro", "--", "echo x > datasets/new.txt"]);
    let (_, stderr) = text(&out);
    let rm = berth_in(&home, &["rm", "--force", "dro"]);
    assert!(!out.status.success(), "a read-only bind was writable");
    assert!(stderr.contains("Read-only file system"), "{stderr}");
    assert!(rm.status.success(), "{:?}", text(&rm));
    assert_eq!(files_under(&data), vec![data.join("in.txt")]);
}

#[test]
fn rm_deletes_the_local_snapshot_it_made_unless_told_to_keep_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    berth_ok(&home, &["create", "a"]);
    berth_ok(&home, &["exec", "a", "--", "echo one > f.txt"]);
    berth_ok(&home, &["stop", "a"]);
    let id = berth_state(&home, "a").snapshot.id.to_string();
    let archive = home.join("snapshots").join(format!("{id}.tar"));
    assert!(archive.is_file());
    let out = berth_ok(&home, &["rm", "a"]);
    assert!(out.contains(&format!("deleted snapshot {id}")), "{out}");
    assert!(out.contains(archive.to_str().unwrap()), "{out}");
    assert!(!archive.exists(), "rm left {}", archive.display());
    assert_eq!(files_under(&home.join("workspaces")), Vec::<PathBuf>::new());

    // --keep-snapshot persists first (the unsaved change included) and
    // keeps the archive.
    berth_ok(&home, &["create", "b"]);
    berth_ok(&home, &["exec", "b", "--", "echo unsaved > g.txt"]);
    let id = berth_state(&home, "b").snapshot.id.to_string();
    let out = berth_ok(&home, &["rm", "--keep-snapshot", "b"]);
    assert!(!out.contains("deleted snapshot"), "{out}");
    let archive = home.join("snapshots").join(format!("{id}.tar"));
    let mut names = Vec::new();
    for e in tar::Archive::new(std::fs::File::open(&archive).unwrap())
        .entries()
        .unwrap()
    {
        names.push(e.unwrap().path().unwrap().display().to_string());
    }
    assert!(names.iter().any(|n| n.ends_with("g.txt")), "{names:?}");

    // gc --orphans finds the kept archive (no sandbox uses it) and a
    // stray one, lists them, and deletes only with --yes.
    let stray = home.join("snapshots/berth-stray.tar");
    std::fs::copy(&archive, &stray).unwrap();
    let dry = berth_ok(&home, &["gc", "--orphans"]);
    assert!(
        dry.contains(&format!("would delete {}", stray.display())),
        "{dry}"
    );
    assert!(
        dry.contains(&format!("would delete {}", archive.display())),
        "{dry}"
    );
    assert!(dry.contains("--yes"), "{dry}");
    assert!(stray.exists() && archive.exists());
    berth_ok(&home, &["create", "c"]);
    berth_ok(&home, &["stop", "c"]);
    let c_archive = home
        .join("snapshots")
        .join(format!("{}.tar", berth_state(&home, "c").snapshot.id));
    let done = berth_ok(&home, &["gc", "--orphans", "--yes"]);
    assert!(done.contains("deleted"), "{done}");
    assert!(!stray.exists() && !archive.exists());
    assert!(
        c_archive.exists(),
        "gc --orphans deleted a live sandbox's snapshot"
    );
    let again = berth_ok(&home, &["gc", "--orphans"]);
    assert!(again.contains("no orphans"), "{again}");
}

#[test]
fn rm_of_deduplicated_snapshots_keeps_what_forks_need_and_gc_orphans_collects_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = fs_store_manifest(dir.path());
    let data = dir.path().join("store");
    let remote = format!("remote:{}", store.display());
    berth_ok(
        &home,
        &[
            "create",
            "src",
            "--snapshot",
            &remote,
            "--dedup",
            "--keep",
            "2",
        ],
    );
    berth_ok(
        &home,
        &[
            "exec",
            "src",
            "--",
            "head -c 300000 /dev/urandom > big; echo one > n",
        ],
    );
    berth_ok(&home, &["stop", "src"]);
    berth_ok(&home, &["exec", "src", "--", "echo two > n"]);
    berth_ok(&home, &["stop", "src"]);
    assert!(!files_under(&data).is_empty());
    berth_ok(&home, &["fork", "src", "f1"]);
    berth_ok(&home, &["exec", "f1", "--", "echo fork > n"]);
    berth_ok(&home, &["stop", "f1"]);
    let big = berth_ok(&home, &["exec", "f1", "--", "sha256sum big"]);

    // The source goes; the generation f1 starts from stays.
    let out = berth_ok(&home, &["rm", "src"]);
    assert!(out.contains("deleted snapshot"), "{out}");
    assert!(out.contains("a fork starts from it"), "{out}");
    assert!(out.contains("berth gc --orphans"), "{out}");
    // f1 still restores from nothing: its workspace gone, its own
    // generation needs the source's packs.
    let f1 = berth_state(&home, "f1");
    berth_tests::remove_workspace(berth_tests::local_root(&f1));
    assert_eq!(berth_ok(&home, &["exec", "f1", "--", "cat n"]), "fork\n");
    assert_eq!(berth_ok(&home, &["exec", "f1", "--", "sha256sum big"]), big);
    let dry = berth_ok(&home, &["gc", "--orphans"]);
    assert!(dry.contains("kept"), "{dry}");
    assert!(!dry.contains("would delete"), "{dry}");

    // The fork goes too: only the source's leftover remains, which
    // gc --orphans now deletes, leaving the store empty.
    let out = berth_ok(&home, &["rm", "f1"]);
    assert!(out.contains("deleted snapshot"), "{out}");
    assert!(!files_under(&data).is_empty());
    let dry = berth_ok(&home, &["gc", "--orphans"]);
    assert!(dry.contains("would delete what removed snapshot"), "{dry}");
    assert!(
        !files_under(&data).is_empty(),
        "a dry run deleted something"
    );
    berth_ok(&home, &["gc", "--orphans", "--yes"]);
    assert_eq!(files_under(&data), Vec::<PathBuf>::new());
    assert!(berth_ok(&home, &["gc", "--orphans"]).contains("no orphans"));
}

#[test]
fn fork_starts_from_the_newest_generation_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = fs_store_manifest(dir.path());
    let remote = format!("remote:{}", store.display());
    berth_ok(
        &home,
        &[
            "create",
            "a",
            "--snapshot",
            &remote,
            "--dedup",
            "--keep",
            "3",
        ],
    );
    for g in 1..=3 {
        berth_ok(&home, &["exec", "a", "--", &format!("echo {g} > gen")]);
        berth_ok(&home, &["stop", "a"]);
    }
    let out = berth_ok(
        &home,
        &[
            "start",
            "a",
            "--snapshot-generation",
            "2",
            "--discard-workspace",
        ],
    );
    assert!(out.contains("restored from the snapshot"), "{out}");
    assert_eq!(berth_ok(&home, &["exec", "a", "--", "cat gen"]), "2\n");

    let out = berth_ok(&home, &["fork", "a", "b"]);
    assert!(out.contains("from a generation 3 (its newest)"), "{out}");
    assert_eq!(berth_ok(&home, &["exec", "b", "--", "cat gen"]), "3\n");
    let out = berth_ok(&home, &["fork", "a", "c", "--generation", "1"]);
    assert!(out.contains("from a generation 1"), "{out}");
    assert!(!out.contains("newest"), "{out}");
    assert_eq!(berth_ok(&home, &["exec", "c", "--", "cat gen"]), "1\n");
    let err = berth_err(&home, &["fork", "a", "d", "--generation", "9"]);
    assert!(err.contains("generation 9"), "{err}");
    assert!(err.contains("kept: 1, 2, 3"), "{err}");
    assert!(!home.join("sandboxes/d.json").exists());
}

#[test]
fn the_local_backend_says_where_it_keeps_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let ws = dir.path().join("ws.json");
    write(&ws, r#"{"root": "/workspace", "entries": {}}"#);
    let out = berth_in(&home, &["create", "r", "--workspace", ws.to_str().unwrap()]);
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let root = berth_tests::local_root(&berth_state(&home, "r"));
    assert!(
        stderr.contains(&format!(
            "keeps the workspace in {}, not at the manifest's root /workspace",
            root.display()
        )),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("note:").count(),
        1,
        "one line, once: {stderr}"
    );
    // No root named: nothing to say.
    let out = berth_in(&home, &["create", "s"]);
    assert!(!text(&out).1.contains("note:"), "{:?}", text(&out));
}

#[test]
fn output_reads_as_words_and_columns_line_up() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let out = berth_ok(&home, &["create", "a-rather-long-sandbox-name"]);
    assert!(out.contains("created a-rather-long-sandbox-name"), "{out}");
    berth_ok(&home, &["create", "b", "--snapshot-id", "short"]);
    berth_ok(&home, &["exec", "b", "--", "echo x > f"]);
    let out = berth_ok(&home, &["stop", "b"]);
    assert!(
        out.starts_with("stopped b: workspace saved to snapshot short ("),
        "{out}"
    );
    assert!(!out.contains("1 calls"), "{out}");
    let b = berth_state(&home, "b");
    berth_tests::remove_workspace(berth_tests::local_root(&b));
    let out = berth_ok(&home, &["start", "b"]);
    assert_eq!(
        out.trim(),
        "started b: workspace was gone; restored from the snapshot"
    );
    for debug in ["Rebuild", "Restore", "restored: true", "{"] {
        assert!(!out.contains(debug), "{out}");
    }

    let ls = berth_ok(&home, &["ls"]);
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(lines.len(), 3, "{ls}");
    let header = lines[0];
    let at = |l: &str, word: &str| l.find(word).unwrap_or_else(|| panic!("{word} in {l:?}"));
    let id_column = at(header, "SNAPSHOT ID");
    let ready_column = at(header, "READY");
    for (line, id) in lines[1..].iter().zip([
        berth_state(&home, "a-rather-long-sandbox-name")
            .snapshot
            .id
            .to_string(),
        "short".to_string(),
    ]) {
        assert_eq!(at(line, &id), id_column, "{ls}");
        assert_eq!(&line[ready_column..ready_column + 3], "yes", "{ls}");
    }

    let out = quick_check(&guest("fs_store"));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let first = stdout.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        "fs_store: the berth:snapshot/remote-client contract, clause by clause"
    );
    let help = Command::new(berth_bin())
        .args(["plugin", "--help"])
        .output()
        .unwrap();
    let help = text(&help).0;
    // No "try …" hint in the help (a word, not "registry").
    assert!(
        !help
            .split(|c: char| !c.is_alphanumeric())
            .any(|w| w.eq_ignore_ascii_case("try")),
        "{help}"
    );
    assert!(help.contains("check") && help.contains("inspect"), "{help}");
}

#[test]
fn errors_name_what_failed() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // A local_dir whose path does not exist: refused at create, by name.
    let ws = dir.path().join("ws.json");
    write(
        &ws,
        r#"{"entries": {"src": {"type": "local_dir", "path": "nosrc"}}}"#,
    );
    let err = berth_err(&home, &["create", "e", "--workspace", ws.to_str().unwrap()]);
    let missing = dir.path().join("nosrc");
    assert!(
        err.contains(&format!(
            "workspace entry \"src\": its host path {} does not exist",
            missing.display()
        )),
        "{err}"
    );
    assert!(!err.contains("tar"), "{err}");
    assert!(!home.join("sandboxes/e.json").exists());
    // A relative path means the manifest's directory, whatever the cwd.
    std::fs::create_dir_all(&missing).unwrap();
    write(&missing.join("main.py"), "print(1)\n");
    let out = Command::new(berth_bin())
        .current_dir("/")
        .env("BERTH_HOME", &home)
        .args(["create", "e", "--workspace", ws.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(
        berth_ok(&home, &["exec", "e", "--", "cat src/main.py"]),
        "print(1)\n"
    );

    // A text file or garbage given to hydrate: the file is named, its
    // bytes are not echoed, and the workspace is unchanged.
    let notes = dir.path().join("notes.txt");
    write(&notes, &"not a tar archive, just some notes\n".repeat(40));
    let err = berth_err(&home, &["hydrate", "e", notes.to_str().unwrap()]);
    assert!(err.contains(notes.to_str().unwrap()), "{err}");
    assert!(!err.contains("just some notes"), "{err}");
    let garbage = dir.path().join("garbage.bin");
    std::fs::write(
        &garbage,
        (0..4096u32)
            .map(|i| (i * 7 % 251) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let err = berth_err(&home, &["hydrate", "e", garbage.to_str().unwrap()]);
    assert!(err.contains(garbage.to_str().unwrap()), "{err}");
    assert!(
        err.len() < 600,
        "a short error, not the file's bytes: {err}"
    );
    assert_eq!(
        berth_ok(&home, &["exec", "e", "--", "ls"]),
        "src\n",
        "a refused archive wrote something"
    );

    // A grant the component cannot use is a warning, by name.
    let manifest = dir.path().join("http.toml");
    write(
        &manifest,
        &format!(
            "name = \"no-http\"\ncomponent = {:?}\nworld = \"remote-client-plugin\"\n\
             [config]\nroot = \"/data\"\n[grants]\nhttp_hosts = [\"http://127.0.0.1:9\"]\n\
             [[grants.dirs]]\nhost = \"hstore\"\nguest = \"/data\"\nmode = \"rw\"\n",
            guest("fs_store")
        ),
    );
    let out = quick_check(&manifest);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("grants.http_hosts") && stderr.contains("imports no wasi:http"),
        "{stderr}"
    );
    // The rw directory it grants did not exist: it was created, 0700.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("hstore"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

/// The `sh` blocks of the README's sections "Using the CLI" (with its
/// part on deduplicated snapshots) and "Writing a plugin", run as printed
/// in one shell from the repository root. The only line not run as
/// written is the build of the CLI, which this test's build already did
/// (running it here could rebuild the binary other tests use).
#[test]
fn readme_sections_run_as_printed() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let mut script = String::from(
        "set -euo pipefail\n\
         cargo() { if [ \"$*\" = 'build -p berth-cli' ]; then return 0; fi; command cargo \"$@\"; }\n",
    );
    let mut blocks = 0;
    for (section, until) in [
        ("## Using the CLI\n", "### Several machines\n"),
        ("## Writing a plugin", "## Layout\n"),
    ] {
        let start = readme.find(section).unwrap_or_else(|| panic!("{section}"));
        let end = start + readme[start..].find(until).unwrap();
        let mut lines = readme[start..end].lines();
        while let Some(line) = lines.next() {
            if line.trim_start() != "```sh" {
                continue;
            }
            let indent = line.len() - line.trim_start().len();
            blocks += 1;
            for body in lines.by_ref() {
                if body.trim_start() == "```" {
                    break;
                }
                script.push_str(body.get(indent..).unwrap_or(body.trim_start()));
                script.push('\n');
            }
        }
    }
    assert!(blocks >= 3, "{blocks} sh blocks found");
    let home = tempfile::tempdir().unwrap();
    let bin_dir = berth_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(repo_root())
        .env("BERTH_HOME", home.path())
        .env("PATH", path)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "the README's steps failed as printed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("removed agent1"), "{stdout}");
    assert!(stdout.contains("0 failed"), "{stdout}");
    assert_eq!(
        files_under(&home.path().join("sandboxes")),
        Vec::<PathBuf>::new(),
        "the README's steps leave no sandbox behind"
    );
}

/// A store that fails while `rm` deletes the snapshot: the error names the
/// plugin, the call and the trap on one line, the state stays, and `rm`
/// again (the store mended) finishes the job.
#[test]
fn rm_keeps_the_sandbox_when_its_store_fails_and_finishes_when_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = fs_store_manifest(dir.path());
    let good = std::fs::read_to_string(&store).unwrap();
    let remote = format!("remote:{}", store.display());
    berth_ok(&home, &["create", "r", "--snapshot", &remote]);
    berth_ok(&home, &["exec", "r", "--", "echo x > f"]);
    berth_ok(&home, &["stop", "r"]);
    let stored = files_under(&dir.path().join("store"));
    assert_eq!(stored.len(), 1, "{stored:?}");
    write(
        &store,
        &format!(
            "name = \"faulty\"\ncomponent = {:?}\nworld = \"remote-client-plugin\"\n[config]\nfault = \"trap\"\n",
            guest("faulty_store")
        ),
    );
    let err = berth_err(&home, &["rm", "r"]);
    assert!(err.contains("plugin faulty trapped during"), "{err}");
    assert!(!err.contains("wasm backtrace:"), "{err}");
    assert!(!err.contains("_cabi"), "{err}");
    assert!(err.contains("`berth rm r` again"), "{err}");
    assert!(home.join("sandboxes/r.json").exists(), "the state was lost");
    write(&store, &good);
    let out = berth_ok(&home, &["rm", "r"]);
    assert!(out.contains("deleted snapshot"), "{out}");
    assert_eq!(
        files_under(&dir.path().join("store")),
        Vec::<PathBuf>::new()
    );
}

/// The Docker socket is never bind-mounted into a sandbox, named directly
/// or through a symlink: the create fails naming it, and leaves nothing.
#[tokio::test(flavor = "multi_thread")]
async fn docker_refuses_to_bind_the_docker_socket() {
    if berth_tests::docker_or_skip("docker_refuses_to_bind_the_docker_socket")
        .await
        .is_none()
    {
        return;
    }
    let socket = ["/run/docker.sock", "/var/run/docker.sock"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("the engine answers on a local socket");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let alias = dir.path().join("alias.sock");
    std::os::unix::fs::symlink(socket, &alias).unwrap();
    let image = berth_tests::test_image();
    for (name, host) in [("direct", socket), ("aliased", alias.as_path())] {
        let ws = dir.path().join(format!("{name}.json"));
        write(
            &ws,
            &serde_json::json!({"entries": {
                "engine.sock": {"type": "bind_mount", "host_path": host}
            }})
            .to_string(),
        );
        let err = berth_err(
            &home,
            &[
                "create",
                name,
                "--backend",
                "docker",
                "--image",
                &image,
                "--workspace",
                ws.to_str().unwrap(),
            ],
        );
        assert!(
            err.contains("refusing to bind-mount the Docker socket"),
            "{err}"
        );
        assert_eq!(err.matches("refusing").count(), 1, "{err}");
    }
    let listed = berth_ok(&home, &["ls", "--json"]);
    assert_eq!(listed.trim(), "[]", "a refused create left a sandbox");
}
