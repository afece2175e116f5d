//! The etcd backend (`etcd://`) against real `etcd` processes, one per test, driven
//! through the real binary: exit statuses, busy and waiting, mutual exclusion under
//! contention, renewal, definite loss (key deleted, `release --force`), etcd killed or
//! frozen mid-run, fencing tokens, `status`, `--hold-at-least`, crashes, unreachable
//! members and authentication.
//!
//! Deadlines in the fault tests count from instants the test observed *before* the
//! fault: lockrun's last successful renewal was sent before then, so the lease it
//! enforces ended at most TTL later. Waits for things to happen are generous; safety
//! assertions are strict.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;

/// A command that records it started, then runs until `$GO` exists.
const HOLD: &str =
    r#"echo "$LOCKRUN_FENCING_TOKEN" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// A command that ignores SIGTERM (logging each one to `$LOG`), so only SIGKILL stops it,
/// and records its pid in `$PIDFILE`.
const STUBBORN: &str =
    r#"trap 'echo TERM >> "$LOG"' TERM; echo $$ > "$PIDFILE"; while :; do sleep 0.1; done"#;

/// A command that records its pid in `$PIDFILE` and sleeps (dies on SIGTERM).
const SLEEPER: &str = r#"echo $$ > "$PIDFILE"; exec sleep 60"#;

/// Starts a lockrun holding `name` until the scratch file "go" exists; returns it and its
/// fencing token once its command runs.
fn start_holder(url: &str, name: &str, s: &Scratch, opts: &[&str]) -> (Running, String) {
    let mut cmd = lockrun_run(url, name, opts, &sh(HOLD));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let holder = spawn(cmd);
    let token = wait_line(&s.path("started"));
    (holder, token)
}

/// Starts lockrun with `opts` around `script` (which writes `$PIDFILE`); returns it and
/// its command's pid once the command runs.
fn start_with_pid(
    url: &str,
    s: &Scratch,
    reaper: &Reaper,
    opts: &[&str],
    script: &str,
) -> (Running, i32) {
    let mut cmd = lockrun_run(url, "job", opts, &sh(script));
    cmd.env("PIDFILE", s.path("pid")).env("LOG", s.path("log"));
    let lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    reaper.add(pid);
    (lr, pid)
}

/// Asserts that `pid` is dead (gone or zombie) by `deadline`, polling until then;
/// returns how long after `fault_at` it was first seen dead.
fn assert_dead_by(pid: i32, fault_at: Instant, deadline: Instant, what: &str) -> Duration {
    loop {
        let now = Instant::now();
        if is_dead(pid) {
            return now - fault_at;
        }
        if now >= deadline {
            assert!(
                is_dead(pid),
                "{what}: the command (pid {pid}, state {:?}) was still alive {:?} after the \
                 fault, when the lease may already have expired",
                proc_state(pid),
                now - fault_at
            );
            return now - fault_at;
        }
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn command_runs_with_a_fencing_token_and_its_status_is_passed_on() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &etcd.url(),
        "job",
        &[],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN $LOCKRUN_LOCK_NAME" > "$OUT"; exit 3"#),
    );
    cmd.env("OUT", s.path("out"));
    run(cmd).assert_code(3);
    let out = s.read("out");
    let (token, name) = out.trim().split_once(' ').expect("token and name");
    parse_token(token);
    assert_eq!(name, "job");
    assert!(!etcd.exists(&etcd_key("job")), "the lock was left behind");
    assert_eq!(etcd.lease_count(), 0, "a lease was left behind");
}

#[test]
fn the_key_holds_the_holder_and_is_created_at_the_fencing_token() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let (mut holder, token) = start_holder(&etcd.url(), "job", &s, &["--ttl", "10s"]);
    let key = etcd.get(&etcd_key("job")).expect("the lock key exists");
    assert_eq!(key.create_revision as u128, parse_token(&token));
    let value: serde_json::Value = serde_json::from_str(&key.value).expect("JSON value");
    assert_eq!(value["host"], hostname());
    assert_eq!(value["pid"], holder.pid());
    assert_eq!(value["token"].as_str().map(str::len), Some(32));
    let ttl = etcd.lease_ttl(key.lease);
    assert!(
        (1..=10).contains(&ttl),
        "the key's lease has {ttl}s left (TTL 10s)"
    );
    s.touch("go");
    holder.wait().assert_code(0);
    assert!(!etcd.exists(&etcd_key("job")));
}

#[test]
fn busy_lock_exits_75_without_running_the_command() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let (mut holder, token) = start_holder(&etcd.url(), "job", &s, &["--ttl", "30s"]);

    let mut cmd = lockrun_run(&etcd.url(), "job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(!s.exists("marker"), "the busy run started its command");
    assert!(
        f.elapsed < Duration::from_secs(3),
        "busy run took {:?}",
        f.elapsed
    );
    assert!(
        f.stderr.contains(&hostname()),
        "the busy line names no holder"
    );
    let key = etcd
        .get(&etcd_key("job"))
        .expect("the holder's lock is gone");
    assert_eq!(key.create_revision as u128, parse_token(&token));
    assert_eq!(etcd.lease_count(), 1, "the busy run left a lease behind");

    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn waiter_takes_the_lock_within_a_second_of_its_release() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let (mut holder, first) = start_holder(&etcd.url(), "job", &s, &["--ttl", "30s"]);

    let mut cmd = lockrun_run(
        &etcd.url(),
        "job",
        &["--wait", "30s"],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    cmd.env("OUT", s.path("second"));
    let mut waiter = spawn(cmd);
    // Let the waiter find the lock busy and settle into its watch.
    thread::sleep(Duration::from_millis(1500));
    assert!(
        !s.exists("second"),
        "the waiter ran while the lock was held"
    );

    let released = Instant::now();
    s.touch("go");
    let second = wait_line(&s.path("second"));
    let handoff = released.elapsed();
    assert!(
        handoff < Duration::from_secs(1),
        "the waiter took {handoff:?} to run after the holder was told to finish"
    );
    assert!(parse_token(&second) > parse_token(&first));
    holder.wait().assert_code(0);
    waiter.wait().assert_code(0);
}

#[test]
fn waiter_gives_up_with_75_when_wait_runs_out() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&etcd.url(), "job", &s, &["--ttl", "30s"]);

    let mut cmd = lockrun_run(
        &etcd.url(),
        "job",
        &["--wait", "1s"],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(!s.exists("marker"));
    assert!(
        f.elapsed >= Duration::from_secs(1) && f.elapsed < Duration::from_secs(4),
        "--wait 1s gave up after {:?}",
        f.elapsed
    );
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn commands_never_overlap_under_contention() {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 8;
    let etcd = EtcdServer::start();
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
            let url = etcd.url();
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
    assert!(!etcd.exists(&etcd_key("job")));
    assert_eq!(etcd.lease_count(), 0, "leases were left behind");
}

#[test]
fn renewal_keeps_a_command_longer_than_the_ttl_alive() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &etcd.url(),
        "job",
        &["--ttl", "2s"],
        &sh(r#"touch "$STARTED"; sleep 5; touch "$DONE""#),
    );
    cmd.env("STARTED", s.path("started"))
        .env("DONE", s.path("done"));
    let mut lr = spawn(cmd);
    wait_until("the command started", WAIT, || s.exists("started"));
    let first = etcd.get(&etcd_key("job")).expect("the lock key exists");
    // For more than twice the TTL the key must stay, created once, on one lease. The
    // "done" file is looked at after the key: if it is absent then, the command was
    // running when the key was read.
    let mut looks = 0;
    while lr.is_running() {
        let key = etcd.get(&etcd_key("job"));
        if !s.exists("done") {
            looks += 1;
            let key = key.expect("the lock key lapsed while the command ran");
            assert_eq!(key.create_revision, first.create_revision);
            assert_eq!(key.lease, first.lease);
        }
        thread::sleep(Duration::from_millis(50));
    }
    assert!(looks > 10, "the lock was looked at only {looks} times");
    lr.wait().assert_code(0);
    assert!(!etcd.exists(&etcd_key("job")));
}

#[test]
fn deleting_the_key_stops_the_command_at_the_next_renewal() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let opts = ["--ttl", "10s", "--renew-every", "500ms"];
    let (mut lr, pid) = start_with_pid(&etcd.url(), &s, &reaper, &opts, SLEEPER);

    let deleted = Instant::now();
    etcd.del(&etcd_key("job"));
    let died = assert_dead_by(
        pid,
        deleted,
        deleted + Duration::from_secs(3),
        "key deleted",
    );
    let f = lr.wait();
    f.assert_failure(124);
    assert!(
        f.ended - deleted < Duration::from_secs(4),
        "lockrun took {:?} to exit after its key was deleted (command dead after {died:?})",
        f.ended - deleted
    );
    assert!(!etcd.exists(&etcd_key("job")));
}

#[test]
fn release_force_breaks_the_lock_and_stops_its_holder() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let opts = ["--ttl", "10s", "--renew-every", "500ms"];
    let (mut lr, pid) = start_with_pid(&etcd.url(), &s, &reaper, &opts, SLEEPER);

    let mut cmd = lockrun();
    cmd.args(["release", "--force", "--url", &etcd.url(), "job"]);
    let broke = Instant::now();
    let f = run(cmd);
    f.assert_code(0);
    assert!(
        f.stderr.contains(&hostname()),
        "release --force did not say whose lock it broke: {}",
        f.stderr
    );
    assert_dead_by(pid, broke, broke + Duration::from_secs(3), "lock broken");
    lr.wait().assert_failure(124);
    let (code, v) = status_json(&etcd.url(), "job");
    assert_eq!((code, &v["held"]), (Some(1), &serde_json::json!(false)));

    // Breaking a free lock is not an error.
    let mut cmd = lockrun();
    cmd.args(["release", "--force", "--url", &etcd.url(), "job"]);
    run(cmd).assert_code(0);
}

/// Kills or freezes etcd under a lockrun with a 2s TTL whose command ignores SIGTERM:
/// the command must be dead by the time the test stopped etcd plus the TTL.
fn killed_before_expiry(freeze: bool) {
    let mut etcd = EtcdServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let (mut lr, pid) = start_with_pid(&etcd.url(), &s, &reaper, &["--ttl", "2s"], STUBBORN);
    // Let a renewal or two happen first.
    thread::sleep(Duration::from_millis(1500));
    assert!(is_alive(pid));

    let fault = Instant::now();
    if freeze {
        etcd.pause();
    } else {
        etcd.kill();
    }
    let what = if freeze { "etcd frozen" } else { "etcd killed" };
    let died = assert_dead_by(pid, fault, fault + Duration::from_secs(2), what);
    let f = lr.wait();
    if freeze {
        etcd.resume();
    }
    f.assert_failure(124);
    assert!(
        s.read("log").contains("TERM"),
        "the command got no --kill-signal (TERM) before SIGKILL (died {died:?} after the fault)"
    );
}

#[test]
fn command_is_killed_before_the_lease_expires_when_etcd_is_killed() {
    killed_before_expiry(false);
}

#[test]
fn command_is_killed_before_the_lease_expires_when_etcd_is_frozen() {
    killed_before_expiry(true);
}

#[test]
fn fencing_tokens_strictly_increase() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let mut last = 0u128;
    for round in 0..5 {
        // Other writes move etcd's revision along between acquisitions.
        etcd.put("unrelated", &round.to_string());
        let mut cmd = lockrun_run(
            &etcd.url(),
            "job",
            &[],
            &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
        );
        cmd.env("OUT", s.path("out"));
        run(cmd).assert_code(0);
        let token = parse_token(&s.read("out"));
        assert!(token > last, "token {token} after {last}");
        last = token;
    }
}

#[test]
fn status_shows_the_holder_then_free() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let (mut holder, token) = start_holder(&etcd.url(), "job", &s, &["--ttl", "20s"]);

    let (code, v) = status_json(&etcd.url(), "job");
    assert_eq!(code, Some(0), "status of a held lock: {v}");
    assert_eq!(v["name"], "job");
    assert_eq!(v["held"], true);
    assert_eq!(
        v["fencing_token"].as_u64().map(u128::from),
        Some(parse_token(&token))
    );
    assert_eq!(v["host"], hostname());
    assert_eq!(v["pid"], holder.pid());
    let ttl_ms = v["ttl_ms"].as_u64().expect("ttl_ms");
    assert!(ttl_ms > 0 && ttl_ms <= 20_000, "ttl_ms {ttl_ms} (TTL 20s)");

    let mut cmd = lockrun();
    cmd.args(["status", "--url", &etcd.url(), "job"]);
    let f = run(cmd);
    f.assert_code(0);
    assert!(f.stdout.contains("held by") && f.stdout.contains(&hostname()));

    s.touch("go");
    holder.wait().assert_code(0);
    let (code, v) = status_json(&etcd.url(), "job");
    assert_eq!(code, Some(1));
    assert_eq!(v["held"], false);
}

#[test]
fn hold_at_least_keeps_the_lock_then_lets_it_expire() {
    let etcd = EtcdServer::start();
    let f = run(lockrun_run(
        &etcd.url(),
        "job",
        &["--hold-at-least", "3s"],
        &["true"],
    ));
    f.assert_code(0);
    let ran = f.ended;
    assert!(
        f.elapsed < Duration::from_secs(2),
        "lockrun waited out --hold-at-least"
    );
    let busy = run(lockrun_run(&etcd.url(), "job", &[], &["true"]));
    busy.assert_failure(75);
    thread::sleep(Duration::from_millis(2000).saturating_sub(ran.elapsed()));
    assert!(
        etcd.exists(&etcd_key("job")),
        "the lock went before --hold-at-least"
    );
    wait_until("the held lock expired", Duration::from_secs(8), || {
        !etcd.exists(&etcd_key("job"))
    });
    assert_eq!(etcd.lease_count(), 0, "a lease was left behind");
}

#[test]
fn lock_of_a_killed_lockrun_expires_after_the_ttl() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let (mut lr, pid) = start_with_pid(&etcd.url(), &s, &reaper, &["--ttl", "2s"], SLEEPER);
    let killed = Instant::now();
    lr.signal(nix::sys::signal::Signal::SIGKILL);
    lr.wait();
    wait_until("the command died with its lockrun", WAIT, || is_dead(pid));
    // etcd expires leases in its own rhythm (checked every 500ms, then a raft round):
    // allow that on top of the TTL.
    let gone = wait_until("the lock expired", WAIT, || !etcd.exists(&etcd_key("job")));
    assert!(
        killed.elapsed() < Duration::from_secs(4),
        "the lock of a killed lockrun lasted {:?} (TTL 2s, gone after polling {gone:?})",
        killed.elapsed()
    );
}

#[test]
fn waiter_takes_the_lock_of_a_crashed_holder_once_its_lease_expires() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let (mut lr, pid) = start_with_pid(&etcd.url(), &s, &reaper, &["--ttl", "2s"], SLEEPER);

    let mut cmd = lockrun_run(
        &etcd.url(),
        "job",
        &["--wait", "20s"],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    let mut waiter = spawn(cmd);
    thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    lr.signal(nix::sys::signal::Signal::SIGKILL);
    lr.wait();
    wait_until("the command died with its lockrun", WAIT, || is_dead(pid));
    assert!(
        !s.exists("marker"),
        "the waiter ran while the lock was held"
    );
    waiter.wait().assert_code(0);
    // The lease ends at most 2s after the kill; etcd's expiry rhythm and the watch add a
    // little: the waiter must not sit out a whole extra wait slice.
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "the waiter took {:?} after the holder was killed (TTL 2s)",
        killed.elapsed()
    );
}

#[test]
fn release_never_removes_another_owners_lock() {
    let etcd = EtcdServer::start();
    let s = Scratch::new();
    let (mut first, _) = start_holder(&etcd.url(), "job", &s, &["--ttl", "30s"]);
    // The first holder's lock is deleted behind its back and a second one takes it,
    // long before the first renews (every 10s).
    etcd.del(&etcd_key("job"));
    let s2 = Scratch::new();
    let (mut second, token) = start_holder(&etcd.url(), "job", &s2, &["--ttl", "30s"]);
    s.touch("go");
    first.wait();
    let key = etcd
        .get(&etcd_key("job"))
        .expect("the first holder removed the second's lock");
    assert_eq!(key.create_revision as u128, parse_token(&token));
    s2.touch("go");
    second.wait().assert_code(0);
}

#[test]
fn unreachable_etcd_exits_125_without_running_the_command() {
    let s = Scratch::new();
    let port = closed_port();
    let mut cmd = lockrun_run(
        &format!("etcd://127.0.0.1:{port}"),
        "job",
        &[],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("marker"), "the command ran without the lock");
    let line = f.lockrun_line().unwrap();
    assert!(
        line.contains(&format!("127.0.0.1:{port}")),
        "the error does not name the member: {line}"
    );
    assert!(f.elapsed < Duration::from_secs(3), "took {:?}", f.elapsed);

    let mut cmd = lockrun();
    cmd.args([
        "status",
        "--url",
        &format!("etcd://127.0.0.1:{port}"),
        "job",
    ]);
    run(cmd).assert_failure(125);
}

#[test]
fn an_unreachable_member_is_skipped() {
    let etcd = EtcdServer::start();
    let url = format!(
        "etcd://127.0.0.1:{},127.0.0.1:{}",
        closed_port(),
        etcd.port()
    );
    run(lockrun_run(&url, "job", &[], &["true"])).assert_code(0);
    assert!(!etcd.exists(&etcd_key("job")));
}

#[test]
fn authentication_is_checked_and_the_password_never_shown() {
    let mut etcd = EtcdServer::start();
    etcd.enable_auth("s3cret-pw");
    let url = format!("etcd://root@127.0.0.1:{}", etcd.port());
    let s = Scratch::new();

    let mut cmd = lockrun_run(&url, "job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("LOCKRUN_PASSWORD", "wrong-pw")
        .env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("marker"));
    assert!(
        f.stderr.contains("authentication"),
        "the error does not say authentication failed: {}",
        f.stderr
    );
    assert!(!f.stderr.contains("wrong-pw"), "the password was printed");

    let mut cmd = lockrun_run(&url, "job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("LOCKRUN_PASSWORD", "s3cret-pw")
        .env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_code(0);
    assert!(s.exists("marker"));
    assert!(!f.stderr.contains("s3cret-pw"), "the password was printed");
}
