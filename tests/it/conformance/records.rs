//! The fleet view on every backend: each run that held the lock leaves the record of
//! its last run, shown by `status` and `lockrun list`, held or free; `--once-per`
//! skips a run within the period of the last success, and a failed run does not count
//! (docs/guarantees.md, property 11).

use serde_json::Value;

use super::Start;
use crate::support::*;

/// `status --json NAME` of `b`.
fn status(b: &Backend, name: &str) -> Value {
    let f = run(b.admin("status", &["--json", name]));
    assert!(matches!(f.code, Some(0 | 1)), "{}", f.stderr);
    serde_json::from_str(f.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", f.stdout))
}

pub(super) fn records_list_and_once_per(start: Start) {
    let b = start();
    // Runs that exit 0, then 3: the record is the last, its last success the first.
    run(b.run("rec", &["--once-per", "1h"], &sh("exit 0"))).assert_code(0);
    let first = status(&b, "rec")["last_run"].clone();
    assert_eq!(first["exit_status"], 0, "{first}");
    run(b.run("rec", &[], &sh("exit 3"))).assert_code(3);
    let last = status(&b, "rec")["last_run"].clone();
    assert_eq!(last["exit_status"], 3, "{last}");
    assert!(
        last["fencing_token"].as_u64() > first["fencing_token"].as_u64(),
        "{first} {last}"
    );
    // The failed run did not replace the success (on Redlock each server stamps its
    // own copy by its own clock, so the times are compared, not matched).
    let ok_started = last["last_ok"]["started_ms"]
        .as_u64()
        .expect("a last success");
    assert!(ok_started < last["started_ms"].as_u64().unwrap(), "{last}");
    assert_eq!(last["last_ok"]["host"], first["host"], "{last}");

    // Within the hour of that success: skipped, the command not started, no record.
    let s = Scratch::new();
    let mut cmd = b.run("rec", &["--once-per", "1h"], &sh(r#"touch "$M""#));
    cmd.env("M", s.path("m"));
    let skipped = run(cmd);
    skipped.assert_code(75);
    assert!(!s.exists("m"), "skipped, yet the command ran");
    assert!(skipped.stderr.contains("skipped"), "{}", skipped.stderr);
    assert_eq!(
        status(&b, "rec")["last_run"],
        last,
        "a skipped run leaves no record"
    );

    // A name that never succeeded runs with --once-per; held, it is listed with the
    // other, free one and its last run.
    let h = Scratch::new();
    let (mut holder, _) = hold(b.run("held", &["--once-per", "1h"], &sh(HOLD)), &h);
    let listed = run(b.admin("list", &["--json"]));
    listed.assert_code(0);
    let all: Vec<Value> = serde_json::from_str(&listed.stdout).expect("a JSON array");
    let by = |n: &str| all.iter().find(|v| v["name"] == n).cloned();
    let rec = by("rec").unwrap_or_else(|| panic!("rec listed: {}", listed.stdout));
    assert_eq!(
        (&rec["held"], &rec["last_run"]["exit_status"]),
        (&false.into(), &3.into())
    );
    let held = by("held").unwrap_or_else(|| panic!("held listed: {}", listed.stdout));
    assert_eq!(held["held"], true, "{held}");
    h.touch("go");
    holder.wait().assert_code(0);
}
