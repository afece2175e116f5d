//! The record of a lock's last run on etcd (`PREFIX{NAME}:last`): written by the
//! transaction that releases the lock, so a run makes as many calls as before; shown by
//! `status` whether the lock is held or free; kept on the lease that every record of
//! the prefix written in the same week shares, so it expires (property 8 of
//! docs/guarantees.md) without a lease per run; and the grant of a week's lease revokes
//! those of three to five weeks before.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::{RECORD, RECORDS};
use crate::support::*;

/// The records' lease lives 15 days.
const RECORD_TTL: i64 = 15 * 24 * 3600;

/// Runs `script` under lock "job" with `opts`: how it ended, and its fencing token.
fn run_job(etcd: &EtcdServer, opts: &[&str], script: &str) -> (Finished, u64) {
    let cmd = lockrun_run(&etcd.url(), "job", opts, &sh(&recording(script)));
    run_recorded(cmd, &Scratch::new())
}

/// `lockrun status --json job`.
fn status(etcd: &EtcdServer) -> Value {
    status_json(&["--url", &etcd.url(), "job"])
}

/// The week (since the Unix epoch) on this machine's clock: a record's lease is its
/// week's.
fn week() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    now.as_secs() / (7 * 24 * 3600)
}

/// The calls made between `before` and `after`, by method.
fn calls_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> Vec<String> {
    after
        .iter()
        .filter_map(|(method, n)| {
            let made = n - before.get(method).copied().unwrap_or(0);
            (made > 0).then(|| format!("{method}={made}"))
        })
        .collect()
}

#[test]
fn status_shows_how_the_last_run_ended_held_or_free() {
    let etcd = EtcdServer::start();
    assert!(status(&etcd)["last_run"].is_null(), "no run yet");
    let (f, token) = run_job(&etcd, &[], "exit 0");
    f.assert_code(0);
    assert_last_run(&status(&etcd), token, 0, "exited");
    let (f, token) = run_job(&etcd, &[], "exit 3");
    f.assert_code(3);
    assert_last_run(&status(&etcd), token, 3, "exited");
    let (f, token) = run_job(&etcd, &["--max-runtime", "300ms"], "sleep 30");
    f.assert_code(124);
    let v = status(&etcd);
    assert_last_run(&v, token, 124, "max_runtime");
    assert_eq!(v["held"], false);
    // Held (--hold-at-least moves the key to a lease of its own, in the transaction
    // that writes the record): the holder, and the run that ended.
    let (f, kept) = run_job(&etcd, &["--hold-at-least", "30s"], "exit 0");
    f.assert_code(0);
    let v = status(&etcd);
    assert_eq!(v["held"], true, "{v}");
    assert_last_run(&v, kept, 0, "exited");
    // A busy run leaves the record alone.
    run(lockrun_run(&etcd.url(), "job", &[], &sh("true"))).assert_code(75);
    assert_last_run(&status(&etcd), kept, 0, "exited");
    let line = last_run_line(&["--url", &etcd.url(), "job"]);
    assert!(line.ends_with("exit status 0 (exited)"), "{line}");
    assert!(line.contains(&format!("fencing token {kept},")), "{line}");
}

#[test]
fn the_record_keeps_the_last_success_which_only_a_run_that_exits_0_replaces() {
    let etcd = EtcdServer::start();
    run_job(&etcd, &[], "exit 0").0.assert_code(0);
    let first = status(&etcd)["last_run"].clone();
    assert_eq!(
        first["last_ok"]["started_ms"], first["started_ms"],
        "{first}"
    );
    assert_eq!(first["last_ok"]["host"], hostname());
    // A failed run: the record is its own, the last success the run before it.
    let (f, token) = run_job(&etcd, &[], "exit 3");
    f.assert_code(3);
    let v = status(&etcd);
    assert_last_run(&v, token, 3, "exited");
    assert_eq!(v["last_run"]["last_ok"], first["last_ok"], "{v}");
    let line = last_run_line(&["--url", &etcd.url(), "job"]);
    assert!(line.contains("exit status 3"), "{line}");
    let text = run({
        let mut cmd = lockrun();
        cmd.args(["status", "--url", &etcd.url(), "job"]);
        cmd
    });
    assert!(
        text.stdout.contains("\n  last success: started "),
        "{}",
        text.stdout
    );
    // Both keys on a week's lease; the next success replaces the last success.
    let mut on_leases = etcd.keys_on_leases().concat();
    on_leases.sort();
    assert_eq!(on_leases, RECORDS);
    run_job(&etcd, &[], "exit 0").0.assert_code(0);
    let v = status(&etcd)["last_run"].clone();
    assert_eq!(v["last_ok"]["started_ms"], v["started_ms"], "{v}");
    assert_ne!(v["last_ok"], first["last_ok"]);
}

#[test]
fn a_run_makes_as_many_calls_as_before_records() {
    let etcd = EtcdServer::start();
    // The first release of the week grants the week's lease (and sweeps older ones).
    let before = etcd.grpc_calls();
    run_job(&etcd, &[], "true").0.assert_code(0);
    let first = calls_between(&before, &etcd.grpc_calls());
    assert_eq!(first, ["LeaseGrant=2", "LeaseRevoke=3", "Txn=3"]);
    // Every later one: a lease, the transaction that takes the key, and the one that
    // deletes it and writes the record (before records: a revoke instead).
    for _ in 0..2 {
        let (was, before) = (week(), etcd.grpc_calls());
        run_job(&etcd, &[], "exit 3").0.assert_code(3);
        if week() != was {
            continue; // a new week began during the run: it granted that week's lease
        }
        let made = calls_between(&before, &etcd.grpc_calls());
        assert_eq!(made, ["LeaseGrant=1", "Txn=2"]);
        return;
    }
    panic!("two weeks began during two runs");
}

#[test]
fn records_share_their_weeks_lease_which_expires() {
    let etcd = EtcdServer::start();
    let first_week = week();
    run_job(&etcd, &[], "exit 0").0.assert_code(0);
    let record = etcd.get(RECORD).expect("the record");
    assert_ne!(record.lease, 0, "the record is on no lease");
    let left = etcd.lease_ttl(record.lease);
    assert!(
        left > RECORD_TTL - 60 && left <= RECORD_TTL,
        "the record's lease has {left}s left"
    );
    // More runs, of another name and of this one: no lease of their own (unless a
    // new week began meanwhile: then that week's).
    for name in ["other", "job", "other"] {
        run(lockrun_run(&etcd.url(), name, &[], &["true"])).assert_code(0);
        let lease = etcd.get(&format!("lockrun:{{{name}}}:last")).unwrap().lease;
        if week() == first_week {
            assert_eq!(lease, record.lease, "{name}: a lease of its own");
        }
    }
    let with_keys = etcd.leases_with_keys();
    assert!(
        !with_keys.is_empty() && with_keys.len() <= 2,
        "one lease a week: {with_keys:?}"
    );
    let mut keys: Vec<String> = with_keys.into_iter().flat_map(|(_, k)| k).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            RECORD,
            "lockrun:{job}:ok",
            "lockrun:{other}:last",
            "lockrun:{other}:ok"
        ]
    );
}

/// The ID of the lease of the records written under the default prefix in `week`
/// (as lockrun derives it; fixed, so that lockruns of every version find it).
fn week_lease(week: u64) -> u64 {
    let text = format!("lockrun run records\0lockrun:\0{week}");
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    u64::from_be_bytes(digest.as_ref()[..8].try_into().unwrap()) >> 1
}

#[test]
fn the_grant_of_a_weeks_lease_revokes_those_of_three_to_five_weeks_before() {
    let etcd = EtcdServer::start();
    // Leases of earlier weeks, each holding a record, as if still alive (a leader
    // change gives every lease its whole TTL again).
    let now = week();
    let earlier = [1, 3, 4, 6].map(|back| now - back);
    for (i, w) in earlier.iter().enumerate() {
        etcd.grant_lease(week_lease(*w), 3600);
        let key = format!("lockrun:{{old{i}}}:last");
        etcd.etcdctl(&["put", &key, "{}", &format!("--lease={:x}", week_lease(*w))]);
    }
    // The first release of this week (or of the next, should it begin meanwhile:
    // then weeks 2 to 4 back go) grants its lease and revokes those 3 to 5 weeks back.
    run(lockrun_run(&etcd.url(), "job", &[], &["true"])).assert_code(0);
    let alive = earlier.map(|w| etcd.lease_ttl(week_lease(w)) > 0);
    assert_eq!(
        alive,
        [true, false, false, true],
        "weeks 1, 3, 4 and 6 back"
    );
    let with_keys: Vec<Vec<String>> = etcd.keys_on_leases();
    assert_eq!(
        with_keys,
        [
            vec!["lockrun:{job}:last".to_owned(), "lockrun:{job}:ok".into()],
            vec!["lockrun:{old0}:last".into()],
            vec!["lockrun:{old3}:last".into()]
        ]
    );
    let lease = etcd.get(RECORD).unwrap().lease;
    assert!([now, now + 1].map(week_lease).contains(&lease), "{lease:x}");
}

#[test]
fn a_semaphore_keeps_the_run_that_ended_last_with_its_slot() {
    let etcd = EtcdServer::start();
    let opts = ["--slots", "3", "--ttl", "30s"];
    let s = Scratch::new();
    let (mut first, first_token) = start_holder(&etcd.url(), "job", &s, &opts);
    let (f, token) = run_job(&etcd, &opts, "exit 5");
    f.assert_code(5);
    let args = ["--url", &etcd.url(), "--slots", "3", "job"];
    let v = status_json(&args);
    assert_eq!(v["held"], true, "{v}");
    assert_last_run(&v, token, 5, "exited");
    assert_eq!(v["last_run"]["slot"], 1, "{v}");
    // The holder of slot 0 ends last: its run is the record now.
    s.touch("go");
    first.wait().assert_code(0);
    let v = status_json(&args);
    assert_last_run(&v, first_token as u64, 0, "exited");
    assert_eq!(v["last_run"]["slot"], 0, "{v}");
}

#[test]
fn a_run_that_lost_its_lock_leaves_the_record_as_it_was() {
    let etcd = EtcdServer::start();
    let (f, token) = run_job(&etcd, &[], "exit 0");
    f.assert_code(0);
    let s = Scratch::new();
    let opts = ["--ttl", "30s", "--renew-every", "500ms"];
    let (mut holder, _) = start_holder(&etcd.url(), "job", &s, &opts);
    let mut force = lockrun();
    force.args(["release", "--force", "--url", &etcd.url(), "job"]);
    run(force).assert_code(0);
    holder.wait_for(Duration::from_secs(10)).assert_failure(124);
    assert_last_run(&status(&etcd), token, 0, "exited");
}

#[test]
fn a_value_that_is_no_record_shows_none_and_the_next_run_replaces_it() {
    let etcd = EtcdServer::start();
    etcd.etcdctl(&["put", RECORD, r#"{"host":"h","exit_status":"zero"}"#]);
    assert!(status(&etcd)["last_run"].is_null());
    let (f, token) = run_job(&etcd, &[], "exit 0");
    f.assert_code(0);
    assert_last_run(&status(&etcd), token, 0, "exited");
    assert_ne!(etcd.get(RECORD).unwrap().lease, 0);
}
