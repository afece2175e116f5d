//! What only Redlock has, over three independent `redis-server`s: held only while a
//! majority holds it, exclusive and with increasing fencing tokens while a majority keeps
//! its data (one server down and one restarted empty), the command stopped before the
//! quorum's validity ends when a majority goes away but not when a minority does, and
//! how a quorum is given. The contract every backend keeps, with all three servers
//! faulted at once, is tested in the conformance suite.

use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;

fn servers() -> Vec<RedisServer> {
    (0..3).map(|_| RedisServer::start()).collect()
}

/// `--url` for each server.
fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers
        .iter()
        .flat_map(|s| ["--url".to_owned(), s.url()])
        .collect()
}

/// `lockrun run` against the quorum.
fn quorum_run(
    servers: &[RedisServer],
    name: &str,
    opts: &[&str],
    command: &[&str],
) -> std::process::Command {
    let mut cmd = lockrun();
    cmd.arg("run")
        .args(urls(servers))
        .args(opts)
        .arg(name)
        .arg("--")
        .args(command);
    cmd
}

fn token_run(servers: &[RedisServer], s: &Scratch) -> u64 {
    let mut cmd = quorum_run(
        servers,
        "job",
        &[],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    cmd.env("OUT", s.path("out"));
    run(cmd).assert_code(0);
    s.read("out").trim().parse().unwrap()
}

#[test]
fn one_server_down_and_one_restarted_empty_keeps_exclusion_and_token_order() {
    let mut servers = servers();
    let s = Scratch::new();
    let before = token_run(&servers, &s);

    let (mut holder, _) = hold(
        quorum_run(&servers, "job", &["--ttl", "10s"], &sh(HOLD)),
        &s,
    );
    servers[0].kill();
    servers[1].restart(); // no data: it forgot the holder and the counter

    // Only server 2 still knows the holder; server 1 would grant, but one vote of three
    // answering is not a majority.
    let mut cmd = quorum_run(
        &servers,
        "job",
        &["--ttl", "10s"],
        &sh(r#"touch "$MARKER""#),
    );
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(
        !s.exists("marker"),
        "a second command ran while the first held the lock"
    );

    s.touch("go");
    holder.wait().assert_code(0);
    let after = token_run(&servers, &s);
    assert!(
        after > before,
        "token {after} after the faults is not above {before}"
    );
}

#[test]
fn majority_down_mid_run_stops_the_command_before_the_validity_ends() {
    let mut servers = servers();
    let s = Scratch::new();
    let mut cmd = quorum_run(
        &servers,
        "job",
        &["--ttl", "2s", "--kill-after", "30s"],
        &sh(r#"trap '' TERM; echo $$ > "$PIDFILE"; while :; do sleep 0.05; done"#),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    thread::sleep(Duration::from_millis(800));
    let fault = Instant::now();
    servers[0].kill();
    servers[1].kill();
    assert_dead_by(
        pid,
        fault,
        fault + Duration::from_secs(2),
        "a majority down",
    );
    lr.wait().assert_failure(124);
}

#[test]
fn a_minority_down_does_not_stop_the_command() {
    let mut servers = servers();
    let s = Scratch::new();
    let mut cmd = quorum_run(
        &servers,
        "job",
        &["--ttl", "1s"],
        &sh(r#"touch "$STARTED"; sleep 3; exit 5"#),
    );
    cmd.env("STARTED", s.path("started"));
    let mut lr = spawn(cmd);
    wait_until("the command started", WAIT, || s.exists("started"));
    servers[2].kill();
    lr.wait().assert_code(5);
}

#[test]
fn a_comma_separated_lockrun_url_is_a_quorum() {
    let servers = servers();
    let list: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let mut cmd = lockrun();
    cmd.env("LOCKRUN_URL", list.join(","))
        .args(["run", "job", "--", "sh", "-c", "exit 4"]);
    run(cmd).assert_code(4);
    let mut status = lockrun();
    status
        .env("LOCKRUN_URL", list.join(","))
        .args(["status", "job"]);
    run(status).assert_code(1);
}

#[test]
fn two_urls_are_not_a_quorum() {
    let servers = servers();
    let s = Scratch::new();
    let mut cmd = quorum_run(&servers[..2], "job", &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(f.stderr.contains("quorum"), "{}", f.stderr);
    assert!(!s.exists("marker"));
}
