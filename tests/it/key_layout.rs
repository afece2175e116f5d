//! Upgrading from the key layout before braces (`PREFIXNAME`, which let two (prefix,
//! name) pairs share a lock) to `PREFIX{NAME}` on PostgreSQL and etcd: a plain lock
//! that an older lockrun holds (a live row or key of the old layout) is busy for this
//! one, which neither runs its command nor touches the old holder's key; once that is
//! gone, the lock is taken as usual.

use crate::support::*;

/// Asserts that a plain run of "job" is busy on account of the older holder
/// ("old-host", pid 4242), and did not run its command.
fn busy_for_the_older_holder(mut cmd: std::process::Command, s: &Scratch) {
    cmd.env("MARK", s.path("ran"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(
        !s.exists("ran"),
        "the command ran beside an older lockrun's lock"
    );
    assert!(
        f.stderr.contains("old-host") && f.stderr.contains("4242"),
        "the busy line does not name the older holder: {}",
        f.stderr
    );
}

#[test]
fn postgres_an_older_lockruns_live_row_is_busy_for_a_plain_lock() {
    let t = Table::private();
    // The table, made by a first run.
    run(t.run("other", &[], &["true"])).assert_code(0);
    t.db.exec(&format!(
        "INSERT INTO {0} (name, token, fence, host, pid, since, expires_at) \
         VALUES ('lockrun:job', 'ffff', nextval('{0}_fence'), 'old-host', 4242, now(), \
         now() + interval '1 hour')",
        t.name
    ));
    let s = Scratch::new();
    busy_for_the_older_holder(t.run("job", &[], &sh(r#"touch "$MARK""#)), &s);
    // Untouched, and not shown as this layout's lock by status.
    let old = t.db.value(&format!(
        "SELECT token || ' ' || (expires_at > now())::text FROM {} WHERE name = 'lockrun:job'",
        t.name
    ));
    assert_eq!(old.as_deref(), Some("ffff true"));
    assert!(!t.held("job"));
    // Released by its holder: free for this one.
    t.db.exec(&format!(
        "UPDATE {} SET token = '', expires_at = now() WHERE name = 'lockrun:job'",
        t.name
    ));
    let mut cmd = t.run("job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("MARK", s.path("ran"));
    run(cmd).assert_code(0);
    assert!(s.exists("ran"));
}

#[test]
fn etcd_an_older_lockruns_live_key_is_busy_for_a_plain_lock() {
    let etcd = EtcdServer::start();
    let lease = etcd.etcdctl(&["lease", "grant", "3600"]);
    let id = lease.split_whitespace().nth(1).expect("a lease ID");
    let value = r#"{"token":"ffff","host":"old-host","pid":4242,"since_ms":1}"#;
    etcd.etcdctl(&["put", "--lease", id, "lockrun:job", value]);
    let s = Scratch::new();
    let cmd = lockrun_run(&etcd.url(), "job", &[], &sh(r#"touch "$MARK""#));
    busy_for_the_older_holder(cmd, &s);
    let old = etcd
        .get("lockrun:job")
        .expect("the older lock is still there");
    assert_eq!(old.value, value);
    assert!(!etcd.exists(&etcd_key("job")));
    let status = run(lockrun_status(&etcd.url(), "job"));
    status.assert_code(1);
    etcd.etcdctl(&["lease", "revoke", id]);
    let mut cmd = lockrun_run(&etcd.url(), "job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("MARK", s.path("ran"));
    run(cmd).assert_code(0);
    assert!(s.exists("ran"));
}

/// `lockrun status --url URL NAME`.
fn lockrun_status(url: &str, name: &str) -> std::process::Command {
    let mut cmd = lockrun();
    cmd.args(["status", "--url", url, name]);
    cmd
}
