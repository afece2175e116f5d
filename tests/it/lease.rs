//! The lease against Redis (docs/guarantees.md, properties 2, 3 and 4), where the tests
//! can look at the key itself: renewal keeps the key's expiry ahead; a definite loss (key
//! flushed, another token in it, the server restarted empty) stops the command at once
//! and leaves another owner's key alone; `--kill-signal` and `--kill-after`; a lockrun
//! paused past its TTL kills its command as soon as it runs again (and its guard has
//! killed it at the deadline meanwhile); the lease counts from
//! the send time; transient errors within the lease are survived. (The backend down,
//! hung, killed or frozen, for every backend, are in the conformance suite.)
//!
//! Deadlines are computed from instants the test itself observed *before* injecting the
//! fault: lockrun's last successful renewal was sent before that instant, so its lease ended
//! at most TTL later.

use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;
use nix::sys::signal::Signal;

/// A command that ignores SIGTERM (logging each one to `$LOG`), so only SIGKILL stops it,
/// and records its pid in `$PIDFILE`.
const STUBBORN: &str =
    r#"trap 'echo TERM >> "$LOG"' TERM; echo $$ > "$PIDFILE"; while :; do sleep 0.1; done"#;

/// The lease of the tests that lose it.
const TTL: Duration = Duration::from_secs(2);

#[test]
fn lease_is_renewed_while_the_command_runs() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--ttl", "1s"],
        &sh(r#"touch "$STARTED"; sleep 3; touch "$DONE""#),
    );
    cmd.env("STARTED", s.path("started"))
        .env("DONE", s.path("done"));
    let mut lr = spawn(cmd);
    wait_until("the command started", WAIT, || s.exists("started"));
    let key = lock_key("job");
    // For three TTLs the key must never lapse. The command's "done" file is looked at
    // after the key: if it is absent then, the command was running when the key was read.
    let mut looks = 0;
    while lr.is_running() {
        let pttl = redis.pttl(&key);
        if !s.exists("done") {
            looks += 1;
            assert!(
                pttl > 0 && pttl <= 1000,
                "lock key PTTL {pttl} while the command runs (TTL 1s)"
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert!(looks > 20, "the lock was looked at only {looks} times");
    lr.wait().assert_code(0);
    assert!(!redis.lock_held("job"));
}

/// Redis behind a proxy, and a lockrun through it whose command runs until the scratch
/// file "go" exists, then exits 3.
struct Proxied {
    redis: RedisServer,
    proxy: Proxy,
    s: Scratch,
    lr: Running,
    pid: i32,
}

impl Proxied {
    /// Starts it all with lockrun's `opts`; returns once the command runs.
    fn start(opts: &[&str]) -> Proxied {
        let redis = RedisServer::start();
        let proxy = Proxy::start(redis.port());
        let s = Scratch::new();
        let script = r#"echo $$ > "$PIDFILE"; while [ ! -e "$GO" ]; do sleep 0.02; done; exit 3"#;
        let mut cmd = lockrun_run(&proxy.url(), "job", opts, &sh(script));
        cmd.env("PIDFILE", s.path("pid")).env("GO", s.path("go"));
        let lr = spawn(cmd);
        let pid = wait_pid(&s.path("pid"));
        Proxied {
            redis,
            proxy,
            s,
            lr,
            pid,
        }
    }

    /// Panics unless the command is still running, now and for `how_long`.
    fn assert_alive_for(&self, how_long: Duration, what: &str) {
        let start = Instant::now();
        loop {
            assert!(is_alive(self.pid), "the command was stopped {what}");
            if start.elapsed() >= how_long {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Lets the command end: lockrun passes its status on and frees the lock.
    fn finish(mut self) {
        self.s.touch("go");
        self.lr.wait().assert_code(3);
        assert!(!self.redis.lock_held("job"));
    }
}

#[test]
fn lock_survives_a_cut_connection() {
    // A transient error (the connection is reset, the server is fine) is retried while the
    // lease is valid: the command keeps running and ends normally.
    let p = Proxied::start(&["--ttl", "2s", "--renew-every", "300ms"]);
    p.proxy.set_mode(Mode::Cut);
    let cut = Instant::now();
    // Past one TTL after the cut the key can only exist if renewals went on after it.
    while cut.elapsed() < TTL + Duration::from_millis(500) {
        p.assert_alive_for(Duration::ZERO, "after a connection reset");
        assert!(
            p.redis.lock_held("job"),
            "the lock lapsed after a connection reset"
        );
        thread::sleep(Duration::from_millis(20));
    }
    p.finish();
}

#[test]
fn lock_survives_a_short_partition() {
    // The network swallows everything for well under the lease; lockrun retries and keeps
    // the lock.
    let p = Proxied::start(&["--ttl", "6s", "--renew-every", "500ms"]);
    p.proxy.set_mode(Mode::Blackhole);
    p.assert_alive_for(Duration::from_millis(1200), "during a short partition");
    p.proxy.set_mode(Mode::Pass);
    // Wait until lockrun has renewed through the healed network: PTTL back near 6s.
    wait_until("a renewal after the partition", WAIT, || {
        p.redis.pttl(&lock_key("job")) > 5_000
    });
    p.assert_alive_for(Duration::ZERO, "after the partition");
    p.finish();
}

/// Runs a command under a 30 s lease renewed every second, applies `fault` to Redis (a
/// definite loss), and checks the command is stopped (124) within `limit`, long before
/// the lease could have expired.
fn loss_stops_the_command(
    redis: &mut RedisServer,
    fault: impl FnOnce(&mut RedisServer),
    limit: Duration,
    what: &str,
) {
    let s = Scratch::new();
    let reaper = Reaper::default();
    let opts = ["--ttl", "30s", "--renew-every", "1s"];
    let cmd = lockrun_run(&redis.url(), "job", &opts, &sh(SLEEPER));
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);
    let at = Instant::now();
    fault(redis);
    let f = lr.wait();
    let took = f.ended - at;
    f.assert_failure(124);
    assert!(is_dead(pid), "the command survived the lost lock");
    assert!(
        took < limit,
        "lockrun took {took:?} to stop after {what} (renewal every 1s)"
    );
}

#[test]
fn flushall_stops_the_command_within_a_renewal_period() {
    let mut redis = RedisServer::start();
    let flush = |r: &mut RedisServer| r.flushall();
    loss_stops_the_command(
        &mut redis,
        flush,
        Duration::from_millis(1000 + 2500),
        "FLUSHALL",
    );
}

#[test]
fn another_token_in_the_key_stops_the_command_and_is_left_alone() {
    let mut redis = RedisServer::start();
    let key = lock_key("job");
    let steal = |r: &mut RedisServer| {
        let _: () = r.query(
            redis::cmd("HSET")
                .arg(&key)
                .arg("token")
                .arg("someone-else"),
        );
    };
    loss_stops_the_command(
        &mut redis,
        steal,
        Duration::from_millis(1000 + 2500),
        "losing the lock",
    );
    assert_eq!(
        redis.hget(&key, "token").as_deref(),
        Some("someone-else"),
        "lockrun removed or changed another owner's lock"
    );
    let pttl = redis.pttl(&key);
    assert!(
        pttl > 20_000,
        "lockrun changed the other owner's expiry (PTTL {pttl})"
    );
}

#[test]
fn redis_restarted_mid_run_stops_the_command() {
    // The server came back empty: the key is gone, a definite loss, found at the next
    // renewal after reconnecting.
    let mut redis = RedisServer::start();
    loss_stops_the_command(
        &mut redis,
        RedisServer::restart,
        Duration::from_millis(1000 + 3000),
        "Redis restarted empty",
    );
}

#[test]
fn kill_signal_option_chooses_the_signal_sent_on_loss() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let script = r#"
        $SIG{USR1} = sub { open(my $f, ">>", $ENV{LOG}); print $f "USR1\n"; close $f; exit 3 };
        $SIG{TERM} = sub { open(my $f, ">>", $ENV{LOG}); print $f "TERM\n"; close $f; exit 4 };
        open(my $p, ">", $ENV{PIDFILE}); print $p "$$\n"; close $p;
        sleep 1 for 1..60;
    "#;
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &[
            "--ttl",
            "30s",
            "--renew-every",
            "500ms",
            "--kill-signal",
            "USR1",
        ],
        &["perl", "-e", script],
    );
    cmd.env("PIDFILE", s.path("pid")).env("LOG", s.path("log"));
    let mut lr = spawn(cmd);
    reaper.add(wait_pid(&s.path("pid")));
    redis.flushall();
    lr.wait().assert_failure(124);
    assert_eq!(
        s.read("log"),
        "USR1\n",
        "signals the command received on loss"
    );
}

#[test]
fn kill_after_escalates_to_sigkill_on_loss() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = lockrun_run(
        &redis.url(),
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
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);

    let fault = Instant::now();
    redis.flushall();
    wait_until("the command got TERM", WAIT, || {
        s.read("log").contains("TERM")
    });
    let f = lr.wait();
    let took = f.ended - fault;
    f.assert_failure(124);
    assert!(is_dead(pid));
    assert!(
        took >= Duration::from_secs(1),
        "SIGKILL came {took:?} after the loss, before --kill-after 1s"
    );
    assert!(
        took < Duration::from_millis(500 + 1000 + 3000),
        "lockrun took {took:?} to kill a TERM-ignoring command with --kill-after 1s"
    );
}

#[test]
fn a_frozen_lockruns_guard_kills_its_command_by_the_lease_deadline() {
    // lockrun frozen (a freezer cgroup, as `docker pause` does it to lockrun alone)
    // cannot kill at the deadline; its guard, which lockrun gave the deadline, does.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = lockrun_run(&redis.url(), "job", &["--ttl", "2s"], &sh(SLEEPER));
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);

    // Every renewal lockrun sent was sent before this instant, so the deadline it gave
    // the guard is at most a TTL later.
    let frozen_at = Instant::now();
    let frozen = Frozen::freeze(lr.pid());
    wait_until(
        "the command died while its lockrun was frozen",
        WAIT,
        || is_dead(pid),
    );
    let died = frozen_at.elapsed();
    assert!(
        died < Duration::from_millis(2000 + 300),
        "the command of a frozen lockrun ran {died:?} after the freeze (TTL 2s)"
    );
    assert!(
        !is_dead(lr.pid()),
        "lockrun itself is only frozen, not gone"
    );
    frozen.thaw();
    lr.wait().assert_failure(124);
}

#[test]
fn a_stopped_lockrun_is_continued_at_its_deadline_and_kills_its_command() {
    // SIGSTOP (an operator, a terminal's ^Z) does not keep lockrun from its deadline:
    // the kernel continues it then (its alarm), and it stops the job and exits 124 with
    // no SIGCONT from anyone.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = lockrun_run(&redis.url(), "job", &["--ttl", "2s"], &sh(SLEEPER));
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);

    let stopped = Instant::now();
    lr.signal(Signal::SIGSTOP);
    let f = lr.wait_for(WAIT);
    f.assert_failure(124);
    assert!(is_dead(pid), "the command outlived its lockrun");
    let took = f.ended - stopped;
    assert!(
        took < Duration::from_millis(2000 + 500),
        "a stopped lockrun ended {took:?} after the stop (TTL 2s)"
    );
}

#[test]
fn paused_lockrun_kills_its_command_on_resume() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = lockrun_run(&redis.url(), "job", &["--ttl", "2s"], &sh(SLEEPER));
    let (mut first, pid) = spawn_recording_pid(cmd, &s, &reaper);

    // Frozen, not stopped: a stopped lockrun is continued at its deadline. Its guard
    // runs on and kills the command at the deadline; what is checked here is lockrun
    // itself once it runs again.
    let frozen = Frozen::freeze(first.pid());
    wait_until("the paused holder's lock expired", WAIT, || {
        !redis.lock_held("job")
    });

    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--wait", "20s"],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT"; while [ ! -e "$GO" ]; do sleep 0.02; done"#),
    );
    cmd.env("OUT", s.path("second")).env("GO", s.path("go"));
    let mut second = spawn(cmd);
    let second_token = wait_line(&s.path("second"));

    let resumed = Instant::now();
    frozen.thaw();
    let died = wait_until("the first command died after the thaw", WAIT, || {
        is_dead(pid)
    });
    assert!(
        died < Duration::from_secs(2),
        "the first command ran on for {died:?} after its lockrun resumed past its TTL"
    );
    let f = first.wait();
    f.assert_failure(124);
    assert!(
        f.ended - resumed < Duration::from_secs(5),
        "the first lockrun took {:?} to exit after resuming",
        f.ended - resumed
    );
    // The first lockrun must not have touched the second holder's lock.
    assert_eq!(
        redis.hget(&lock_key("job"), "fence"),
        Some(second_token),
        "the second holder's lock changed"
    );
    s.touch("go");
    second.wait().assert_code(0);
}

#[test]
fn lease_is_counted_from_the_send_time_not_the_reply() {
    // Replies take 1s to come back. Redis is killed right after it processed a renewal, whose
    // reply is still on its way: that renewal was sent before the kill, so the lease ends
    // at most TTL after the kill. A lockrun that counted from the reply would let the
    // command run on for up to another second.
    let mut redis = RedisServer::start();
    // One run first, without the delay: the server then has the acquire script, which
    // lockrun sends by its digest (a fresh server costs the acquire a second round trip,
    // two seconds here, more than the request timeout). This test is about renewals.
    let warm = lockrun_run(&redis.url(), "warm", &[], &["true"]);
    run(warm).assert_code(0);
    let proxy = Proxy::start(redis.port());
    proxy.set_reply_delay(Duration::from_secs(1));
    let s = Scratch::new();
    let reaper = Reaper::default();
    let ttl = Duration::from_secs(4);
    let cmd = lockrun_run(
        &proxy.url(),
        "job",
        &["--ttl", "4s", "--renew-every", "300ms"],
        &sh(STUBBORN),
    );
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);

    // Watch the key directly (not through the proxy) for a renewal landing on the server.
    let key = lock_key("job");
    let mut last = redis.pttl(&key);
    let mut renewed = false;
    wait_until("a renewal reached the server", WAIT, || {
        let pttl = redis.pttl(&key);
        renewed = pttl > last + 20;
        last = pttl;
        renewed
    });
    let fault = Instant::now();
    redis.kill();
    assert!(is_alive(pid), "the command died before the fault");
    assert_dead_by(
        pid,
        fault,
        fault + ttl,
        "redis killed with replies in flight",
    );
    lr.wait().assert_failure(124);
}

#[test]
fn release_against_a_blackholed_network_does_not_hang() {
    // The command ended but the release cannot get through: lockrun must not wait forever
    // (the lease expires by itself) and still reports the command's own status.
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port());
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &proxy.url(),
        "job",
        &["--ttl", "2s"],
        &sh(r#"touch "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done; exit 3"#),
    );
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let mut lr = spawn(cmd);
    wait_until("the command started", WAIT, || s.exists("started"));
    proxy.set_mode(Mode::Blackhole);
    let fault = Instant::now();
    s.touch("go");
    let f = lr.wait();
    assert!(
        f.ended - fault < TTL + Duration::from_secs(3),
        "lockrun took {:?} to give up releasing through a dead network",
        f.ended - fault
    );
    f.assert_code(3);
}
