//! A warm pool on the swarm: members placed by the swarm (spread over its
//! nodes), claimed at once through the server, removed with the pool.

use super::*;

/// `berth pool ls --json`'s view of `pool`.
fn pool_view(s: &Setup, pool: &str) -> serde_json::Value {
    let listed: serde_json::Value =
        serde_json::from_str(&berth_ok(s.home(), &["pool", "ls", "--json"])).unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == pool)
        .cloned()
        .unwrap_or_default()
}

/// Removes the pool and stops the server whatever happened (members left
/// behind would skew where the next test's sandboxes are placed).
struct PoolGone<'a>(&'a Setup, &'a str);

impl Drop for PoolGone<'_> {
    fn drop(&mut self) {
        let _ = berth_in(self.0.home(), &["pool", "rm", self.1]);
        let _ = berth_in(self.0.home(), &["server", "stop"]);
    }
}

#[test]
fn a_pool_on_the_swarm_hands_over_members_placed_on_its_nodes() {
    let _serial = serial();
    let Some(s) = setup("a_pool_on_the_swarm_hands_over_members_placed_on_its_nodes") else {
        return;
    };
    let snapshot = format!("remote:{}", s.manifest.display());
    let image = test_image();
    berth_ok(
        s.home(),
        &[
            "pool",
            "create",
            "sp",
            "--size",
            "3",
            "--backend",
            "swarm",
            "--engine",
            &s.swarm.manager,
            "--image",
            &image,
            "--snapshot",
            &snapshot,
        ],
    );
    let _gone = PoolGone(&s, "sp");
    let deadline = Instant::now() + Duration::from_secs(240);
    while pool_view(&s, "sp")["ready"] != 3 {
        assert!(Instant::now() < deadline, "{:#}", pool_view(&s, "sp"));
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut nodes = std::collections::BTreeSet::new();
    for i in 0..3 {
        let name = format!("sp{i}");
        let out = berth_ok(s.home(), &["create", &name, "--from-pool", "sp"]);
        assert!(out.contains("(a warm sandbox)"), "{out}");
        assert_eq!(s.exec(&name, "ls -A | wc -l").trim(), "0");
        nodes.insert(s.node_of(&name));
    }
    assert!(nodes.len() >= 2, "the pool's members all ran on {nodes:?}");
    let removed = berth_ok(s.home(), &["pool", "rm", "sp"]);
    assert!(removed.contains("removed pool sp"), "{removed}");
    s.remove_all(&["sp0".into(), "sp1".into(), "sp2".into()]);
}
