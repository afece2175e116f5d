//! `lockrun list [PATTERN]`: every name under the key prefix that is held or has a
//! last run, with its holders and last run, on each backend that lists names.

use serde_json::Value;

use crate::support::*;

/// Runs that leave `ok` (exit 0) and `failed` (exit 3) free with a last run, `held`
/// held by a run it returns, `sem` with both of its 2 slots held, and `other:x`
/// under another prefix; then checks `list --json`, `list` and a pattern.
fn lists_what_ran_and_what_is_held(b: &Backend) {
    run(b.run("ok", &[], &["true"])).assert_code(0);
    run(b.run("failed", &[], &sh("exit 3"))).assert_code(3);
    run(b.run("x", &["--key-prefix", "other:"], &["true"])).assert_code(0);
    let s = Scratch::new();
    let (mut held, token) = hold(b.run("held", &[], &sh(HOLD)), &s);
    let s2 = Scratch::new();
    let (mut sem, _) = hold(b.run("sem", &["--slots", "2"], &sh(HOLD)), &s2);
    let s3 = Scratch::new();
    let (mut sem2, _) = hold(b.run("sem", &["--slots", "2"], &sh(HOLD)), &s3);

    let listed = run(b.admin("list", &["--json"]));
    listed.assert_code(0);
    let all: Vec<Value> = serde_json::from_str(&listed.stdout).expect("a JSON array");
    let names: Vec<&str> = all.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["failed", "held", "ok", "sem"], "{}", listed.stdout);
    let by = |n: &str| all.iter().find(|v| v["name"] == n).unwrap().clone();
    assert_eq!(by("ok")["held"], false);
    assert_eq!(by("ok")["last_run"]["exit_status"], 0);
    assert_eq!(by("failed")["last_run"]["exit_status"], 3);
    assert_eq!(by("held")["held"], true);
    assert_eq!(by("held")["fencing_token"].as_u64(), Some(token as u64));
    assert_eq!(by("held")["last_run"], Value::Null);
    assert_eq!(by("sem")["held"], true);
    assert_eq!(by("sem")["slots"], 2);
    // Each holder once, in its slot (listed without knowing the semaphore's N).
    let slots: Vec<u64> = by("sem")["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["slot"].as_u64().unwrap())
        .collect();
    assert_eq!(slots, [0, 1], "{}", by("sem"));

    // Text: one line per name, in the same order.
    let text = run(b.admin("list", &[]));
    text.assert_code(0);
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", text.stdout);
    assert!(
        lines[0].starts_with("failed: free; last run: "),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("exit status 3"), "{}", lines[0]);
    assert!(lines[1].starts_with("held: held by "), "{}", lines[1]);

    let only = run(b.admin("list", &["--json", "[fo]*"]));
    let only: Vec<Value> = serde_json::from_str(&only.stdout).unwrap();
    let names: Vec<&str> = only.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["failed", "ok"]);

    let other = run(b.admin("list", &["--json", "--key-prefix", "other:"]));
    let other: Vec<Value> = serde_json::from_str(&other.stdout).unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(other[0]["name"], "x");

    // Slot 0 free, slot 1 held: listed as such (no --slots given).
    s2.touch("go");
    sem.wait().assert_code(0);
    let listed = run(b.admin("list", &["--json", "sem"]));
    listed.assert_code(0);
    let sem_only: Vec<Value> = serde_json::from_str(&listed.stdout).expect("a JSON array");
    let slots: Vec<u64> = sem_only[0]["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["slot"].as_u64().unwrap())
        .collect();
    assert_eq!(slots, [1], "{}", listed.stdout);

    s.touch("go");
    s3.touch("go");
    held.wait().assert_code(0);
    sem2.wait().assert_code(0);
}

#[test]
fn on_file() {
    lists_what_ran_and_what_is_held(&Backend::new(FileService::start()));
}

#[test]
fn on_postgres() {
    lists_what_ran_and_what_is_held(&Backend::new(Postgres::start()));
}

#[test]
fn on_mysql() {
    lists_what_ran_and_what_is_held(&Backend::new(Mysql::start()));
}

#[test]
fn on_etcd() {
    lists_what_ran_and_what_is_held(&Backend::new(EtcdServer::start()));
}

#[test]
fn on_zookeeper() {
    lists_what_ran_and_what_is_held(&Backend::new(ZkServer::start()));
}

#[test]
fn on_redis() {
    lists_what_ran_and_what_is_held(&Backend::new(RedisServer::start()));
}

#[test]
fn on_redlock() {
    lists_what_ran_and_what_is_held(&Backend::new(Quorum::start()));
}

#[test]
fn on_sentinel() {
    lists_what_ran_and_what_is_held(&Backend::new(SentinelService::start()));
}

/// In a Cluster each master holds its own names: `list` through one node shows the
/// names of all three.
#[test]
fn on_a_cluster_through_one_node() {
    let c = RedisCluster::start();
    let url = c.url(0);
    let names: Vec<String> = (0..12).map(|i| format!("job{i:02}")).collect();
    for n in &names {
        run(lockrun_run(&url, n, &[], &["true"])).assert_code(0);
    }
    let masters: std::collections::BTreeSet<usize> = names
        .iter()
        .map(|n| c.master_of(c.key_slot(&format!("lockrun:{{{n}}}"))))
        .collect();
    assert_eq!(masters.len(), 3, "12 names should span the 3 masters");
    let mut cmd = lockrun();
    cmd.args(["list", "--json", "--url", &url]);
    let listed = run(cmd);
    listed.assert_code(0);
    let all: Vec<Value> = serde_json::from_str(&listed.stdout).expect("a JSON array");
    let got: Vec<&str> = all.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(got, names, "{}", listed.stdout);
    assert!(all.iter().all(|v| v["last_run"]["exit_status"] == 0));
}

/// Nothing under the prefix: an empty array, and no line; exit 0.
#[test]
fn an_empty_prefix_lists_nothing() {
    let b = Backend::new(FileService::start());
    let json = run(b.admin("list", &["--json"]));
    json.assert_code(0);
    assert_eq!(json.stdout.trim(), "[]");
    let text = run(b.admin("list", &[]));
    text.assert_code(0);
    assert_eq!(text.stdout, "");
}
