//! A swarm without a leader: what waits for one.

use super::*;

/// While the swarm has no leader (two of its three managers' engines
/// down), creates and commands wait for one, saying so, within the
/// placement timeout; once the engines are back and a leader is elected,
/// every one of them succeeds — none fails with the manager's raw "no
/// leader" answer.
#[test]
fn without_a_leader_creates_and_commands_wait_for_one() {
    let _serial = serial();
    let Some(s) = setup("without_a_leader_creates_and_commands_wait_for_one") else {
        return;
    };
    s.create("lw0", &[]);
    assert_eq!(s.exec("lw0", "echo before"), "before\n");
    let down: Vec<String> = s.swarm.nodes.iter().skip(1).cloned().collect();
    for node in &down {
        s.swarm.kill_daemon(node);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.swarm.docker("n1", &["node", "ls", "-q"]).is_ok() {
        assert!(Instant::now() < deadline, "n1 still has a leader");
        std::thread::sleep(Duration::from_millis(200));
    }
    let lost_at = Instant::now();
    let back = {
        let swarm = s.swarm.clone();
        let down = down.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(4));
            for node in &down {
                swarm.start_daemon(node);
            }
        })
    };
    let outputs: Vec<(String, Output)> = std::thread::scope(|scope| {
        let mut tasks: Vec<_> = (1..=2)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    let name = format!("lw{i}");
                    let out = s.try_create(&name, &["--placement-timeout", "240"]);
                    (name, out)
                })
            })
            .collect();
        tasks.push(scope.spawn(|| {
            let out = berth_in(s.home(), &["exec", "lw0", "--", "echo during"]);
            ("lw0".to_string(), out)
        }));
        tasks.into_iter().map(|t| t.join().unwrap()).collect()
    });
    back.join().unwrap();
    for (name, out) in &outputs {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        assert!(
            !stderr.contains("does not have a leader"),
            "{name}: {stderr}"
        );
    }
    assert!(
        lost_at.elapsed() >= Duration::from_secs(4),
        "the commands did not wait"
    );
    for name in ["lw1", "lw2"] {
        assert_eq!(s.exec(name, "echo after"), "after\n");
    }
    s.remove_all(&["lw0".into(), "lw1".into(), "lw2".into()]);
}
