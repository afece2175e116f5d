//! The backend conformance suite: SPEC's contract written once as tests and run against
//! every backend (its own server behind a fault-injecting proxy). A backend is done when
//! it passes all of them.

#[path = "support/backends.rs"]
mod backends;
mod support;

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use backends::*;
use support::*;

/// The lease used by these tests: whole seconds, because etcd's TTLs are.
const TTL: Duration = Duration::from_secs(2);
const TTL_ARG: &str = "2s";

/// A command that holds until the test creates `$GO`.
const HOLD: &str = r#"touch "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// A command that ignores SIGTERM and records its pid: only SIGKILL stops it.
const STUBBORN: &str = r#"trap '' TERM; echo $$ > "$PIDFILE"; while :; do sleep 0.05; done"#;

fn holder(b: &Backend, s: &Scratch, opts: &[&str]) -> Running {
    let mut cmd = b.run("job", opts, &sh(HOLD));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let r = spawn(cmd);
    wait_until("the holder's command started", WAIT, || s.exists("started"));
    r
}

/// Polls until `pid` is dead or `deadline` passes, then asserts it is dead.
fn assert_dead_by(pid: i32, fault: Instant, deadline: Instant) {
    while Instant::now() < deadline && !is_dead(pid) {
        thread::sleep(Duration::from_millis(2));
    }
    assert!(
        is_dead(pid),
        "the command (pid {pid}) was alive {:?} after the fault: the lease may have expired",
        Instant::now() - fault
    );
}

fn exclusive_under_contention(b: &Backend) {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 6;
    let s = Scratch::new();
    let script = r#"
        mkdir "$INSIDE" 2>/dev/null || echo "overlap at start of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
        echo "S $(date +%s%N) $LOCKRUN_FENCING_TOKEN" >> "$HIST"
        sleep 0.01
        echo "E $(date +%s%N) $LOCKRUN_FENCING_TOKEN" >> "$HIST"
        rmdir "$INSIDE" 2>/dev/null || echo "overlap at end of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
    "#;
    thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                for _ in 0..ROUNDS {
                    let mut cmd = b.run("job", &["--wait", "120s", "--ttl", TTL_ARG], &sh(script));
                    cmd.env("INSIDE", s.path("inside"))
                        .env("BAD", s.path("bad"))
                        .env("HIST", s.path("hist"));
                    spawn(cmd).wait_for(Duration::from_secs(150)).assert_code(0);
                }
            });
        }
    });
    assert_eq!(s.read("bad"), "", "two commands were inside at once");
    let mut sections: HashMap<u128, (u128, u128)> = HashMap::new();
    for line in s.read("hist").lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (t, token): (u128, u128) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        let entry = sections.entry(token).or_insert((0, 0));
        match f[0] {
            "S" => entry.0 = t,
            _ => entry.1 = t,
        }
    }
    assert_eq!(
        sections.len(),
        WORKERS * ROUNDS,
        "one token per critical section"
    );
    let mut ordered: Vec<(u128, u128, u128)> = sections
        .iter()
        .map(|(&tok, &(st, en))| (st, en, tok))
        .collect();
    ordered.sort();
    for w in ordered.windows(2) {
        let ((_, e0, t0), (s1, _, t1)) = (w[0], w[1]);
        assert!(
            s1 > e0,
            "sections overlap: token {t0} ended at {e0}, token {t1} started at {s1}"
        );
        assert!(
            t1 > t0,
            "tokens not increasing in start order: {t0} then {t1}"
        );
    }
    assert!(!b.held("job"), "the lock is free after the last holder");
}

fn busy_lock_exits_75_without_running_the_command(b: &Backend) {
    let s = Scratch::new();
    let mut h = holder(b, &s, &["--ttl", TTL_ARG]);
    let mut cmd = b.run("job", &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(!s.exists("marker"), "the busy run started its command");
    assert!(f.elapsed < TTL, "a busy answer took {:?}", f.elapsed);
    s.touch("go");
    h.wait().assert_code(0);
}

fn waiter_starts_soon_after_release(b: &Backend) {
    let s = Scratch::new();
    let mut h = holder(b, &s, &["--ttl", TTL_ARG]);
    let mut w = b.run(
        "job",
        &["--wait", "60s", "--ttl", TTL_ARG],
        &sh(r#"touch "$WAITER""#),
    );
    w.env("WAITER", s.path("waiter"));
    let mut w = spawn(w);
    thread::sleep(Duration::from_millis(300));
    assert!(
        !s.exists("waiter"),
        "the waiter ran while the lock was held"
    );
    s.touch("go");
    let released = h.wait();
    released.assert_code(0);
    wait_until("the waiter ran", WAIT, || s.exists("waiter"));
    // From the moment the test saw the holder end (after its release) to the moment
    // it saw the waiter's command run.
    let after_release = released.ended.elapsed();
    w.wait().assert_code(0);
    assert!(
        after_release < Duration::from_secs(1),
        "the waiter started {after_release:?} after the release"
    );
}

fn renewal_keeps_a_long_command_alive(b: &Backend) {
    let f = run(b.run("job", &["--ttl", TTL_ARG], &sh("sleep 5; exit 7")));
    f.assert_code(7);
    assert!(f.elapsed >= Duration::from_secs(5));
}

fn definite_loss_stops_the_command(b: &Backend) {
    let s = Scratch::new();
    let mut cmd = b.run(
        "job",
        &[
            "--ttl",
            "30s",
            "--renew-every",
            "500ms",
            "--kill-after",
            "1s",
        ],
        &sh(STUBBORN),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    run(b.admin("release", &["--force", "job"])).assert_code(0);
    let fault = Instant::now();
    // Noticed at the next renewal (500 ms), SIGKILL after --kill-after (1 s).
    assert_dead_by(pid, fault, fault + Duration::from_millis(500 + 1000 + 1500));
    lr.wait().assert_failure(124);
}

fn backend_fault_kills_before_the_lease_expires(b: &Backend, fault: impl FnOnce(&Backend)) {
    let s = Scratch::new();
    let mut cmd = b.run(
        "job",
        &["--ttl", TTL_ARG, "--kill-after", "30s"],
        &sh(STUBBORN),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    thread::sleep(Duration::from_millis(700)); // past a renewal or two
    let at = Instant::now();
    fault(b);
    // The last renewal lockrun could have had answered was sent before `at`: its lease
    // ends before at + TTL, and the command must be dead by then.
    assert_dead_by(pid, at, at + TTL);
    lr.wait().assert_failure(124);
    b.set_mode(Mode::Pass);
}

fn backend_down_kills_before_the_lease_expires(b: &Backend) {
    backend_fault_kills_before_the_lease_expires(b, |b| {
        b.set_mode(Mode::Refuse);
        b.cut();
    });
}

fn backend_hung_kills_before_the_lease_expires(b: &Backend) {
    backend_fault_kills_before_the_lease_expires(b, |b| b.set_mode(Mode::Blackhole));
}

fn fencing_tokens_increase(b: &Backend) {
    let s = Scratch::new();
    for _ in 0..3 {
        let mut cmd = b.run(
            "job",
            &[],
            &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" >> "$OUT""#),
        );
        cmd.env("OUT", s.path("out"));
        run(cmd).assert_code(0);
    }
    let tokens: Vec<u64> = s.read("out").lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(tokens.len(), 3);
    assert!(
        tokens[0] > 0 && tokens[0] < tokens[1] && tokens[1] < tokens[2],
        "{tokens:?}"
    );
}

fn status_and_forced_release(b: &Backend) {
    assert!(!b.held("job"));
    let s = Scratch::new();
    let mut h = holder(b, &s, &["--ttl", "30s"]);
    let f = run(b.admin("status", &["--json", "job"]));
    f.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(f.stdout.trim()).expect("status --json");
    assert_eq!(v["held"], true);
    assert_eq!(v["pid"].as_u64(), Some(h.pid() as u64));
    assert!(v["fencing_token"].as_u64().unwrap() > 0);
    assert!(v["ttl_ms"].as_u64().unwrap() <= 30_000);
    run(b.admin("release", &["--force", "job"])).assert_code(0);
    assert!(!b.held("job"));
    s.touch("go");
    h.wait();
}

fn unreachable_backend_fails_closed(b: &Backend) {
    b.set_mode(Mode::Refuse);
    let s = Scratch::new();
    let mut cmd = b.run("job", &["--ttl", TTL_ARG], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    run(cmd).assert_failure(125);
    assert!(!s.exists("marker"), "the command ran without the lock");
    b.set_mode(Mode::Pass);
}

/// Instantiates every conformance test for each backend.
macro_rules! conformance {
    ($($backend:ident => $start:expr;)*) => {$(
        mod $backend {
            use super::*;

            fn backend() -> Backend {
                Backend::new($start)
            }

            #[test]
            fn exclusive_under_contention() { super::exclusive_under_contention(&backend()) }
            #[test]
            fn busy_lock_exits_75_without_running_the_command() { super::busy_lock_exits_75_without_running_the_command(&backend()) }
            #[test]
            fn waiter_starts_soon_after_release() { super::waiter_starts_soon_after_release(&backend()) }
            #[test]
            fn renewal_keeps_a_long_command_alive() { super::renewal_keeps_a_long_command_alive(&backend()) }
            #[test]
            fn definite_loss_stops_the_command() { super::definite_loss_stops_the_command(&backend()) }
            #[test]
            fn backend_down_kills_before_the_lease_expires() { super::backend_down_kills_before_the_lease_expires(&backend()) }
            #[test]
            fn backend_hung_kills_before_the_lease_expires() { super::backend_hung_kills_before_the_lease_expires(&backend()) }
            #[test]
            fn fencing_tokens_increase() { super::fencing_tokens_increase(&backend()) }
            #[test]
            fn status_and_forced_release() { super::status_and_forced_release(&backend()) }
            #[test]
            fn unreachable_backend_fails_closed() { super::unreachable_backend_fails_closed(&backend()) }
        }
    )*};
}

conformance! {
    redis => RedisServer::start();
    redlock => Quorum::start();
    postgres => Postgres::start();
    etcd => Etcd::start();
}
