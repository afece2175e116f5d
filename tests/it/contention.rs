//! Several lockruns on one name: mutual exclusion under contention (SPEC property 1), the
//! busy status, and `--wait`.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;

/// A command that records it started, then runs until `$GO` exists.
const HOLD: &str = r#"touch "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// Starts a lockrun holding `name` until the scratch file "go" exists; returns once its
/// command runs.
fn start_holder(url: &str, name: &str, s: &Scratch, opts: &[&str]) -> Running {
    let mut cmd = lockrun_run(url, name, opts, &sh(HOLD));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let holder = spawn(cmd);
    wait_until("the holder's command started", WAIT, || s.exists("started"));
    holder
}

#[test]
fn commands_never_overlap_under_contention() {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 10;
    let redis = RedisServer::start();
    let s = Scratch::new();
    // Each critical section logs its start and end (wall clock in ns) with its token, and
    // also claims a directory: mkdir fails if another command is inside.
    let script = r#"
        mkdir "$INSIDE" 2>/dev/null || echo "overlap at start of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
        echo "S $(date +%s%N) $LOCKRUN_FENCING_TOKEN" >> "$HIST"
        sleep 0.01
        echo "E $(date +%s%N) $LOCKRUN_FENCING_TOKEN" >> "$HIST"
        rmdir "$INSIDE" 2>/dev/null || echo "overlap at end of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
    "#;
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let url = redis.url();
            let (inside, bad, hist) = (s.path("inside"), s.path("bad"), s.path("hist"));
            thread::spawn(move || {
                for _ in 0..ROUNDS {
                    let mut cmd = lockrun_run(&url, "job", &["--wait", "60s"], &sh(script));
                    cmd.env("INSIDE", &inside)
                        .env("BAD", &bad)
                        .env("HIST", &hist);
                    spawn(cmd).wait_for(Duration::from_secs(90)).assert_code(0);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }

    assert_eq!(s.read("bad"), "", "two commands were inside at once");
    let mut starts: HashMap<u128, u128> = HashMap::new();
    let mut ends: HashMap<u128, u128> = HashMap::new();
    for line in s.read("hist").lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 3, "bad history line {line:?}");
        let (t, token) = (f[1].parse::<u128>().unwrap(), parse_token(f[2]));
        let map = if f[0] == "S" { &mut starts } else { &mut ends };
        assert!(
            map.insert(token, t).is_none(),
            "token {token} handed out twice"
        );
    }
    assert_eq!(
        starts.len(),
        WORKERS * ROUNDS,
        "number of critical sections"
    );
    let mut sections: Vec<(u128, u128, u128)> = starts
        .iter()
        .map(|(&token, &start)| (start, ends[&token], token))
        .collect();
    sections.sort();
    for w in sections.windows(2) {
        let ((s0, e0, t0), (s1, e1, t1)) = (w[0], w[1]);
        assert!(
            s1 > e0,
            "sections overlap: token {t0} ran {s0}..{e0}, token {t1} ran {s1}..{e1}"
        );
        assert!(
            t1 > t0,
            "tokens not increasing in start order: {t0} started before {t1}"
        );
    }
    assert!(!redis.lock_held("job"));
}

#[test]
fn busy_lock_exits_75_quickly_without_running_the_command() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut holder = start_holder(&redis.url(), "job", &s, &["--ttl", "30s"]);

    let mut cmd = lockrun_run(&redis.url(), "job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(!s.exists("marker"), "the busy run started its command");
    assert!(
        f.elapsed < Duration::from_secs(3),
        "busy run took {:?} (TTL is 30s; it must not wait)",
        f.elapsed
    );
    assert!(
        redis.lock_held("job"),
        "the busy run disturbed the holder's lock"
    );

    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn conflict_exit_code_option_sets_the_busy_status() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut holder = start_holder(&redis.url(), "job", &s, &[]);

    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--conflict-exit-code", "3"],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    run(cmd).assert_failure(3);
    assert!(!s.exists("marker"));

    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn conflict_exit_code_environment_sets_the_busy_status() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut holder = start_holder(&redis.url(), "job", &s, &[]);

    let mut cmd = lockrun_run(&redis.url(), "job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("MARK", s.path("marker"))
        .env("LOCKRUN_CONFLICT_EXIT_CODE", "4");
    run(cmd).assert_failure(4);
    assert!(!s.exists("marker"));

    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn waiter_starts_soon_after_the_holder_releases() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut holder = start_holder(&redis.url(), "job", &s, &[]);

    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--wait", "30s"],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    let mut waiter = spawn(cmd);
    // Let the waiter find the lock busy and settle into waiting (it must not run meanwhile).
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(1000) {
        assert!(
            !s.exists("marker"),
            "the waiter ran while the lock was held"
        );
        assert!(
            waiter.is_running(),
            "the waiter gave up: {:?}",
            waiter.try_finish()
        );
        thread::sleep(Duration::from_millis(20));
    }

    let go = Instant::now();
    s.touch("go");
    wait_until("the waiter's command ran", WAIT, || s.exists("marker"));
    let delay = go.elapsed();
    holder.wait().assert_code(0);
    waiter.wait().assert_code(0);
    assert!(
        delay < Duration::from_secs(1),
        "the waiter started {delay:?} after the holder was told to finish"
    );
}

#[test]
fn wait_shorter_than_the_hold_exits_75() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut holder = start_holder(&redis.url(), "job", &s, &[]);

    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--wait", "1s"],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(!s.exists("marker"));
    assert!(
        f.elapsed >= Duration::from_millis(1000),
        "gave up after {:?}, before --wait 1s ran out",
        f.elapsed
    );
    assert!(
        f.elapsed < Duration::from_secs(6),
        "took {:?} to give up after --wait 1s",
        f.elapsed
    );

    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn waiter_takes_over_a_lock_that_expired() {
    // The holder dies without releasing (SIGKILL): nobody publishes a release, the key just
    // expires; a waiter must still notice within a short time.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--ttl", "2s"],
        &sh(r#"echo $$ > "$PIDFILE"; exec sleep 60"#),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut holder = spawn(cmd);
    reaper.add(wait_pid(&s.path("pid")));

    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--wait", "30s"],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    let mut waiter = spawn(cmd);

    holder.signal(nix::sys::signal::Signal::SIGKILL);
    holder.wait();
    wait_until("the lock expired", WAIT, || !redis.lock_held("job"));
    let expired = Instant::now();
    wait_until("the waiter's command ran", WAIT, || s.exists("marker"));
    let delay = expired.elapsed();
    waiter.wait().assert_code(0);
    assert!(
        delay < Duration::from_secs(2),
        "the waiter started {delay:?} after the lock expired"
    );
}

#[test]
fn signal_while_waiting_gives_up_without_running_the_command() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut holder = start_holder(&redis.url(), "job", &s, &[]);

    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--wait", "60s"],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    let mut waiter = spawn(cmd);
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(500) {
        assert!(
            waiter.is_running(),
            "the waiter gave up: {:?}",
            waiter.try_finish()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let sent = Instant::now();
    waiter.signal(nix::sys::signal::Signal::SIGTERM);
    let f = waiter.wait();
    assert!(
        f.ended - sent < Duration::from_secs(2),
        "the waiter took {:?} to give up after SIGTERM",
        f.ended - sent
    );
    assert_ne!(f.code, Some(0), "a waiter stopped by SIGTERM exited 0");
    f.assert_explained();
    assert!(
        !s.exists("marker"),
        "the command ran after the waiter was told to stop"
    );
    // The holder's lock is untouched.
    assert!(redis.lock_held("job"));
    s.touch("go");
    holder.wait().assert_code(0);
    assert!(!s.exists("marker"));
}

#[test]
fn commands_longer_than_the_ttl_never_overlap() {
    // Every critical section outlives the TTL, so each holder keeps the lock only by
    // renewing it; the waiters must still never get in.
    const WORKERS: usize = 3;
    const ROUNDS: usize = 3;
    let redis = RedisServer::start();
    let s = Scratch::new();
    let script = r#"
        mkdir "$INSIDE" 2>/dev/null || echo "overlap at start of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
        sleep 0.8
        rmdir "$INSIDE" 2>/dev/null || echo "overlap at end of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
        echo "$LOCKRUN_FENCING_TOKEN" >> "$TOKENS"
    "#;
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let url = redis.url();
            let (inside, bad, tokens) = (s.path("inside"), s.path("bad"), s.path("tokens"));
            thread::spawn(move || {
                for _ in 0..ROUNDS {
                    let mut cmd = lockrun_run(
                        &url,
                        "job",
                        &["--wait", "60s", "--ttl", "500ms"],
                        &sh(script),
                    );
                    cmd.env("INSIDE", &inside)
                        .env("BAD", &bad)
                        .env("TOKENS", &tokens);
                    spawn(cmd).wait_for(Duration::from_secs(90)).assert_code(0);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    assert_eq!(s.read("bad"), "", "two commands were inside at once");
    let tokens: Vec<u128> = s.read("tokens").lines().map(parse_token).collect();
    assert_eq!(tokens.len(), WORKERS * ROUNDS);
    for w in tokens.windows(2) {
        assert!(w[1] > w[0], "tokens out of order: {tokens:?}");
    }
}
