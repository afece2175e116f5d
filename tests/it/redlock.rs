//! Redlock over three independent `redis-server`s: held only while a majority holds it,
//! exclusive and with increasing fencing tokens while a majority keeps its data, and the
//! command stopped before the quorum's validity ends when a majority goes away.

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
fn quorum_commands_never_overlap_and_tokens_increase() {
    let servers = servers();
    let s = Scratch::new();
    let script = r#"
        mkdir "$INSIDE" 2>/dev/null || echo overlap >> "$BAD"
        echo "$LOCKRUN_FENCING_TOKEN" >> "$TOKENS"
        sleep 0.01
        rmdir "$INSIDE" 2>/dev/null || echo overlap >> "$BAD"
    "#;
    thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..5 {
                    let mut cmd = quorum_run(
                        &servers,
                        "job",
                        &["--wait", "120s", "--ttl", "2s"],
                        &sh(script),
                    );
                    cmd.env("INSIDE", s.path("inside"))
                        .env("BAD", s.path("bad"))
                        .env("TOKENS", s.path("tokens"));
                    spawn(cmd).wait_for(Duration::from_secs(150)).assert_code(0);
                }
            });
        }
    });
    assert_eq!(s.read("bad"), "", "two commands held the quorum at once");
    let tokens: Vec<u64> = s
        .read("tokens")
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 20);
    for w in tokens.windows(2) {
        assert!(
            w[1] > w[0],
            "tokens not increasing in order of entry: {tokens:?}"
        );
    }
}

#[test]
fn one_server_down_and_one_restarted_empty_keeps_exclusion_and_token_order() {
    let mut servers = servers();
    let s = Scratch::new();
    let before = token_run(&servers, &s);

    let mut holder = quorum_run(
        &servers,
        "job",
        &["--ttl", "10s"],
        &sh(r#"touch "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#),
    );
    holder
        .env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let mut holder = spawn(holder);
    wait_until("the holder started", WAIT, || s.exists("started"));
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
    let deadline = fault + Duration::from_secs(2);
    while Instant::now() < deadline && !is_dead(pid) {
        thread::sleep(Duration::from_millis(2));
    }
    assert!(is_dead(pid), "the command outlived the quorum's validity");
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
