//! The record of a lock's last run on ZooKeeper (the node `last` in the lock's
//! directory, and `ok`, its last success): written by the multi-request that releases the lock, so a run makes no
//! more requests than before once the name has a record; shown by `status` whether the
//! lock is held or free, with the time the run took the lock and the server's time of
//! its release; a TTL node the server removes 7 days after the last run where it has
//! TTL nodes (property 8 of docs/guarantees.md), a plain node that `status` ignores
//! once 7 days old where it has not.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::support::*;

/// Runs `script` under lock "job" with `opts`: how it ended, and its fencing token.
fn run_job(zk: &ZkServer, opts: &[&str], script: &str) -> (Finished, u64) {
    let cmd = lockrun_run(&zk.url(), "job", opts, &sh(&recording(script)));
    run_recorded(cmd, &Scratch::new())
}

/// `lockrun status --json job`.
fn status(zk: &ZkServer) -> Value {
    status_json(&["--url", &zk.url(), "job"])
}

/// The transactions of the session that logged `pattern` (ZooKeeper logs every write
/// with its session), with the session's id.
fn session_of(txns: &[String], pattern: &str) -> Vec<String> {
    let first = txns.iter().find(|t| t.contains(pattern));
    let first = first.unwrap_or_else(|| panic!("no {pattern:?} in {txns:#?}"));
    let session = first
        .split_whitespace()
        .skip_while(|w| *w != "session")
        .nth(1)
        .expect("a session id")
        .to_owned();
    txns.iter()
        .filter(|t| t.contains(&format!("session {session} ")))
        .cloned()
        .collect()
}

/// The kinds of the transactions `txns` (`createSession`, `create2`, `multi`, ...).
fn kinds(txns: &[String]) -> Vec<String> {
    txns.iter()
        .map(|t| {
            let words: Vec<&str> = t.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "zxid").expect("a zxid");
            words[at + 2].to_owned()
        })
        .filter(|k| k != "closeSession")
        .collect()
}

#[test]
fn status_shows_how_the_last_run_ended_held_or_free() {
    let zk = ZkServer::start();
    assert!(status(&zk)["last_run"].is_null(), "no run yet");
    let (f, token) = run_job(&zk, &[], "exit 0");
    f.assert_code(0);
    assert_last_run(&status(&zk), token, 0, "exited");
    let (f, token) = run_job(&zk, &[], "exit 3");
    f.assert_code(3);
    assert_last_run(&status(&zk), token, 3, "exited");
    let (f, token) = run_job(&zk, &["--max-runtime", "300ms"], "sleep 30");
    f.assert_code(124);
    let v = status(&zk);
    assert_last_run(&v, token, 124, "max_runtime");
    assert_eq!(v["held"], false);
    // Held by the hold node --hold-at-least leaves (in the multi-request that writes
    // the record): the holder, and the run that ended.
    let (f, kept) = run_job(&zk, &["--hold-at-least", "30s"], "exit 0");
    f.assert_code(0);
    let v = status(&zk);
    assert_eq!(v["held"], true, "{v}");
    assert_last_run(&v, kept, 0, "exited");
    // A busy run leaves the record alone.
    run(lockrun_run(&zk.url(), "job", &[], &sh("true"))).assert_code(75);
    assert_last_run(&status(&zk), kept, 0, "exited");
    let line = last_run_line(&["--url", &zk.url(), "job"]);
    assert!(line.ends_with("exit status 0 (exited)"), "{line}");
    assert!(line.contains(&format!("fencing token {kept},")), "{line}");
}

#[test]
fn the_record_keeps_the_last_success_which_only_a_run_that_exits_0_replaces() {
    let zk = ZkServer::start();
    run_job(&zk, &[], "exit 0").0.assert_code(0);
    let first = status(&zk)["last_run"].clone();
    assert_eq!(
        first["last_ok"]["started_ms"], first["started_ms"],
        "{first}"
    );
    assert_eq!(first["last_ok"]["host"], hostname());
    // A failed run: the record is its own, the last success the run before it.
    let (f, token) = run_job(&zk, &[], "exit 3");
    f.assert_code(3);
    let v = status(&zk);
    assert_last_run(&v, token, 3, "exited");
    assert_eq!(v["last_run"]["last_ok"], first["last_ok"], "{v}");
    let mut cmd = lockrun();
    cmd.args(["status", "--url", &zk.url(), "job"]);
    let text = run(cmd).stdout;
    assert!(text.contains("\n  last success: started "), "{text}");
    // The next success replaces it.
    run_job(&zk, &[], "exit 0").0.assert_code(0);
    let v = status(&zk)["last_run"].clone();
    assert_eq!(v["last_ok"]["started_ms"], v["started_ms"], "{v}");
    assert_ne!(v["last_ok"], first["last_ok"]);
}

#[test]
fn a_release_is_one_multi_request_that_writes_the_record() {
    let zk = ZkServer::start();
    run_job(&zk, &[], "true").0.assert_code(0);
    // The first release of the name finds no record to set, and this server has no
    // TTL nodes (extendedTypesEnabled is off by default): it creates plain nodes, the
    // record and the last success.
    let txns = zk.txns();
    let first = session_of(&txns, "/lockrun:/job/lock-");
    let multis: Vec<&String> = first.iter().filter(|t| t.contains(" multi ")).collect();
    assert_eq!(multis.len(), 3, "{multis:#?}");
    let last = multis[2];
    assert_eq!(creates(last, false), 2, "{last}");
    assert!(last.contains("/lockrun:/job/last") && last.contains("/lockrun:/job/ok"));
    // Every later run: its node, and one multi-request that deletes it and sets the
    // record (the delete it replaced was one request too); a failed run leaves the last
    // success alone.
    let (f, token) = run_job(&zk, &[], "exit 3");
    f.assert_code(3);
    let txns = zk.txns();
    let second = session_of(&txns, &format!("\"fencing_token\":{token}"));
    assert_eq!(
        kinds(&second),
        ["createSession", "create2", "multi"],
        "{second:#?}"
    );
    let multi = &second[2];
    assert!(
        multi.contains("delete:") && multi.contains("setData:") && multi.contains("/job/last"),
        "{multi}"
    );
    assert!(!multi.contains("/job/ok"), "{multi}");
    assert_last_run(&status(&zk), token, 3, "exited");
}

#[test]
fn a_waiters_run_starts_when_it_took_the_lock() {
    let zk = ZkServer::start();
    let s = Scratch::new();
    let (mut holder, first) = start_holder(&zk.url(), "job", &s, &["--ttl", "30s"]);
    let w = Scratch::new();
    let mut cmd = lockrun_run(
        &zk.url(),
        "job",
        &["--wait", "30s"],
        &sh(&recording("true")),
    );
    cmd.env("OUT", w.path("out"));
    let mut waiter = spawn(cmd);
    // The waiter queues well before the holder lets go.
    std::thread::sleep(Duration::from_millis(500));
    let go = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    s.touch("go");
    holder.wait().assert_code(0);
    waiter.wait().assert_code(0);
    let token: u64 = w.read("out").trim().parse().expect("the waiter's token");
    assert!(first < u128::from(token));
    let v = status(&zk);
    assert_last_run(&v, token, 0, "exited");
    // Not when it queued: when it took the lock, after the holder's release (the
    // server's clock, on this machine). Its command ran at once: the record waits
    // for the answer to the stamp, sent just before.
    let started = v["last_run"]["started_ms"].as_u64().unwrap();
    assert!(started >= go.as_millis() as u64, "{v}: before {go:?}");
}

#[test]
fn a_semaphore_keeps_the_run_that_ended_last_with_its_slot() {
    let zk = ZkServer::start();
    let opts = ["--slots", "3", "--ttl", "30s"];
    let s = Scratch::new();
    let (mut first, first_token) = start_holder(&zk.url(), "job", &s, &opts);
    let (f, token) = run_job(&zk, &opts, "exit 5");
    f.assert_code(5);
    let args = ["--url", &zk.url(), "--slots", "3", "job"];
    let v = status_json(&args);
    assert_eq!(v["held"], true, "{v}");
    assert_last_run(&v, token, 5, "exited");
    assert_eq!(v["last_run"]["slot"], 1, "{v}");
    s.touch("go");
    first.wait().assert_code(0);
    let v = status_json(&args);
    assert_last_run(&v, first_token as u64, 0, "exited");
    assert_eq!(v["last_run"]["slot"], 0, "{v}");
}

#[test]
fn a_run_that_lost_its_lock_leaves_the_record_as_it_was() {
    let zk = ZkServer::start();
    let (f, token) = run_job(&zk, &[], "exit 0");
    f.assert_code(0);
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&zk.url(), "job", &s, &["--ttl", "30s"]);
    let mut force = lockrun();
    force.args(["release", "--force", "--url", &zk.url(), "job"]);
    run(force).assert_code(0);
    holder.wait_for(Duration::from_secs(30)).assert_failure(124);
    assert_last_run(&status(&zk), token, 0, "exited");
}

#[test]
fn a_record_past_its_keep_is_not_shown_and_the_next_run_overwrites_it() {
    let zk = ZkServer::start();
    run_job(&zk, &[], "true").0.assert_code(0);
    let old = r#"'{"host":"h","pid":1,"fencing_token":1,"slot":0,"started_ms":1,"exit_status":0,"ended_by":"exited","keep_ms":1}'"#;
    zk.cli(&["set", "/lockrun:/job/last", old]);
    assert!(status(&zk)["last_run"].is_null(), "{}", status(&zk));
    let (f, token) = run_job(&zk, &[], "exit 0");
    f.assert_code(0);
    let v = status(&zk);
    assert_last_run(&v, token, 0, "exited");
}

#[test]
fn the_server_removes_the_record_seven_days_after_the_last_run_where_it_has_ttl_nodes() {
    // libfaketime for the server's wall clock, read again every second.
    let clock = FakeClock::new();
    let mut env = clock.env();
    env.retain(|(k, _)| k != "FAKETIME_NO_CACHE");
    env.push(("FAKETIME_CACHE_DURATION".into(), "1".into()));
    let zk = ZkServer::start_with(ZkExtras {
        ttl_nodes: true,
        clock: Some(env),
    });
    let before = zk.node_count();
    let (f, token) = run_job(&zk, &[], "exit 0");
    f.assert_code(0);
    assert_last_run(&status(&zk), token, 0, "exited");
    // Its directories, the record and the last success: TTL nodes, created in the
    // release.
    assert_eq!(zk.node_count(), before + 4);
    let txns = zk.txns();
    let release = txns.iter().rfind(|t| t.contains(" multi ")).unwrap();
    assert_eq!(creates(release, true), 2, "{release}");
    // Six days on, it is still there; eight days on, gone, and its directories with it.
    clock.jump_forward(Duration::from_secs(6 * 24 * 3600));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(zk.node_count(), before + 4, "removed before its 7 days");
    clock.jump_forward(Duration::from_secs(2 * 24 * 3600));
    wait_until("the server removed the record", WAIT, || {
        zk.node_count() == before
    });
    assert!(status(&zk)["last_run"].is_null());
}

/// The node creations (`ttl`: of TTL nodes) in a multi-request as `TxnLogToolkit`
/// prints it: `create:` and `createTtl:` in ZooKeeper 3.8, `create2:` and `createTTL:`
/// in 3.9.
fn creates(multi: &str, ttl: bool) -> usize {
    let names: [&str; 2] = match ttl {
        true => ["createTtl:", "createTTL:"],
        false => ["create:", "create2:"],
    };
    names.iter().map(|n| multi.matches(n).count()).sum()
}
