//! Redis behind Sentinel (`redis+sentinel://`): lockrun asks the Sentinels for the
//! master, follows a failover, and keeps fencing tokens increasing across it.

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
