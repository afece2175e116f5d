//! What only Redlock has, over three independent `redis-server`s: held only while a
//! majority holds it, exclusive and with increasing fencing tokens while a majority keeps
//! its data (one server down and one restarted empty), the command stopped before the
//! quorum's validity ends when a majority goes away but not when a minority does, and
//! how a quorum is given; with `--slots N`, one slot held on a majority even when the
//! servers disagree on which slot is free, a plain holder refusing a semaphore, and
//! waiters that come at once queued in the same order on every server. The
//! contract every backend keeps, with all three servers faulted at once, is tested in
//! the conformance suite.

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

#[test]
fn servers_that_disagree_on_the_free_slot_still_give_one_slot_on_a_majority() {
    let servers = servers();
    // Left by others, each on one server only (a minority): server 0 has slot 0 taken,
    // server 1 slots 0 and 1, server 2 nothing. The lowest free slot differs on each
    // (1, 2, 0); slot 1 is the lowest free on a majority (servers 0 and 2).
    servers[0].write_holder(&slot_key("job", 0), "other-a", 3, 60_000);
    servers[1].write_holder(&slot_key("job", 0), "other-b", 3, 60_000);
    servers[1].write_holder(&slot_key("job", 1), "other-c", 3, 60_000);
    let s = Scratch::new();
    let mut cmd = quorum_run(
        &servers,
        "job",
        &["--slots", "3", "--ttl", "30s"],
        &sh(r#"echo "$LOCKRUN_SLOT" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#),
    );
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let mut lr = spawn(cmd);
    assert_eq!(wait_line(&s.path("started")).trim(), "1");
    // Slot 1 with one token on servers 0 and 2; nothing of ours anywhere else.
    let token = servers[0].hget(&slot_key("job", 1), "token");
    assert!(token.is_some(), "server 0 does not hold slot 1");
    assert_eq!(servers[2].hget(&slot_key("job", 1), "token"), token);
    assert!(
        !servers[2].exists(&slot_key("job", 0)),
        "server 2 kept slot 0"
    );
    assert!(
        !servers[1].exists(&slot_key("job", 2)),
        "server 1 kept slot 2"
    );
    // status shows the majority's holder only, not the others' minority leftovers.
    let mut status = lockrun();
    status
        .arg("status")
        .args(urls(&servers))
        .args(["--json", "--slots", "3", "job"]);
    let f = run(status);
    f.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(f.stdout.trim()).expect("status JSON");
    let held: Vec<_> = v["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| (h["slot"].clone(), h["pid"].clone()))
        .collect();
    assert_eq!(held, [(1.into(), lr.pid().into())], "{v}");
    s.touch("go");
    lr.wait().assert_code(0);
    for server in [&servers[0], &servers[2]] {
        assert!(
            !server.exists(&slot_key("job", 1)),
            "slot 1 kept after the run"
        );
    }
}

#[test]
fn without_a_slot_free_on_a_majority_a_semaphore_is_busy_and_keeps_nothing() {
    let servers = servers();
    // Slot 0 free on server 0 only, slot 1 on server 1 only: each server has a free
    // slot, none a majority.
    servers[0].write_holder(&slot_key("job", 1), "other-a", 2, 60_000);
    servers[1].write_holder(&slot_key("job", 0), "other-b", 2, 60_000);
    servers[2].write_holder(&slot_key("job", 0), "other-c", 2, 60_000);
    servers[2].write_holder(&slot_key("job", 1), "other-d", 2, 60_000);
    let s = Scratch::new();
    let mut cmd = quorum_run(
        &servers,
        "job",
        &["--slots", "2"],
        &sh(r#"touch "$MARKER""#),
    );
    cmd.env("MARKER", s.path("marker"));
    run(cmd).assert_failure(75);
    assert!(!s.exists("marker"));
    assert!(
        !servers[0].exists(&slot_key("job", 0)),
        "server 0 kept slot 0"
    );
    assert!(
        !servers[1].exists(&slot_key("job", 1)),
        "server 1 kept slot 1"
    );
}

#[test]
fn a_plain_holder_on_a_majority_refuses_a_semaphore() {
    let servers = servers();
    let s = Scratch::new();
    let (mut holder, _) = hold(
        quorum_run(&servers, "job", &["--ttl", "30s"], &sh(HOLD)),
        &s,
    );
    let f = run(quorum_run(&servers, "job", &["--slots", "2"], &sh("true")));
    f.assert_failure(125);
    assert!(f.stderr.contains("a plain lock"), "{}", f.stderr);
    for server in &servers {
        assert!(
            !server.exists(&slot_key("job", 1)),
            "a refused run kept slot 1"
        );
    }
    s.touch("go");
    holder.wait().assert_code(0);
}

/// Each server's queue of waiters of `name`: their places (scores), first first.
fn queue_places(server: &RedisServer, name: &str) -> Vec<u64> {
    let entries: Vec<(String, f64)> = server.query(
        redis::cmd("ZRANGE")
            .arg(format!("lockrun:{{{name}}}:waiters"))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
    );
    entries.into_iter().map(|(_, score)| score as u64).collect()
}

#[test]
fn waiters_that_come_at_once_are_queued_in_the_same_order_on_every_server() {
    // Waiters started together reach the three servers in different orders; were each
    // server to queue them by its own time of arrival, each would wake a different
    // first waiter at the release, none would get a majority, and the lock would sit
    // free until the woken waiters' priority lapsed (2 s). Each waiter gives every
    // server the same place, so the queues agree.
    let servers = servers();
    let s = Scratch::new();
    let mut holder = quorum_run(
        &servers,
        "job",
        &[],
        &sh(r#"echo go > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#),
    );
    holder
        .env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let mut holder = spawn(holder);
    wait_line(&s.path("started"));
    const WAITERS: usize = 6;
    let mut waiters: Vec<Running> = (0..WAITERS)
        .map(|_| {
            let mut cmd = quorum_run(
                &servers,
                "job",
                &["--wait", "60s"],
                &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" >> "$RAN""#),
            );
            cmd.env("RAN", s.path("ran"));
            spawn(cmd)
        })
        .collect();
    wait_until("every waiter is queued on every server", WAIT, || {
        servers
            .iter()
            .all(|server| queue_places(server, "job").len() == WAITERS)
    });
    let places: Vec<Vec<u64>> = servers.iter().map(|sv| queue_places(sv, "job")).collect();
    assert!(
        places.iter().all(|p| *p == places[0]),
        "the servers queue the waiters at different places: {places:?}"
    );
    s.touch("go");
    holder.wait().assert_code(0);
    for w in &mut waiters {
        w.wait().assert_code(0);
    }
    let tokens: Vec<u64> = s
        .read("ran")
        .lines()
        .map(|l| l.trim().parse().expect("a token"))
        .collect();
    assert_eq!(tokens.len(), WAITERS, "every waiter ran once: {tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "the waiters' tokens increase in the order they ran: {tokens:?}"
    );
}
