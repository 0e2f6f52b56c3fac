//! The swarm's isolation probe failing closed (part of the `swarm` test
//! binary).

use super::*;

/// The isolation probe fails closed on a node whose engine runs containers
/// without no-new-privileges: a create pinned there fails naming the node
/// and leaves no service; a sandbox whose new task lands there runs
/// nothing in it; once the node is strict again the sandbox comes back
/// from its last stop.
#[test]
fn a_node_without_no_new_privileges_is_refused_by_name_and_runs_nothing() {
    let _serial = serial();
    let Some(s) = setup("a_node_without_no_new_privileges_is_refused_by_name_and_runs_nothing")
    else {
        return;
    };
    let (node, id) = (s.swarm.nodes[2].clone(), s.swarm.ids[2].clone());
    let pin = format!("node.id=={id}");
    let refused = |err: &str| {
        assert!(
            err.contains("less isolated than asked")
                && err.contains(&id[..12])
                && err.contains("--no-new-privileges"),
            "{err}"
        );
        assert_eq!(err.matches("less isolated").count(), 1, "said once: {err}");
    };
    let before = s.swarm.berth_services();
    s.swarm.weaken_runtime(&node);
    refused(&failed(
        &s.try_create("weak", &["--constraint", &pin]),
        "a create there",
    ));
    assert!(!berth_ok(s.home(), &["ls"]).contains("weak"));
    assert_eq!(
        s.swarm.berth_services(),
        before,
        "a service was left behind"
    );

    s.swarm.restore_runtime(&node);
    s.create("pinned", &["--constraint", &pin]);
    assert_eq!(s.node_of("pinned"), node);
    assert_eq!(
        s.exec("pinned", "grep NoNewPrivs /proc/1/status"),
        "NoNewPrivs:\t1\n"
    );
    let listing = s.populate_and_stop("pinned", 0x15017);
    s.swarm.weaken_runtime(&node);
    s.remove_container("pinned");
    let marker = format!("/tmp/ran-{}", std::process::id());
    let touch = format!("touch {marker}");
    refused(&failed(
        &berth_in(s.home(), &["exec", "pinned", "--", &touch]),
        "a command in the new task",
    ));
    let service = format!(
        "label=com.docker.swarm.service.name=berth-{}",
        berth_state(s.home(), "pinned").session_id
    );
    let weak = s
        .swarm
        .docker(&node, &["ps", "-q", "--filter", &service])
        .unwrap();
    assert_eq!(
        weak.lines().count(),
        1,
        "the new task's container: {weak:?}"
    );
    assert!(
        s.swarm
            .docker(&node, &["exec", &weak, "test", "-e", &marker])
            .is_err(),
        "the command ran in a container without no-new-privileges"
    );
    s.swarm.restore_runtime(&node);
    s.swarm.docker(&node, &["rm", "-f", &weak]).unwrap();
    assert_eq!(s.listing("pinned"), listing);
    s.remove_all(&["pinned".to_string()]);
}
