//! The record of a lock's last run on PostgreSQL (README's "What ran where"): the row
//! `KEY#last` in the lock table, written by the statement of the release itself (or of
//! `--hold-at-least`), shown by `status` whether the lock is held or free, expiring a
//! week after the run (property 8 of docs/guarantees.md) and deleted by the cleanup
//! that deletes every other old row; the same through PgBouncer's transaction pooling.

use serde_json::Value;

use super::hold_slot;
use crate::support::*;

/// Runs `script` under lock "job" at `url` with `opts`; returns how it ended and the
/// fencing token its command saw.
fn run_recorded(url: &str, opts: &[&str], script: &str) -> (Finished, u64) {
    let s = Scratch::new();
    let script = format!(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT"; {script}"#);
    let mut cmd = lockrun_run(url, "job", opts, &sh(&script));
    cmd.env("OUT", s.path("out"));
    let f = run(cmd);
    let token = s.read("out").trim().parse();
    (f, token.expect("the command wrote its token"))
}

/// `lockrun status --json job` at `url` with `opts` (`--pg-table`, `--slots`).
fn status_json(url: &str, opts: &[&str]) -> Value {
    let mut cmd = lockrun();
    cmd.args(["status", "--url", url]).args(opts);
    cmd.args(["--json", "job"]);
    let f = run(cmd);
    assert!(matches!(f.code, Some(0 | 1)), "{}", f.stderr);
    serde_json::from_str(f.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", f.stdout))
}

/// Checks `last_run` against what the run itself saw.
fn assert_last_run(v: &Value, token: u64, exit: u64, ended_by: &str) {
    let last = &v["last_run"];
    assert_eq!(last["fencing_token"], token, "{v}");
    assert_eq!(last["exit_status"], exit, "{v}");
    assert_eq!(last["ended_by"], ended_by, "{v}");
    let host = nix::unistd::gethostname().unwrap();
    assert_eq!(last["host"], host.to_string_lossy().as_ref(), "{v}");
    assert!(last["pid"].as_u64().is_some_and(|p| p > 0), "{v}");
    let (started, ended) = (last["started_ms"].as_u64(), last["ended_ms"].as_u64());
    assert!(
        started.is_some_and(|s| s > 0) && started <= ended,
        "start and end by the database's clock: {v}"
    );
    for key in ["started", "ended"] {
        let time = last[key].as_str();
        assert!(time.is_some_and(|t| t.ends_with('Z')), "{key}: {v}");
    }
}

#[test]
fn status_shows_how_the_last_run_ended_held_or_free() {
    let t = Table::private();
    let opts = ["--pg-table", t.name.as_str()];
    assert!(
        status_json(&t.url, &opts)["last_run"].is_null(),
        "no run yet"
    );
    let (f, token) = run_recorded(&t.url, &opts, "exit 0");
    f.assert_code(0);
    assert_last_run(&status_json(&t.url, &opts), token, 0, "exited");
    let (f, token) = run_recorded(&t.url, &opts, "exit 3");
    f.assert_code(3);
    assert_last_run(&status_json(&t.url, &opts), token, 3, "exited");
    let limited = [&opts[..], &["--max-runtime", "300ms"]].concat();
    let (f, token) = run_recorded(&t.url, &limited, "sleep 30");
    f.assert_code(124);
    let v = status_json(&t.url, &opts);
    assert_last_run(&v, token, 124, "max_runtime");
    assert_eq!(v["held"], false);
    // Held: the holder, and the run that ended and keeps it (--hold-at-least).
    let kept = [&opts[..], &["--hold-at-least", "30s"]].concat();
    let (f, token_kept) = run_recorded(&t.url, &kept, "exit 0");
    f.assert_code(0);
    let v = status_json(&t.url, &opts);
    assert_eq!(v["held"], true, "{v}");
    assert_last_run(&v, token_kept, 0, "exited");
    // A busy run, and one that gave up waiting, leave the record alone.
    run(t.run("job", &[], &sh("true"))).assert_code(75);
    run(t.run("job", &["--wait", "300ms"], &sh("true"))).assert_code(75);
    assert_last_run(&status_json(&t.url, &opts), token_kept, 0, "exited");
    // The text has a line of its own for it.
    let f = t.admin("status", &["job"]);
    let line = f.stdout.lines().nth(1).unwrap_or_default().to_owned();
    assert!(
        line.starts_with("  last run: ") && line.ends_with("exit status 0 (exited)"),
        "{}",
        f.stdout
    );
}

#[test]
fn the_record_is_a_row_that_expires_a_week_after_the_run() {
    let t = Table::private();
    let opts = ["--pg-table", t.name.as_str()];
    let (f, token) = run_recorded(&t.url, &opts, "exit 0");
    f.assert_code(0);
    let row = t.sql(
        "job",
        "SELECT fence || ' ' || extract(epoch FROM expires_at - now())::bigint \
         FROM $T WHERE name = $K || '#last'",
    );
    let row = row.expect("the record's row");
    let (fence, left) = row.split_once(' ').unwrap();
    assert_eq!(fence, token.to_string());
    let left: i64 = left.parse().unwrap();
    let week = 7 * 24 * 3600;
    assert!(left > week - 60 && left <= week, "expires in {left} s");
    // The lock's own row is free: the record is no holder.
    assert!(!t.held("job"));
    // Expired: no longer shown; a day later, deleted by a new name's acquisition,
    // as the rows of locks are.
    t.sql(
        "job",
        "UPDATE $T SET expires_at = now() - interval '1 second' WHERE name = $K || '#last' \
         RETURNING 1",
    );
    assert!(status_json(&t.url, &opts)["last_run"].is_null());
    t.sql(
        "job",
        "UPDATE $T SET expires_at = now() - interval '25 hours' WHERE name LIKE $K || '%' \
         RETURNING 1",
    );
    run(t.run("fresh", &[], &["true"])).assert_code(0);
    let gone = t.sql("job", "SELECT count(*) FROM $T WHERE name LIKE $K || '%'");
    assert_eq!(gone.as_deref(), Some("0"));
}

#[test]
fn a_semaphore_keeps_the_run_that_ended_last_with_its_slot() {
    let t = Table::private();
    let slots = ["--pg-table", t.name.as_str(), "--slots", "3"];
    let s0 = Scratch::new();
    let (mut first, slot, first_token) = hold_slot(&t, "job", &s0, &slots[2..]);
    assert_eq!(slot, 0);
    let (f, token) = run_recorded(&t.url, &slots, "exit 5");
    f.assert_code(5);
    let v = status_json(&t.url, &slots);
    assert_last_run(&v, token, 5, "exited");
    assert_eq!(v["last_run"]["slot"], 1, "{v}");
    assert_eq!(v["held"], true, "slot 0 is still held: {v}");
    s0.touch("go");
    first.wait().assert_code(0);
    let v = status_json(&t.url, &slots);
    assert_last_run(&v, first_token as u64, 0, "exited");
    assert_eq!(v["last_run"]["slot"], 0, "{v}");
    // A semaphore's --hold-at-least leaves the record too, and keeps its slot.
    let kept = [&slots[..], &["--hold-at-least", "30s"]].concat();
    let (f, token) = run_recorded(&t.url, &kept, "exit 4");
    f.assert_code(4);
    let v = status_json(&t.url, &slots);
    assert_last_run(&v, token, 4, "exited");
    assert_eq!(v["holders"].as_array().map(Vec::len), Some(1), "{v}");
}

/// A record lockrun did not write (a hand edit) is an error of `status` (one line,
/// 125), never a made-up run; runs go on and write it anew.
#[test]
fn a_record_lockrun_never_writes_is_refused_by_status_and_replaced_by_the_next_run() {
    let t = Table::private();
    let opts = ["--pg-table", t.name.as_str()];
    run_recorded(&t.url, &opts, "exit 0").0.assert_code(0);
    t.sql(
        "job",
        "UPDATE $T SET token = 'not a record' WHERE name = $K || '#last' RETURNING 1",
    );
    let f = t.admin("status", &["job"]);
    f.assert_failure(125);
    assert_eq!(f.stderr.lines().count(), 1, "{}", f.stderr);
    assert!(
        f.stderr.contains("did not write") && f.stderr.contains("lockrun:{job}#last"),
        "{}",
        f.stderr
    );
    let (f, token) = run_recorded(&t.url, &opts, "exit 2");
    f.assert_code(2);
    assert_last_run(&status_json(&t.url, &opts), token, 2, "exited");
}

/// Through PgBouncer in transaction pooling, the record is written by the release's
/// own transaction and read back; PgBouncer's log stays clean.
#[test]
fn records_through_transaction_pooling() {
    let b = PgBouncer::start();
    let t = Table::on(&b.pg().url());
    let url = b.url(Pool::Transaction);
    let opts = ["--pg-table", t.name.as_str()];
    let (f, token) = run_recorded(&url, &opts, "exit 3");
    f.assert_code(3);
    assert_last_run(&status_json(&url, &opts), token, 3, "exited");
    let slots = [&opts[..], &["--slots", "2"]].concat();
    let (f, token) = run_recorded(&url, &slots, "exit 0");
    f.assert_code(0);
    assert_last_run(&status_json(&url, &slots), token, 0, "exited");
    b.assert_clean_log();
}
