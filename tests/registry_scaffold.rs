//! `berth plugin new` in each language, built, checked, pushed to a private
//! registry and restored through it.

use super::*;

/// `berth plugin new NAME --lang LANG`, built with the command it printed,
/// checked clause by clause, pushed, and used by its pinned reference as a
/// sandbox's store: stop, lose the workspace, start, identical.
fn scaffold_round_trip(test: &str, lang: &str, tools: &[&str]) {
    let path = format!(
        "{}:{}",
        std::env::var("HOME")
            .map(|h| format!("{h}/.cargo/bin"))
            .unwrap_or_default(),
        std::env::var("PATH").unwrap_or_default()
    );
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .env("PATH", &path)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(
                !docker_required(),
                "{test}: {tool} is required (CI is set) but missing; `cargo xtask build-guests` installs the guest toolchains"
            );
            skipped(
                test,
                &format!("{tool} is not installed (`cargo xtask build-guests`)"),
            );
            return;
        }
    }
    let Some(mut reg) = LocalRegistry::start(test, None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let name = format!("my-{lang}-store");
    let project = h.join(&name);
    let addr = reg.addr.clone();
    let run = |dir: &Path, args: &[&str]| berth_registry_in(dir, h, &addr, args);
    let out = ok(
        run(h, &["plugin", "new", &name, "--lang", lang]),
        "plugin new",
    );
    // It refuses to overwrite.
    let e = failed(
        run(h, &["plugin", "new", &name, "--lang", lang]),
        "a second plugin new",
    );
    assert!(e.contains("--force"), "{e}");
    // The build commands it printed, between `cd` and `berth plugin check`.
    let build: Vec<&str> = out
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with("cd "))
        .skip(1)
        .take_while(|l| !l.starts_with("berth "))
        .collect();
    assert!(!build.is_empty(), "no build command in {out}");
    for command in build {
        let status = Command::new("sh")
            .args(["-c", command])
            .current_dir(&project)
            .env("PATH", &path)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .unwrap();
        assert!(status.success(), "{test}: `{command}` failed: {status}");
    }
    let manifest = project.join("berth-plugin.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let parsed = PluginManifest::from_file(&manifest).unwrap();
    assert_eq!(parsed.grants.dirs.len(), 1, "{text}");
    assert_eq!(parsed.grants.dirs[0].host, project.join("./store-data"));
    assert!(
        parsed.grants.http.is_empty() && parsed.grants.env.is_empty(),
        "{text}"
    );
    let report = ok(
        run(
            &project,
            &[
                "plugin",
                "check",
                "berth-plugin.toml",
                "--large-size",
                "32MiB",
                "--medium-size",
                "4MiB",
            ],
        ),
        "plugin check",
    );
    assert!(report.contains(", 0 failed"), "{report}");
    let reference = pushed(&ok(
        run(
            &project,
            &[
                "plugin",
                "push",
                "berth-plugin.toml",
                &reg.reference(&format!("plugins/{name}:0.1.0")),
            ],
        ),
        "plugin push",
    ));
    reg.stop();

    // A store manifest naming the pinned reference; the registry is gone,
    // so the load is served by the cache the push filled.
    let store = h.join("store.toml");
    std::fs::write(
        &store,
        text.replace(
            &text
                .lines()
                .find(|l| l.starts_with("component"))
                .unwrap()
                .to_string(),
            &format!("component = \"{reference}\""),
        )
        .replace("./store-data", project.join("store-data").to_str().unwrap()),
    )
    .unwrap();
    let snap = format!("remote:{}", store.display());
    ok(run(h, &["create", "s1", "--snapshot", &snap]), "create");
    ok(
        run(h, &["exec", "s1", "--", "mkdir -p a/b && printf 'x%.0s' $(seq 1 5000) > a/b/f && ln -s b/f a/l && chmod 600 a/b/f"]),
        "exec",
    );
    let before = ok(
        run(
            h,
            &[
                "exec",
                "s1",
                "--",
                "ls -lR --time-style=+%s . | sort; md5sum a/b/f",
            ],
        ),
        "list",
    );
    ok(run(h, &["stop", "s1"]), "stop");
    let state = berth_tests::berth_state(h, "s1");
    berth_tests::remove_workspace(berth_tests::local_root(&state));
    ok(run(h, &["start", "s1"]), "start");
    let after = ok(
        run(
            h,
            &[
                "exec",
                "s1",
                "--",
                "ls -lR --time-style=+%s . | sort; md5sum a/b/f",
            ],
        ),
        "list after",
    );
    assert_eq!(before, after);
    ok(run(h, &["rm", "s1"]), "rm");
}

/// [`berth_registry`] in `dir`, with the docker config at `home`.
fn berth_registry_in(
    dir: &Path,
    home: &Path,
    registry: &str,
    args: &[&str],
) -> std::process::Output {
    Command::new(berth_bin())
        .current_dir(dir)
        .env("BERTH_HOME", home)
        .env("BERTH_PLUGIN_CACHE", home.join("plugin-cache"))
        .env("BERTH_REGISTRY_PLAIN_HTTP", registry)
        .env("DOCKER_CONFIG", home)
        .env("RUST_LOG", "berth=info")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn scaffold_in_rust_builds_checks_pushes_and_restores() {
    scaffold_round_trip("scaffold_in_rust", "rust", &["cargo"]);
}

#[test]
fn scaffold_in_python_builds_checks_pushes_and_restores() {
    scaffold_round_trip("scaffold_in_python", "python", &["componentize-py"]);
}

#[test]
fn scaffold_in_js_builds_checks_pushes_and_restores() {
    scaffold_round_trip("scaffold_in_js", "js", &["node", "npm"]);
}

#[test]
fn scaffold_in_c_builds_checks_pushes_and_restores() {
    scaffold_round_trip(
        "scaffold_in_c",
        "c",
        &["wit-bindgen", "clang", "wasm-tools"],
    );
}
