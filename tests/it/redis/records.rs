//! The record of a lock's last run on Redis (README's "What ran where"): written by the
//! release script in the same call as the release, shown by `status` whether the lock
//! is held or free, kept with an expiry like every other key (property 8 of
//! docs/guarantees.md), and for Redlock, what a majority of the servers keeps.

use serde_json::Value;

use crate::support::*;

/// Runs `script` under lock "job" on `urls` (one `--url` each) with `opts`; returns how
/// it ended and the fencing token its command saw.
fn run_recorded(urls: &[String], opts: &[&str], script: &str) -> (Finished, u64) {
    let s = Scratch::new();
    let mut cmd = lockrun();
    for url in urls {
        cmd.arg("--url").arg(url);
    }
    let script = format!(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT"; {script}"#);
    cmd.args(opts).arg("job").arg("--").args(sh(&script));
    cmd.env("OUT", s.path("out"));
    let f = run(cmd);
    let token = s
        .read("out")
        .trim()
        .parse()
        .expect("the command wrote its token");
    (f, token)
}

/// `lockrun status --json job` on `urls`.
fn status_json(urls: &[String]) -> Value {
    let mut cmd = lockrun();
    cmd.arg("status");
    for url in urls {
        cmd.arg("--url").arg(url);
    }
    cmd.arg("--json").arg("job");
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
    let host = nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(last["host"], host.as_str(), "{v}");
    assert!(last["pid"].as_u64().is_some_and(|p| p > 0), "{v}");
    let (started, ended) = (last["started_ms"].as_u64(), last["ended_ms"].as_u64());
    assert!(
        started.is_some_and(|s| s > 0) && started <= ended,
        "start and end by the server's clock: {v}"
    );
    for key in ["started", "ended"] {
        assert!(
            last[key].as_str().is_some_and(|t| t.ends_with('Z')),
            "{key}: {v}"
        );
    }
}

#[test]
fn status_shows_how_the_last_run_ended_held_or_free() {
    let redis = RedisServer::start();
    let urls = [redis.url()];
    assert!(status_json(&urls)["last_run"].is_null(), "no run yet");
    let (f, token) = run_recorded(&urls, &[], "exit 0");
    f.assert_code(0);
    assert_last_run(&status_json(&urls), token, 0, "exited");
    let (f, token) = run_recorded(&urls, &[], "exit 3");
    f.assert_code(3);
    assert_last_run(&status_json(&urls), token, 3, "exited");
    let (f, token) = run_recorded(&urls, &["--max-runtime", "300ms"], "sleep 30");
    f.assert_code(124);
    let v = status_json(&urls);
    assert_last_run(&v, token, 124, "max_runtime");
    assert_eq!(v["held"], false);
    // Held: the holder, and the last run that ended before it.
    let (f, token_kept) = run_recorded(&urls, &["--hold-at-least", "30s"], "exit 0");
    f.assert_code(0);
    let v = status_json(&urls);
    assert_eq!(v["held"], true, "{v}");
    assert_last_run(&v, token_kept, 0, "exited");
    // A busy run leaves the record alone.
    run(lockrun_run(&redis.url(), "job", &[], &sh("true"))).assert_code(75);
    assert_last_run(&status_json(&urls), token_kept, 0, "exited");
    // The text has a line of its own for it.
    let mut cmd = lockrun();
    cmd.args(["status", "--url", &redis.url(), "job"]);
    let f = run(cmd);
    let line = f.stdout.lines().nth(1).unwrap_or_default().to_owned();
    assert!(
        line.starts_with("  last run: ") && line.ends_with("exit status 0 (exited)"),
        "{}",
        f.stdout
    );
}

#[test]
fn the_record_expires_with_the_fencing_counter() {
    let redis = RedisServer::start();
    let (f, _) = run_recorded(&[redis.url()], &[], "exit 0");
    f.assert_code(0);
    let key = format!("{}:last", lock_key("job"));
    let week_ms = 7 * 24 * 3600 * 1000;
    let left = redis.pttl(&key);
    assert!(
        left > week_ms - 60_000 && left <= week_ms,
        "{key}: PTTL {left}"
    );
    assert!(redis.pttl(&fence_key("job")) <= week_ms);
}

#[test]
fn a_semaphore_keeps_the_run_that_ended_last_with_its_slot() {
    let redis = RedisServer::start();
    let (f, token) = run_recorded(&[redis.url()], &["--slots", "3"], "exit 5");
    f.assert_code(5);
    let mut cmd = lockrun();
    cmd.args([
        "status",
        "--url",
        &redis.url(),
        "--slots",
        "3",
        "--json",
        "job",
    ]);
    let v: Value = serde_json::from_str(run(cmd).stdout.trim()).unwrap();
    assert_last_run(&v, token, 5, "exited");
    assert_eq!(v["last_run"]["slot"], 0, "{v}");
}

#[test]
fn redlock_shows_the_last_run_a_majority_keeps() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let (f, token) = run_recorded(&urls, &[], "exit 3");
    f.assert_code(3);
    assert_last_run(&status_json(&urls), token, 3, "exited");
    // One server loses the record: the other two are still a majority.
    let key = format!("{}:last", lock_key("job"));
    let _: i64 = servers[0].query(redis::cmd("DEL").arg(&key));
    assert_last_run(&status_json(&urls), token, 3, "exited");
    // A second one loses it too: a minority's record is not the quorum's.
    let _: i64 = servers[1].query(redis::cmd("DEL").arg(&key));
    assert!(status_json(&urls)["last_run"].is_null());
}
