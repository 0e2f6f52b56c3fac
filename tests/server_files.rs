//! The file API through the server stays in the workspace: every operation
//! (read, write, stat, list, delete, mkdir) refuses a path out of it — with
//! `..`, absolute, and through symlinks the sandbox planted — and the files
//! outside are untouched. The escapes aim only at directories this test
//! made, so a hole fails the test and harms nothing.

use super::*;

/// `path` as a query value.
fn query(path: &str) -> String {
    path.replace('%', "%25")
        .replace('/', "%2F")
        .replace(' ', "%20")
}

#[tokio::test(flavor = "multi_thread")]
async fn every_file_operation_over_the_api_refuses_paths_out_of_the_workspace() {
    let served = Served::start(&[]);
    let api = served.client();
    let outside = tempfile::tempdir().unwrap();
    let canary = outside.path().join("keep");
    std::fs::write(&canary, b"canary\n").unwrap();
    api.post(
        "/v1/sandboxes",
        serde_json::json!({"name": "w", "snapshot": "noop"}),
    )
    .await
    .ok();
    let setup = format!(
        "mkdir -p d && echo old > d/f && ln -s {} out && ln -s ../.. up && pwd",
        outside.path().display()
    );
    let (out, err, code) = collect(&api.exec_lines("w", &setup).await);
    assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&err));
    let workspace = PathBuf::from(String::from_utf8_lossy(&out).trim());
    let parent = workspace.parent().unwrap().to_path_buf();
    let grandparent = parent.parent().unwrap().to_path_buf();
    let before_parent = listing(&parent);
    let before_grandparent = listing(&grandparent);

    let absolute = outside.path().join("new").display().to_string();
    let escapes = [
        "../x",
        "d/../../x",
        absolute.as_str(),
        "out/keep",
        "out/new",
        "out/new/deeper",
        "up/x",
    ];
    let base = "/v1/sandboxes/w/files";
    for path in escapes {
        let q = query(path);
        let mut replies = vec![
            ("read", api.get(&format!("{base}/content?path={q}")).await),
            ("stat", api.get(&format!("{base}/stat?path={q}")).await),
            ("list", api.get(&format!("{base}/list?path={q}")).await),
            (
                "delete",
                api.send(
                    Method::DELETE,
                    &format!("{base}?path={q}&recursive=1"),
                    full(Bytes::new()),
                )
                .await,
            ),
            (
                "mkdir",
                api.send(
                    Method::POST,
                    &format!("{base}/mkdir?path={q}&parents=1"),
                    full(Bytes::new()),
                )
                .await,
            ),
        ];
        let written = api
            .send_raw(
                Method::PUT,
                &format!("{base}/content?path={q}"),
                &[("content-length", "7".into())],
                full(&b"escaped"[..]),
            )
            .await
            .unwrap();
        let status = written.status();
        let body = written.into_body().collect().await.unwrap().to_bytes();
        replies.push(("write", Reply { status, body }));
        for (operation, reply) in replies {
            assert_eq!(
                (reply.status, reply.code().as_str()),
                (StatusCode::FORBIDDEN, "path_refused"),
                "{operation} {path:?}: {}",
                String::from_utf8_lossy(&reply.body)
            );
        }
    }
    // Listing a symlink to a directory outside would list outside.
    let through = api.get(&format!("{base}/list?path=out")).await;
    assert_eq!(through.status, StatusCode::FORBIDDEN, "list out");

    // Nothing outside changed: the canary whole, no new entry beside it,
    // beside the workspace or above it.
    assert_eq!(std::fs::read(&canary).unwrap(), b"canary\n");
    assert_eq!(listing(outside.path()), ["keep"]);
    assert_eq!(listing(&parent), before_parent);
    assert_eq!(listing(&grandparent), before_grandparent);

    // Inside, the same operations work, and removing the symlink removes
    // the link, not what it points at.
    api.send(
        Method::POST,
        &format!("{base}/mkdir?path=a%2Fb&parents=1"),
        full(Bytes::new()),
    )
    .await
    .ok();
    let stat = api
        .get(&format!("{base}/stat?path=a%2Fb"))
        .await
        .ok()
        .json();
    assert_eq!(stat["type"], "dir", "{stat}");
    api.send(
        Method::DELETE,
        &format!("{base}?path=out"),
        full(Bytes::new()),
    )
    .await
    .ok();
    assert_eq!(std::fs::read(&canary).unwrap(), b"canary\n");
    let (out, _, _) = collect(&api.exec_lines("w", "ls").await);
    assert_eq!(String::from_utf8_lossy(&out), "a\nd\nup\n");
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
