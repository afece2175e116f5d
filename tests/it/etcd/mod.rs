//! What only the etcd backend (`etcd://`) has, against real `etcd` processes, one per
//! test: the key and its lease as etcd stores them (created at the fencing token, one
//! lease kept alive, nothing left behind), unreachable members, and authentication;
//! with `--slots N`, each slot's key on its holder's lease, a holder with another N
//! refused, and the waiters' queue (keys on leases kept alive, gone when a waiter takes
//! a slot, gives up or crashes). The contract every backend keeps is tested in the
//! conformance suite.
//!
//! Beside it: `auth` (least-privilege etcd users, and the line of each missing
//! permission), `periods` (`--once-per`'s period leases), `records` (the last run's
//! record and its lease), `tls` (`etcds://`: verified TLS, client certificates, and the line of
//! each refused set-up).

mod auth;
mod periods;
mod records;
mod tls;

use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// The key of the record of "job"'s last run (`records`).
const RECORD: &str = "lockrun:{job}:last";

/// The keys a run of "job" that exits 0 leaves: its record, and its last success.
const RECORDS: [&str; 2] = [RECORD, "lockrun:{job}:ok"];

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
    // The holder's lease holds nothing now (it ends with its TTL); the run's record
    // is on the records' lease (`records`).
    assert_eq!(etcd.keys_on_leases(), [RECORDS], "a key was left behind");
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

/// Like `HOLD`, writing `SLOT TOKEN` to `$STARTED`.
const HOLD_SLOT: &str = r#"echo "$LOCKRUN_SLOT $LOCKRUN_FENCING_TOKEN" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// A lockrun holding a slot of semaphore `name` until `s.touch("go")`: it, its slot and
/// its fencing token, once its command runs.
fn hold_slot(etcd: &EtcdServer, name: &str, s: &Scratch, opts: &[&str]) -> (Running, u32, u128) {
    let mut cmd = lockrun_run(&etcd.url(), name, opts, &sh(HOLD_SLOT));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let lr = spawn(cmd);
    let line = wait_line(&s.path("started"));
    let (slot, token) = line
        .split_once(' ')
        .unwrap_or_else(|| panic!("the command wrote {line:?}, not a slot and a token"));
    (lr, slot.parse().expect("LOCKRUN_SLOT"), parse_token(token))
}

#[test]
fn each_slot_is_its_own_key_on_its_holders_own_lease() {
    let etcd = EtcdServer::start();
    let opts = ["--slots", "3", "--ttl", "30s"];
    let scratch: Vec<Scratch> = (0..4).map(|_| Scratch::new()).collect();
    let mut holders = Vec::new();
    let mut leases = Vec::new();
    for (want, s) in scratch[..3].iter().enumerate() {
        let (lr, slot, token) = hold_slot(&etcd, "job", s, &opts);
        assert_eq!(slot, want as u32, "not the lowest free slot");
        let key = etcd
            .get(&etcd_slot_key("job", slot))
            .unwrap_or_else(|| panic!("no key for slot {slot}"));
        assert_eq!(key.create_revision as u128, token);
        let value: serde_json::Value = serde_json::from_str(&key.value).expect("JSON value");
        assert_eq!(
            (value["slot"].as_u64(), value["slots"].as_u64()),
            (Some(slot.into()), Some(3))
        );
        assert_eq!(value["pid"], lr.pid());
        assert!(
            (1..=30).contains(&etcd.lease_ttl(key.lease)),
            "slot {slot}'s lease"
        );
        assert!(!leases.contains(&key.lease), "slot {slot} shares a lease");
        leases.push(key.lease);
        holders.push((lr, token));
    }
    assert_eq!(
        etcd.keys_with_prefix("lockrun:{job}"),
        ["lockrun:{job}", "lockrun:{job}#1", "lockrun:{job}#2"]
    );
    // Every slot held: busy, and nothing left behind by the busy run.
    run(lockrun_run(&etcd.url(), "job", &opts, &["true"])).assert_failure(75);
    assert_eq!(etcd.lease_count(), 3);
    // Slot 1 frees: its key goes (its lease holds nothing), and the next holder takes it.
    scratch[1].touch("go");
    holders[1].0.wait().assert_code(0);
    assert!(!etcd.exists(&etcd_slot_key("job", 1)));
    assert_eq!(
        etcd.keys_on_leases(),
        [
            vec![etcd_key("job")],
            vec![etcd_slot_key("job", 2)],
            RECORDS.map(String::from).to_vec()
        ]
    );
    let (mut again, slot, token) = hold_slot(&etcd, "job", &scratch[3], &opts);
    assert_eq!(slot, 1);
    assert!(
        holders.iter().all(|(_, t)| *t < token),
        "the token did not grow"
    );
    for (i, s) in scratch.iter().enumerate() {
        if i != 1 {
            s.touch("go");
        }
    }
    again.wait().assert_code(0);
    for (i, (lr, _)) in holders.iter_mut().enumerate() {
        if i != 1 {
            lr.wait().assert_code(0);
        }
    }
    assert_eq!(etcd.keys_with_prefix("lockrun:{job}"), RECORDS);
    assert_eq!(etcd.keys_on_leases(), [RECORDS], "a key was left behind");
}

#[test]
fn a_holder_with_another_n_is_refused_with_125() {
    let etcd = EtcdServer::start();
    let (s0, s1, s2) = (Scratch::new(), Scratch::new(), Scratch::new());
    let refused = |opts: &[&str], theirs: &str| {
        let marker = s2.path("ran");
        let f = run(lockrun_run(
            &etcd.url(),
            "job",
            opts,
            &["touch", marker.to_str().unwrap()],
        ));
        f.assert_failure(125);
        assert!(!s2.exists("ran"), "{opts:?}: the command ran");
        let line = f.lockrun_line().unwrap_or_default();
        assert!(line.contains(theirs), "{opts:?}: {line}");
    };
    let (mut first, slot, _) = hold_slot(&etcd, "job", &s0, &["--slots", "2", "--ttl", "30s"]);
    assert_eq!(slot, 0);
    refused(&["--slots", "3"], "--slots 2");
    refused(&[], "--slots 2");
    // Only slot 1 held: slot 0 is free, and a plain lock is still refused.
    let (mut second, slot, _) = hold_slot(&etcd, "job", &s1, &["--slots", "2", "--ttl", "30s"]);
    assert_eq!(slot, 1);
    s0.touch("go");
    first.wait().assert_code(0);
    assert!(!etcd.exists(&etcd_key("job")));
    let before = etcd.leases();
    refused(&[], "--slots 2");
    refused(&["--slots", "3"], "--slots 2");
    let after = etcd.leases();
    assert!(
        after.iter().all(|l| before.contains(l)),
        "a refused run left a lease behind"
    );
    s1.touch("go");
    second.wait().assert_code(0);
    // A plain holder (its value is what lockrun wrote before semaphores).
    let s3 = Scratch::new();
    let (mut plain, _) = start_holder(&etcd.url(), "job", &s3, &["--ttl", "30s"]);
    let value = etcd.get(&etcd_key("job")).expect("the lock key").value;
    assert!(
        !value.contains("slot"),
        "a plain lock's value changed: {value}"
    );
    let before = etcd.leases();
    refused(&["--slots", "2"], "a plain lock (--slots 1)");
    let after = etcd.leases();
    assert!(
        after.iter().all(|l| before.contains(l)),
        "a refused run left a lease behind"
    );
    s3.touch("go");
    plain.wait().assert_code(0);
}

#[test]
fn concurrent_acquirers_never_share_a_slot() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    // mkdir is atomic: a slot taken twice at once leaves a line in "shared".
    let script = r#"
        mkdir "$DIR/slot-$LOCKRUN_SLOT" || echo "$LOCKRUN_SLOT" >> "$DIR/shared"
        echo "$LOCKRUN_SLOT $LOCKRUN_FENCING_TOKEN" >> "$DIR/log"
        sleep 0.3
        rmdir "$DIR/slot-$LOCKRUN_SLOT""#;
    let runs: Vec<Running> = (0..9)
        .map(|_| {
            let opts = ["--slots", "3", "--ttl", "10s", "--wait", "60s"];
            let mut cmd = lockrun_run(&etcd.url(), "job", &opts, &sh(script));
            cmd.env("DIR", s.path(""));
            spawn(cmd)
        })
        .collect();
    for mut lr in runs {
        lr.wait_for(Duration::from_secs(90)).assert_code(0);
    }
    assert!(
        !s.exists("shared"),
        "a slot was held twice: {}",
        s.read("shared")
    );
    let log = s.read("log");
    let mut tokens = Vec::new();
    for line in log.lines() {
        let (slot, token) = line.split_once(' ').expect("SLOT TOKEN");
        assert!(slot.parse::<u32>().expect("a slot") < 3, "{line}");
        tokens.push(parse_token(token));
    }
    assert_eq!(tokens.len(), 9, "{log}");
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 9, "two runs had one token: {log}");
    assert_eq!(etcd.keys_with_prefix("lockrun:{job}"), RECORDS);
    assert_eq!(etcd.keys_on_leases(), [RECORDS], "a key was left behind");
}

#[test]
fn a_waiter_takes_whichever_slot_frees() {
    let etcd = EtcdServer::start();
    let opts = ["--slots", "2", "--ttl", "30s"];
    let (s0, s1, s2) = (Scratch::new(), Scratch::new(), Scratch::new());
    let (mut h0, _, _) = hold_slot(&etcd, "job", &s0, &opts);
    let (mut h1, _, _) = hold_slot(&etcd, "job", &s1, &opts);
    let mut cmd = lockrun_run(
        &etcd.url(),
        "job",
        &["--slots", "2", "--wait", "60s"],
        &sh(HOLD_SLOT),
    );
    cmd.env("STARTED", s2.path("started"))
        .env("GO", s2.path("go"));
    let mut waiter = spawn(cmd);
    s1.touch("go");
    h1.wait().assert_code(0);
    let line = wait_line(&s2.path("started"));
    assert!(
        line.starts_with("1 "),
        "the waiter did not take slot 1: {line}"
    );
    s0.touch("go");
    s2.touch("go");
    h0.wait().assert_code(0);
    waiter.wait().assert_code(0);
}

#[test]
fn release_force_breaks_every_slot_and_revokes_its_lease() {
    let etcd = EtcdServer::start();
    let opts = ["--slots", "2", "--ttl", "30s"];
    let (s0, s1) = (Scratch::new(), Scratch::new());
    let (mut h0, _, t0) = hold_slot(&etcd, "job", &s0, &opts);
    let (mut h1, _, t1) = hold_slot(&etcd, "job", &s1, &opts);
    let mut force = lockrun();
    force.args([
        "release",
        "--force",
        "--slots",
        "2",
        "--url",
        &etcd.url(),
        "job",
    ]);
    let f = run(force);
    f.assert_code(0);
    for token in [t0, t1] {
        assert!(
            f.stderr.contains(&token.to_string()),
            "token {token} not named: {}",
            f.stderr
        );
    }
    assert_eq!(etcd.keys_with_prefix("lockrun:{job}"), Vec::<String>::new());
    assert_eq!(
        etcd.lease_count(),
        0,
        "a broken holder's lease is still there"
    );
    // Each holder finds out at its next renewal and stops its command.
    for lr in [&mut h0, &mut h1] {
        let f = lr.wait_for(Duration::from_secs(30));
        assert_ne!(f.code, Some(0), "a broken holder ended well: {}", f.stderr);
    }
}

/// The waiter keys of semaphore "job" (one per lockrun waiting, each on its lease).
fn waiter_keys(etcd: &EtcdServer) -> Vec<String> {
    etcd.keys_with_prefix("lockrun:{job}%")
}

/// Spawns a lockrun waiting for a slot of "job" (2 slots, `--ttl 2s`) running
/// `HOLD_SLOT` in `s`, once its waiter key is the `place`-th (from 1).
fn queue_waiter(etcd: &EtcdServer, s: &Scratch, place: usize) -> Running {
    let opts = ["--slots", "2", "--ttl", "2s", "--wait", "60s"];
    let mut cmd = lockrun_run(&etcd.url(), "job", &opts, &sh(HOLD_SLOT));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let lr = spawn(cmd);
    wait_until("the waiter queued", WAIT, || {
        waiter_keys(etcd).len() == place
    });
    lr
}

#[test]
fn a_semaphores_waiters_queue_on_leases_kept_alive_and_leave_nothing() {
    let etcd = EtcdServer::start();
    let opts = ["--slots", "2", "--ttl", "30s"];
    let (s0, s1) = (Scratch::new(), Scratch::new());
    let (mut h0, _, _) = hold_slot(&etcd, "job", &s0, &opts);
    let (mut h1, slot, _) = hold_slot(&etcd, "job", &s1, &opts);
    assert_eq!(slot, 1);
    // A busy run that does not wait leaves no waiter key and no lease.
    run(lockrun_run(&etcd.url(), "job", &opts, &["true"])).assert_failure(75);
    assert_eq!(waiter_keys(&etcd), Vec::<String>::new());
    assert_eq!(etcd.lease_count(), 2);
    let (w1, w2) = (Scratch::new(), Scratch::new());
    let mut first = queue_waiter(&etcd, &w1, 1);
    let mut second = queue_waiter(&etcd, &w2, 2);
    let queued: Vec<_> = waiter_keys(&etcd)
        .iter()
        .map(|k| etcd.get(k).expect("a waiter key"))
        .collect();
    // Three times their TTL: the waiters keep their leases, and so their places.
    thread::sleep(Duration::from_secs(6));
    for q in &queued {
        assert!(etcd.lease_ttl(q.lease) > 0, "a waiter's lease ended");
    }
    let now: Vec<_> = waiter_keys(&etcd)
        .iter()
        .map(|k| etcd.get(k).expect("a waiter key").create_revision)
        .collect();
    let then: Vec<_> = queued.iter().map(|q| q.create_revision).collect();
    assert_eq!(now, then, "a waiter lost its place");
    // Slot 1 frees: the first waiter takes it, the second stays queued.
    s1.touch("go");
    h1.wait().assert_code(0);
    let line = wait_line(&w1.path("started"));
    assert!(
        line.starts_with("1 "),
        "the first waiter did not get slot 1: {line}"
    );
    assert!(
        !w2.exists("started"),
        "the second waiter ran with both slots held"
    );
    let left = waiter_keys(&etcd);
    assert_eq!(left.len(), 1);
    let second_lease = etcd.get(&left[0]).expect("the second waiter's key").lease;
    // The second gives up (a signal): its waiter key and lease go.
    second.signal(Signal::SIGTERM);
    assert_ne!(second.wait().code, Some(0));
    assert_eq!(waiter_keys(&etcd), Vec::<String>::new());
    assert_eq!(
        etcd.lease_ttl(second_lease),
        -1,
        "the waiter that gave up left its lease"
    );
    s0.touch("go");
    w1.touch("go");
    h0.wait().assert_code(0);
    first.wait().assert_code(0);
    assert_eq!(etcd.keys_with_prefix("lockrun:{job}"), RECORDS);
    assert_eq!(etcd.keys_on_leases(), [RECORDS], "a key was left behind");
}

#[test]
fn a_crashed_waiter_leaves_the_queue_when_its_lease_ends() {
    let etcd = EtcdServer::start();
    let opts = ["--slots", "2", "--ttl", "30s"];
    let (s0, s1) = (Scratch::new(), Scratch::new());
    let (mut h0, _, _) = hold_slot(&etcd, "job", &s0, &opts);
    let (mut h1, _, _) = hold_slot(&etcd, "job", &s1, &opts);
    let (w1, w2) = (Scratch::new(), Scratch::new());
    let mut crashed = queue_waiter(&etcd, &w1, 1);
    let mut next = queue_waiter(&etcd, &w2, 2);
    crashed.signal(Signal::SIGKILL);
    crashed.wait();
    let killed = Instant::now();
    s1.touch("go");
    h1.wait().assert_code(0);
    // The crashed waiter's place holds the free slot until its lease (2 s, as etcd
    // rounds and raises it) ends; then the next waiter takes it.
    let line = wait_line(&w2.path("started"));
    assert!(
        line.starts_with("1 "),
        "the next waiter did not get slot 1: {line}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "the next waiter ran {:?} after the crash",
        killed.elapsed()
    );
    assert_eq!(waiter_keys(&etcd), Vec::<String>::new());
    s0.touch("go");
    w2.touch("go");
    h0.wait().assert_code(0);
    next.wait().assert_code(0);
}
