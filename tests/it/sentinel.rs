//! Redis behind Sentinel (`redis+sentinel://`): lockrun asks the Sentinels for the
//! master, follows a failover, and keeps fencing tokens increasing across it; a
//! semaphore's slots and its limit key live on across it too.

use std::time::Duration;

use crate::support::*;

/// How long the Sentinel waits for a silent master before failing it over.
const DOWN_AFTER: Duration = Duration::from_millis(500);

fn token_run(url: &str, s: &Scratch, opts: &[&str]) -> u64 {
    let mut cmd = lockrun_run(
        url,
        "job",
        opts,
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    cmd.env("OUT", s.path("out"));
    run(cmd).assert_code(0);
    s.read("out").trim().parse().unwrap()
}

#[test]
fn sentinel_url_locks_on_the_master() {
    let cluster = Sentinel::start(DOWN_AFTER);
    let s = Scratch::new();
    let token = token_run(&cluster.url(), &s, &[]);
    assert!(token > 0);
    // The lock lived on the master, not on the replica the Sentinel also knows.
    let fence: Option<String> = cluster
        .master()
        .query(redis::cmd("GET").arg(fence_key("job")));
    assert_eq!(fence, Some(token.to_string()));
    let mut status = lockrun();
    status.args(["status", "--url", &cluster.url(), "job"]);
    run(status).assert_code(1);
}

#[test]
fn locking_follows_a_failover_and_tokens_keep_increasing() {
    let mut cluster = Sentinel::start(DOWN_AFTER);
    let s = Scratch::new();
    let before = token_run(&cluster.url(), &s, &[]);
    cluster.kill_master_and_wait_for_failover();
    let after = token_run(&cluster.url(), &s, &["--wait", "20s"]);
    assert!(
        after > before,
        "token {after} after the failover is not above {before}"
    );
    let fence: Option<String> = cluster
        .replica()
        .query(redis::cmd("GET").arg(fence_key("job")));
    assert_eq!(
        fence,
        Some(after.to_string()),
        "the promoted replica holds the lock now"
    );
}

#[test]
fn a_holder_keeps_its_lock_across_a_failover() {
    let mut cluster = Sentinel::start(DOWN_AFTER);
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &cluster.url(),
        "job",
        &["--ttl", "10s"],
        &sh(r#"touch "$STARTED"; sleep 8; exit 3"#),
    );
    cmd.env("STARTED", s.path("started"));
    let mut holder = spawn(cmd);
    wait_until("the holder started", WAIT, || s.exists("started"));
    // Let the lock reach the replica before the master dies.
    wait_until("the lock is replicated", WAIT, || {
        cluster.replica().exists(&lock_key("job"))
    });
    cluster.kill_master_and_wait_for_failover();
    // Renewals now go to the promoted replica, where the lock (and our token) lives on.
    let f = holder.wait_for(Duration::from_secs(60));
    f.assert_code(3);
}

#[test]
fn an_unknown_master_name_fails_closed() {
    let cluster = Sentinel::start(DOWN_AFTER);
    let s = Scratch::new();
    let url = format!(
        "redis+sentinel://127.0.0.1:{}/nosuchmaster",
        cluster.sentinel_port()
    );
    let mut cmd = lockrun_run(&url, "job", &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(f.stderr.contains("nosuchmaster"), "{}", f.stderr);
    assert!(!s.exists("marker"));
}

#[test]
fn a_semaphores_slots_live_on_across_a_failover() {
    let mut cluster = Sentinel::start(DOWN_AFTER);
    let opts = ["--slots", "2", "--ttl", "10s"];
    let mut holders: Vec<(Running, Scratch)> = (0..2)
        .map(|_| {
            let s = Scratch::new();
            let (lr, _) = hold(lockrun_run(&cluster.url(), "job", &opts, &sh(HOLD)), &s);
            (lr, s)
        })
        .collect();
    assert!(
        cluster.master().exists(&slot_key("job", 1)),
        "slot 1 is not on the master"
    );
    wait_until("the slots are replicated", WAIT, || {
        let r = cluster.replica();
        r.exists(&slot_key("job", 0))
            && r.exists(&slot_key("job", 1))
            && r.exists(&limit_key("job"))
    });
    cluster.kill_master_and_wait_for_failover();
    wait_until("the promoted replica says it is a master", WAIT, || {
        let role: Vec<redis::Value> = cluster.replica().query(&redis::cmd("ROLE"));
        role.first() == Some(&redis::Value::BulkString(b"master".to_vec()))
    });
    // On the promoted replica both slots are held, with the holders' N.
    let s = Scratch::new();
    let mut busy = lockrun_run(
        &cluster.url(),
        "job",
        &["--slots", "2"],
        &sh(r#"touch "$MARKER""#),
    );
    busy.env("MARKER", s.path("marker"));
    run(busy).assert_failure(75);
    let f = run(lockrun_run(
        &cluster.url(),
        "job",
        &[],
        &sh(r#"touch "$MARKER""#),
    ));
    f.assert_failure(125);
    assert!(f.stderr.contains("--slots 2"), "{}", f.stderr);
    assert!(!s.exists("marker"), "a third holder ran");
    for (lr, s) in &mut holders {
        s.touch("go");
        lr.wait_for(Duration::from_secs(60)).assert_code(0);
    }
}
