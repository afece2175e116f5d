//! What only the etcd backend (`etcd://`) has, against real `etcd` processes, one per
//! test: the key and its lease as etcd stores them (created at the fencing token, one
//! lease kept alive, nothing left behind), unreachable members, and authentication.
//! The contract every backend keeps is tested in the conformance suite.

use std::thread;
use std::time::Duration;

use crate::support::*;

#[test]
fn runs_and_busy_runs_leave_no_key_or_lease_behind() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let (mut holder, token) = start_holder(&etcd.url(), "job", &s, &["--ttl", "30s"]);
    run(lockrun_run(&etcd.url(), "job", &[], &["true"])).assert_failure(75);
    let key = etcd
        .get(&etcd_key("job"))
        .expect("the holder's lock is gone");
    assert_eq!(key.create_revision as u128, token);
    assert_eq!(etcd.lease_count(), 1, "the busy run left a lease behind");
    s.touch("go");
    holder.wait().assert_code(0);
    assert!(!etcd.exists(&etcd_key("job")), "the lock was left behind");
    assert_eq!(etcd.lease_count(), 0, "a lease was left behind");
}

#[test]
fn the_key_holds_the_holder_and_is_created_at_the_fencing_token() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let (mut holder, token) = start_holder(&etcd.url(), "job", &s, &["--ttl", "10s"]);
    let key = etcd.get(&etcd_key("job")).expect("the lock key exists");
    assert_eq!(key.create_revision as u128, token);
    let value: serde_json::Value = serde_json::from_str(&key.value).expect("JSON value");
    assert_eq!(value["host"], hostname());
    assert_eq!(value["pid"], holder.pid());
    assert_eq!(value["token"].as_str().map(str::len), Some(32));
    let ttl = etcd.lease_ttl(key.lease);
    assert!(
        (1..=10).contains(&ttl),
        "the key's lease has {ttl}s left (TTL 10s)"
    );
    s.touch("go");
    holder.wait().assert_code(0);
    assert!(!etcd.exists(&etcd_key("job")));
}

#[test]
fn renewal_keeps_one_key_on_one_lease() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &etcd.url(),
        "job",
        &["--ttl", "2s"],
        &sh(r#"touch "$STARTED"; sleep 5; touch "$DONE""#),
    );
    cmd.env("STARTED", s.path("started"))
        .env("DONE", s.path("done"));
    let mut lr = spawn(cmd);
    wait_until("the command started", WAIT, || s.exists("started"));
    let first = etcd.get(&etcd_key("job")).expect("the lock key exists");
    // For more than twice the TTL the key must stay, created once, on one lease. The
    // "done" file is looked at after the key: if it is absent then, the command was
    // running when the key was read.
    let mut looks = 0;
    while lr.is_running() {
        let key = etcd.get(&etcd_key("job"));
        if !s.exists("done") {
            looks += 1;
            let key = key.expect("the lock key lapsed while the command ran");
            assert_eq!(key.create_revision, first.create_revision);
            assert_eq!(key.lease, first.lease);
        }
        thread::sleep(Duration::from_millis(50));
    }
    assert!(looks > 10, "the lock was looked at only {looks} times");
    lr.wait().assert_code(0);
    assert!(!etcd.exists(&etcd_key("job")));
}

#[test]
fn an_unreachable_member_is_named_in_the_error() {
    let port = closed_port();
    let f = run(lockrun_run(
        &format!("etcd://127.0.0.1:{port}"),
        "job",
        &[],
        &["true"],
    ));
    f.assert_failure(125);
    let line = f.lockrun_line().unwrap();
    assert!(
        line.contains(&format!("127.0.0.1:{port}")),
        "the error does not name the member: {line}"
    );
}

#[test]
fn an_unreachable_member_is_skipped() {
    let etcd = EtcdServer::start();
    let url = format!(
        "etcd://127.0.0.1:{},127.0.0.1:{}",
        closed_port(),
        etcd.port()
    );
    run(lockrun_run(&url, "job", &[], &["true"])).assert_code(0);
    assert!(!etcd.exists(&etcd_key("job")));
}

#[test]
fn authentication_is_checked_and_the_password_never_shown() {
    let mut etcd = EtcdServer::start();
    etcd.enable_auth("s3cret-pw");
    let url = format!("etcd://root@127.0.0.1:{}", etcd.port());
    let s = Scratch::new();

    let mut cmd = lockrun_run(&url, "job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("LOCKRUN_PASSWORD", "wrong-pw")
        .env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("marker"));
    assert!(
        f.stderr.contains("authentication"),
        "the error does not say authentication failed: {}",
        f.stderr
    );
    assert!(!f.stderr.contains("wrong-pw"), "the password was printed");

    let mut cmd = lockrun_run(&url, "job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("LOCKRUN_PASSWORD", "s3cret-pw")
        .env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_code(0);
    assert!(s.exists("marker"));
    assert!(!f.stderr.contains("s3cret-pw"), "the password was printed");
}

#[test]
fn an_expired_token_is_replaced_while_the_command_runs() {
    let mut etcd = EtcdServer::start();
    etcd.enable_auth("s3cret-pw");
    let url = format!("etcd://root@127.0.0.1:{}", etcd.port());
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &url,
        "job",
        &["--ttl", "3s"],
        &sh(r#"touch "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.1; done"#),
    );
    cmd.env("LOCKRUN_PASSWORD", "s3cret-pw")
        .env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let mut lr = spawn(cmd);
    wait_until("the command started", WAIT, || s.exists("started"));
    let key = etcd.get(&etcd_key("job")).expect("the lock key exists");
    etcd.forget_tokens();
    // The next renewal (one a second) is first refused for its token: lockrun must log
    // in again and send it once more.
    thread::sleep(Duration::from_secs(5));
    assert!(lr.is_running(), "lockrun stopped when its token expired");
    let now = etcd.get(&etcd_key("job")).expect("the lock lapsed");
    assert_eq!(
        (now.create_revision, now.lease),
        (key.create_revision, key.lease)
    );
    s.touch("go");
    let f = lr.wait();
    f.assert_code(0);
    // A new connection would log in too, but only after a renewal had failed.
    assert!(
        !f.stderr.contains("renew"),
        "a renewal failed on the expired token: {}",
        f.stderr
    );
    assert!(!etcd.exists(&etcd_key("job")), "the lock was left behind");
}

#[test]
fn a_lock_key_on_no_lease_is_given_the_longest_lease() {
    let etcd = EtcdServer::start();
    let holder = r#"{"token":"by-hand","host":"oldhost","pid":4242,"since_ms":1}"#;
    etcd.etcdctl(&["put", &etcd_key("job"), holder]);
    let created = etcd.get(&etcd_key("job")).unwrap().create_revision;
    let mut status = lockrun();
    status.args(["status", "--json", "--url", &etcd.url(), "job"]);
    let f = run(status);
    f.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(f.stdout.trim()).expect("status JSON");
    let ttl = v["ttl_ms"].as_i64().expect("ttl_ms");
    assert!(
        ttl > 86_000_000 && ttl <= 86_400_000,
        "status shows {ttl} ms left"
    );
    let key = etcd.get(&etcd_key("job")).expect("the key is still there");
    assert_ne!(key.lease, 0, "the key is still on no lease");
    let left = etcd.lease_ttl(key.lease);
    assert!(
        left > 86_000 && left <= 86_400,
        "its lease has {left}s left"
    );
    assert_eq!((key.value.as_str(), key.create_revision), (holder, created));
    // A busy answer about it leaves it as it is: still held, on one lease.
    run(lockrun_run(&etcd.url(), "job", &[], &["true"])).assert_failure(75);
    assert_eq!(etcd.get(&etcd_key("job")).unwrap().lease, key.lease);
    assert_eq!(etcd.lease_count(), 1, "a lease was left behind");
}

#[test]
fn a_lease_longer_than_a_day_is_refused_before_it_is_granted() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    for ttl in ["100y", "25h"] {
        let cmd = lockrun_run(
            &etcd.url(),
            "job",
            &["--ttl", ttl],
            &["touch", s.path("ran").to_str().unwrap()],
        );
        run(cmd).assert_failure(125);
        assert!(!s.exists("ran"), "--ttl {ttl}: the command ran");
        assert!(!etcd.exists(&etcd_key("job")), "--ttl {ttl} took the lock");
        assert_eq!(etcd.lease_count(), 0, "--ttl {ttl} left a lease");
    }
}
