//! What only the ZooKeeper backend (`zk://`) has, against real ZooKeeper servers
//! started by the tests: the queue nodes as the server keeps them, the session timeout
//! the server grants, a session the server expired, 50 waiters served in order with
//! one watch each, a 3-member ensemble losing its leader, digest authentication and
//! the chroot; and semaphores (`--slots`): the slot nodes, the waiter at the boundary
//! watching every holder ahead and the others one node, racing runs never two on a
//! slot, a conflicting N refused, the hold node of each slot. The contract every
//! backend keeps is tested in the conformance suite. Beside it: `hostile` (servers that
//! misbehave) and `records` (the last run's record node and its expiry).

mod hostile;
mod records;

use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;

/// The queue nodes of lock `name` under the default prefix, as `dump` lists them.
fn queue_nodes(zk: &ZkServer, name: &str) -> Vec<String> {
    let dir = format!("/lockrun:/{}/lock-", name.replace('/', "%2F"));
    zk.ephemerals()
        .into_iter()
        .filter(|p| p.starts_with(&dir))
        .collect()
}

#[test]
fn the_holder_is_one_queue_node_and_busy_runs_leave_nothing() {
    let zk = ZkServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&zk.url(), "team/job", &s, &["--ttl", "30s"]);
    let nodes = queue_nodes(&zk, "team/job");
    assert_eq!(nodes.len(), 1, "the holder's node: {:?}", zk.ephemerals());
    // lock-<32 hex digits of token>-<10 digits of sequence>
    let name = nodes[0].rsplit('/').next().unwrap();
    let parts: Vec<&str> = name.split('-').collect();
    assert_eq!(parts.len(), 3, "{name}");
    assert_eq!((parts[1].len(), parts[2].len()), (32, 10), "{name}");
    run(lockrun_run(&zk.url(), "team/job", &[], &["true"])).assert_failure(75);
    let f = run(lockrun_run(
        &zk.url(),
        "team/job",
        &["--wait", "300ms"],
        &["true"],
    ));
    f.assert_failure(75);
    assert_eq!(
        queue_nodes(&zk, "team/job"),
        nodes,
        "a busy run left a node behind"
    );
    s.touch("go");
    holder.wait().assert_code(0);
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
}

#[test]
fn a_ttl_above_the_servers_maximum_is_refused_and_one_below_its_minimum_raised() {
    let zk = ZkServer::start();
    let s = Scratch::new();
    let mut cmd = lockrun_run(&zk.url(), "job", &["--ttl", "2m"], &sh(r#"touch "$MARK""#));
    cmd.env("MARK", s.path("mark"));
    let f = run(cmd);
    f.assert_failure(125);
    let line = f.lockrun_line().unwrap();
    assert!(
        line.contains("maxSessionTimeout") && line.contains("--ttl 1m"),
        "the refusal does not name the limit and the fix: {line}"
    );
    assert!(!s.exists("mark"), "the command ran");
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
    // 800 ms is below the server's 1 s minimum: the server keeps the session longer,
    // lockrun's own deadline stays the shorter one.
    let opts = ["--ttl", "800ms", "--wait", "10s"];
    run(lockrun_run(&zk.url(), "job", &opts, &sh("sleep 1"))).assert_code(0);
}

#[test]
fn a_session_the_server_expired_while_lockrun_was_frozen_is_a_loss() {
    let zk = ZkServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = lockrun_run(&zk.url(), "job", &["--ttl", "2s"], &sh(SLEEPER));
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);
    assert_eq!(queue_nodes(&zk, "job").len(), 1);
    // Frozen, lockrun sends no heartbeat: the server expires its session, and the lock
    // node with it. (Frozen, not stopped: a stopped lockrun is continued at its lease
    // deadline.)
    let frozen = Frozen::freeze(lr.pid());
    wait_until("the server expired the session", WAIT, || {
        queue_nodes(&zk, "job").is_empty()
    });
    let resumed = Instant::now();
    frozen.thaw();
    let f = lr.wait_for(Duration::from_secs(10));
    f.assert_failure(124);
    assert!(is_dead(pid), "the command outlived its lockrun");
    assert!(
        resumed.elapsed() < Duration::from_secs(2),
        "lockrun took {:?} to stop the command after it woke",
        resumed.elapsed()
    );
    assert!(f.stderr.contains("stopped the command"), "{}", f.stderr);
    run(lockrun_run(&zk.url(), "job", &[], &["true"])).assert_code(0);
}

#[test]
fn fifty_waiters_are_served_in_order_with_one_watch_each() {
    const WAITERS: usize = 50;
    alone();
    let zk = ZkServer::start();
    let s = Scratch::new();
    let (mut holder, first) = start_holder(&zk.url(), "job", &s, &["--ttl", "30s"]);
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let mut cmd = lockrun_run(
            &zk.url(),
            "job",
            &["--wait", "120s"],
            &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" >> "$OUT""#),
        );
        cmd.env("OUT", s.path("order"));
        waiters.push(spawn(cmd));
        // Queue one at a time, so that the order of arrival is known.
        wait_until("the waiter queued", WAIT, || {
            queue_nodes(&zk, "job").len() == i + 2
        });
    }
    // Every waiter watches the one node just ahead of it, and nothing else.
    let watches = wait_watching(&zk, WAITERS);
    let mut paths: Vec<&String> = watches.iter().flatten().collect();
    assert!(
        watches.iter().all(|w| w.len() == 1),
        "a waiter watches more than one node: {watches:?}"
    );
    paths.sort();
    paths.dedup();
    assert_eq!(
        paths.len(),
        WAITERS,
        "two waiters watch one node: {watches:?}"
    );

    let go = Instant::now();
    s.touch("go");
    holder.wait().assert_code(0);
    for w in &mut waiters {
        w.wait_for(Duration::from_secs(60)).assert_code(0);
    }
    let handoffs = go.elapsed();
    let order: Vec<u128> = s.read("order").lines().map(parse_token).collect();
    assert_eq!(order.len(), WAITERS);
    // A waiter's token is its node's creation zxid: increasing tokens in the order the
    // commands ran is the order of arrival.
    assert!(
        first < order[0] && order.windows(2).all(|w| w[0] < w[1]),
        "not served in order of arrival: {first} then {order:?}"
    );
    assert!(
        handoffs < Duration::from_secs(20),
        "50 hand-offs took {handoffs:?}"
    );
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
}

/// The watches of the sessions that watch anything, once `n` of them do.
fn wait_watching(zk: &ZkServer, n: usize) -> Vec<Vec<String>> {
    let mut watches = Vec::new();
    wait_until("every waiter watches", WAIT, || {
        watches = zk.watches();
        watches.len() >= n
    });
    assert_eq!(
        watches.len(),
        n,
        "more sessions watch than wait: {watches:?}"
    );
    watches
}

#[test]
fn the_leader_killed_while_a_lock_is_held_keeps_it_or_stops_the_command_in_time() {
    const TTL: Duration = Duration::from_secs(8);
    let mut ens = ZkEnsemble::start();
    let url = ens.url();
    let s = Scratch::new();
    let opts = ["--ttl", "8s", "--renew-every", "1s"];
    let (mut lr, before) = start_holder(&url, "job", &s, &opts);
    let pid = wait_pid_of_holder(&lr);
    let at = Instant::now();
    ens.leader().kill();
    // Until the lease could have expired, the holder either still runs under the lock
    // or has been stopped; past it, only a holder that renewed through the new leader
    // may still run.
    while at.elapsed() < TTL {
        if let Some(f) = lr.try_finish() {
            eprintln!(
                "the holder was stopped {:?} after the leader died",
                at.elapsed()
            );
            f.assert_failure(124);
            assert!(is_dead(pid), "the command outlived its stopped lockrun");
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    if lr.is_running() {
        eprintln!("the holder kept the lock through the election");
        let mut status = lockrun();
        status.args(["status", "--json", "--url", &url, "job"]);
        let f = run(status);
        let v: serde_json::Value = serde_json::from_str(f.stdout.trim()).expect("JSON");
        assert_eq!(
            v["pid"].as_u64(),
            Some(lr.pid() as u64),
            "the holder lost the lock: {v}"
        );
        s.touch("go");
        lr.wait().assert_code(0);
    }
    let f = run(lockrun_run(
        &url,
        "job",
        &["--wait", "30s"],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN""#),
    ));
    let after = parse_token(f.assert_code(0).stdout.trim());
    assert!(
        after > before,
        "the token after the new leader ({after}) is not above {before}"
    );
}

/// The pid of a [`start_holder`] lockrun's command (its only child).
fn wait_pid_of_holder(lr: &Running) -> i32 {
    let children = format!("/proc/{0}/task/{0}/children", lr.pid());
    let mut pid = 0;
    wait_until("the holder's command has a pid", WAIT, || {
        pid = std::fs::read_to_string(&children)
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pid > 0
    });
    pid
}

#[test]
fn digest_authentication_guards_the_lock_and_the_password_is_never_shown() {
    let zk = ZkServer::start();
    let url = format!("zk://app:s3cret-pw@127.0.0.1:{}", zk.port());
    let s = Scratch::new();
    // The URL in the environment, where it does not show in `ps`.
    let mut cmd = lockrun();
    let script = r#"echo "$LOCKRUN_URL" > "$OUT"; touch "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;
    cmd.env("LOCKRUN_URL", &url)
        .args(["job", "--"])
        .args(sh(script));
    cmd.env("OUT", s.path("url"))
        .env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let mut holder = spawn(cmd);
    wait_until("the command started", WAIT, || s.exists("started"));
    assert_eq!(
        s.read("url").trim(),
        format!("zk://app@127.0.0.1:{}", zk.port()),
        "the command got the password"
    );

    let status = |url: &str, password: Option<&str>| {
        let mut cmd = lockrun();
        cmd.args(["status", "--url", url, "job"]);
        if let Some(p) = password {
            cmd.env("LOCKRUN_PASSWORD", p);
        }
        run(cmd)
    };
    status(&url, None).assert_code(0);
    let user = format!("zk://app@127.0.0.1:{}", zk.port());
    status(&user, Some("s3cret-pw")).assert_code(0);
    for f in [status(&user, Some("wrong-pw")), status(&zk.url(), None)] {
        f.assert_failure(125);
        let line = f.lockrun_line().unwrap();
        assert!(line.contains("denied access"), "{line}");
        assert!(
            !f.stderr.contains("pw") && !f.stdout.contains("pw"),
            "{}",
            f.stderr
        );
    }
    s.touch("go");
    let f = holder.wait();
    f.assert_code(0);
    assert!(!f.stderr.contains("s3cret"), "{}", f.stderr);
}

#[test]
fn locks_live_under_the_chroot_and_a_missing_one_is_named() {
    let zk = ZkServer::start();
    let url = format!("{}/jobs/locks", zk.url());
    let f = run(lockrun_run(&url, "job", &[], &["true"]));
    f.assert_failure(125);
    let line = f.lockrun_line().unwrap();
    assert!(
        line.contains("chroot /jobs/locks does not exist") && line.contains("create"),
        "{line}"
    );
    zk.cli(&["create", "/jobs"]);
    zk.cli(&["create", "/jobs/locks"]);
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&url, "job", &s, &[]);
    let nodes = zk.ephemerals();
    assert!(
        nodes.len() == 1 && nodes[0].starts_with("/jobs/locks/lockrun:/job/lock-"),
        "the lock is not under the chroot: {nodes:?}"
    );
    // Another chroot (or none) is another tree of locks.
    run(lockrun_run(&zk.url(), "job", &[], &["true"])).assert_code(0);
    run(lockrun_run(&url, "job", &[], &["true"])).assert_failure(75);
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn runs_without_wait_racing_for_a_free_lock_never_overlap() {
    const WORKERS: usize = 6;
    const ROUNDS: usize = 4;
    let zk = ZkServer::start();
    let history = Sections::new(Duration::from_millis(30));
    let ran = std::sync::atomic::AtomicUsize::new(0);
    // Without --wait, a run that finds the lock free takes it without listing the
    // queue again when nothing changed in between: racing runs test that shortcut.
    thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                for _ in 0..ROUNDS {
                    let mut cmd = lockrun_run(&zk.url(), "job", &[], &Sections::command());
                    history.env(&mut cmd);
                    match run(cmd).code {
                        Some(0) => drop(ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst)),
                        Some(75) => {}
                        other => panic!("a racing run ended with {other:?}"),
                    }
                }
            });
        }
    });
    let ran = ran.into_inner();
    assert!(ran > 0, "no run took the lock");
    history.assert_sequential(ran);
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
}

/// A command that writes its fencing token and slot to `$STARTED`, then runs until
/// `$GO` exists.
const SLOT_HOLD: &str = r#"echo "$LOCKRUN_FENCING_TOKEN $LOCKRUN_SLOT" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// A lockrun running [`SLOT_HOLD`] on `name` with `opts`, with its files in `s`.
fn spawn_slot_holder(zk: &ZkServer, name: &str, s: &Scratch, opts: &[&str]) -> Running {
    let mut cmd = lockrun_run(&zk.url(), name, opts, &sh(SLOT_HOLD));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    spawn(cmd)
}

/// The fencing token and slot a [`SLOT_HOLD`] command wrote, once it runs.
fn token_and_slot(s: &Scratch) -> (u128, u32) {
    let line = wait_line(&s.path("started"));
    let (token, slot) = line.split_once(' ').expect("token and slot");
    (parse_token(token), slot.parse().expect("a slot number"))
}

/// The queue node of the lockrun whose node is the `i`-th of `name`'s queue (by
/// sequence number), as a path.
fn nth_in_queue(zk: &ZkServer, name: &str, i: usize) -> String {
    let mut nodes = queue_nodes(zk, name);
    nodes.sort_by_key(|p| p.rsplit('-').next().unwrap_or_default().to_owned());
    nodes[i].clone()
}

#[test]
fn two_holders_take_slots_0_and_1_and_the_next_waiters_are_woken_by_either() {
    let zk = ZkServer::start();
    let opts = ["--slots", "2", "--ttl", "30s", "--wait", "60s"];
    let scratch: Vec<Scratch> = (0..4).map(|_| Scratch::new()).collect();
    let mut a = spawn_slot_holder(&zk, "pool", &scratch[0], &opts);
    let (token_a, slot_a) = token_and_slot(&scratch[0]);
    let mut b = spawn_slot_holder(&zk, "pool", &scratch[1], &opts);
    let (token_b, slot_b) = token_and_slot(&scratch[1]);
    assert_eq!((slot_a, slot_b), (0, 1), "not the lowest free slots");
    assert!(token_a < token_b, "{token_a} then {token_b}");
    // Each holder: a queue node naming N, and its slot's ephemeral node.
    let nodes = zk.ephemerals();
    for slot in ["/lockrun:/pool/slot-0", "/lockrun:/pool/slot-1"] {
        assert!(nodes.iter().any(|n| n == slot), "no {slot} in {nodes:?}");
    }
    let queue = queue_nodes(&zk, "pool");
    assert_eq!(queue.len(), 2, "{nodes:?}");
    for node in &queue {
        let name = node.rsplit('/').next().unwrap();
        let parts: Vec<&str> = name.split('-').collect();
        assert_eq!(parts.len(), 4, "{name}");
        assert_eq!(
            (parts[1].len(), parts[2], parts[3].len()),
            (32, "n2", 10),
            "{name}"
        );
    }

    // c waits at the boundary, watching both holders; d behind it watches c alone.
    let mut c = spawn_slot_holder(&zk, "pool", &scratch[2], &opts);
    wait_until("c queued", WAIT, || queue_nodes(&zk, "pool").len() == 3);
    let mut d = spawn_slot_holder(&zk, "pool", &scratch[3], &opts);
    wait_until("d queued", WAIT, || queue_nodes(&zk, "pool").len() == 4);
    let node_c = nth_in_queue(&zk, "pool", 2);
    let mut watches = wait_watching(&zk, 2);
    watches.sort_by_key(Vec::len);
    let mut holders = queue.clone();
    holders.sort();
    watches[1].sort();
    assert_eq!(watches, vec![vec![node_c], holders], "who watches what");

    // The holder of slot 1 leaves: c takes slot 1; d is now at the boundary.
    scratch[1].touch("go");
    b.wait().assert_code(0);
    let (token_c, slot_c) = token_and_slot(&scratch[2]);
    assert_eq!(slot_c, 1);
    assert!(token_c > token_b, "{token_c} after {token_b}");
    assert!(!scratch[3].exists("started"), "d ran with both slots held");
    wait_until("d watches both holders", WAIT, || {
        zk.watches().iter().any(|w| w.len() == 2)
    });
    // The holder of slot 0 leaves: d takes slot 0.
    scratch[0].touch("go");
    a.wait().assert_code(0);
    let (token_d, slot_d) = token_and_slot(&scratch[3]);
    assert_eq!(slot_d, 0);
    assert!(token_d > token_c, "{token_d} after {token_c}");
    scratch[2].touch("go");
    scratch[3].touch("go");
    c.wait().assert_code(0);
    d.wait().assert_code(0);
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
}

#[test]
fn a_waiter_behind_the_boundary_keeps_one_watch_and_every_waiter_is_served() {
    const WAITERS: usize = 8;
    alone();
    let zk = ZkServer::start();
    let opts = ["--slots", "3", "--ttl", "30s", "--wait", "120s"];
    let holders: Vec<Scratch> = (0..3).map(|_| Scratch::new()).collect();
    let mut running: Vec<Running> = holders
        .iter()
        .map(|s| {
            let r = spawn_slot_holder(&zk, "pool", s, &opts);
            token_and_slot(s);
            r
        })
        .collect();
    let out = Scratch::new();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let mut cmd = lockrun_run(
            &zk.url(),
            "pool",
            &opts,
            &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" >> "$OUT"; sleep 0.05"#),
        );
        cmd.env("OUT", out.path("order"));
        waiters.push(spawn(cmd));
        wait_until("the waiter queued", WAIT, || {
            queue_nodes(&zk, "pool").len() == 3 + i + 1
        });
    }
    // The first waiter watches the 3 holders; each later one the waiter ahead of it.
    let watches = wait_watching(&zk, WAITERS);
    let mut sizes: Vec<usize> = watches.iter().map(Vec::len).collect();
    sizes.sort_unstable();
    let mut expected = vec![1; WAITERS - 1];
    expected.push(3);
    assert_eq!(sizes, expected, "{watches:?}");
    let mut paths: Vec<&String> = watches.iter().flatten().collect();
    paths.sort();
    paths.dedup();
    assert_eq!(
        paths.len(),
        3 + WAITERS - 1,
        "two waiters watch one node: {watches:?}"
    );

    for (s, r) in holders.iter().zip(&mut running) {
        s.touch("go");
        r.wait().assert_code(0);
    }
    for w in &mut waiters {
        w.wait_for(Duration::from_secs(60)).assert_code(0);
    }
    let order: Vec<u128> = out.read("order").lines().map(parse_token).collect();
    assert_eq!(order.len(), WAITERS);
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
}

#[test]
fn racing_runs_never_share_a_slot_nor_exceed_n() {
    const WORKERS: usize = 6;
    const ROUNDS: usize = 3;
    let zk = ZkServer::start();
    let s = Scratch::new();
    std::fs::create_dir(s.path("in")).unwrap();
    // mkdir of the slot fails if another holder is inside on it; the count of
    // directories is how many are inside at once.
    let script = r#"mkdir "$IN/$LOCKRUN_SLOT" || echo "slot $LOCKRUN_SLOT twice" >> "$BAD"
n=$(ls "$IN" | wc -l); [ "$n" -le 2 ] || echo "$n inside" >> "$BAD"
echo "$LOCKRUN_FENCING_TOKEN" >> "$TOKENS"; sleep 0.03; rmdir "$IN/$LOCKRUN_SLOT""#;
    thread::scope(|scope| {
        for w in 0..WORKERS {
            let (zk, s) = (&zk, &s);
            scope.spawn(move || {
                for _ in 0..ROUNDS {
                    // Half wait, half do not: both paths race.
                    let wait = if w % 2 == 0 { "60s" } else { "0s" };
                    let opts = ["--slots", "2", "--wait", wait];
                    let mut cmd = lockrun_run(&zk.url(), "pool", &opts, &sh(script));
                    cmd.env("IN", s.path("in"))
                        .env("BAD", s.path("bad"))
                        .env("TOKENS", s.path("tokens"));
                    match run(cmd).code {
                        Some(0) | Some(75) => {}
                        other => panic!("a racing run ended with {other:?}"),
                    }
                }
            });
        }
    });
    assert!(!s.exists("bad"), "{}", s.read("bad"));
    let mut tokens: Vec<u128> = s.read("tokens").lines().map(parse_token).collect();
    assert!(tokens.len() >= WORKERS / 2 * ROUNDS, "{tokens:?}");
    let all = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), all, "a token was handed out twice");
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
}

#[test]
fn a_conflicting_n_is_refused_with_125_without_a_node_left() {
    let zk = ZkServer::start();
    let s = Scratch::new();
    let mut holder = spawn_slot_holder(&zk, "pool", &s, &["--slots", "2"]);
    token_and_slot(&s);
    let before = zk.ephemerals();
    for (opts, says) in [
        (vec!["--slots", "3"], "--slots 2, not --slots 3"),
        (
            vec!["--slots", "3", "--wait", "5s"],
            "--slots 2, not --slots 3",
        ),
        (vec![], "--slots 2, not a plain lock"),
        (vec!["--wait", "5s"], "--slots 2, not a plain lock"),
    ] {
        let f = run(lockrun_run(&zk.url(), "pool", &opts, &["true"]));
        f.assert_failure(125);
        let line = f.lockrun_line().unwrap();
        assert!(line.contains(says), "{opts:?}: {line}");
        assert_eq!(zk.ephemerals(), before, "{opts:?} left a node");
    }
    s.touch("go");
    holder.wait().assert_code(0);
    // A plain holder refuses a semaphore the same way.
    let plain = Scratch::new();
    let (mut holder, _) = start_holder(&zk.url(), "pool", &plain, &[]);
    let f = run(lockrun_run(
        &zk.url(),
        "pool",
        &["--slots", "2", "--wait", "5s"],
        &["true"],
    ));
    f.assert_failure(125);
    assert!(f
        .lockrun_line()
        .unwrap()
        .contains("a plain lock (--slots 1), not --slots 2"));
    plain.touch("go");
    holder.wait().assert_code(0);
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
}

#[test]
fn each_slot_keeps_its_own_hold_node() {
    let zk = ZkServer::start();
    let opts = ["--slots", "2", "--ttl", "30s", "--wait", "60s"];
    let (a, b) = (Scratch::new(), Scratch::new());
    let mut holder_a = spawn_slot_holder(
        &zk,
        "pool",
        &a,
        &[&opts[..], &["--hold-at-least", "10s"]].concat(),
    );
    token_and_slot(&a);
    let mut holder_b = spawn_slot_holder(
        &zk,
        "pool",
        &b,
        &[&opts[..], &["--hold-at-least", "1s"]].concat(),
    );
    token_and_slot(&b);
    // Both leave at once; each slot is kept by its hold node (slot 0's is the plain
    // lock's `hold`), persistent, so not in the ephemeral nodes.
    a.touch("go");
    b.touch("go");
    holder_a.wait().assert_code(0);
    holder_b.wait().assert_code(0);
    let listed = zk.cli(&["ls", "/lockrun:/pool"]);
    assert!(
        listed.contains("hold") && listed.contains("hold-1"),
        "no hold nodes: {listed}"
    );
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
    // Slot 1's hold ends first: a new run takes slot 1, not slot 0.
    let f = run(lockrun_run(
        &zk.url(),
        "pool",
        &opts,
        &sh(r#"echo "$LOCKRUN_SLOT""#),
    ));
    assert_eq!(f.assert_code(0).stdout.trim(), "1");
    let mut status = lockrun();
    status.args([
        "status",
        "--json",
        "--slots",
        "2",
        "--url",
        &zk.url(),
        "pool",
    ]);
    let f = run(status);
    let v: serde_json::Value = serde_json::from_str(f.assert_code(0).stdout.trim()).expect("JSON");
    let slots: Vec<u64> = v["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter_map(|h| h["slot"].as_u64())
        .collect();
    assert_eq!(slots, vec![0], "only slot 0's hold keeps it: {v}");
    // The run on slot 1 removed the hold it found over; slot 0's stays until it ends
    // (beside the record of the last run and of the last success).
    let listed = zk.cli(&["ls", "/lockrun:/pool"]);
    assert!(listed.contains("[hold, last, ok]"), "{listed}");
}

#[test]
fn a_waiter_that_gives_up_at_the_boundary_hands_it_to_the_one_behind() {
    let zk = ZkServer::start();
    let opts = ["--slots", "2", "--ttl", "30s", "--wait", "60s"];
    let scratch: Vec<Scratch> = (0..3).map(|_| Scratch::new()).collect();
    let mut a = spawn_slot_holder(&zk, "pool", &scratch[0], &opts);
    token_and_slot(&scratch[0]);
    let mut b = spawn_slot_holder(&zk, "pool", &scratch[1], &opts);
    token_and_slot(&scratch[1]);
    let holders = {
        let mut q = queue_nodes(&zk, "pool");
        q.sort();
        q
    };
    // c waits 3 s at the boundary; d behind it watches c.
    let quitter = lockrun_run(
        &zk.url(),
        "pool",
        &["--slots", "2", "--wait", "3s"],
        &["true"],
    );
    let mut c = spawn(quitter);
    wait_until("c queued", WAIT, || queue_nodes(&zk, "pool").len() == 3);
    let mut d = spawn_slot_holder(&zk, "pool", &scratch[2], &opts);
    wait_until("d queued", WAIT, || queue_nodes(&zk, "pool").len() == 4);
    wait_watching(&zk, 2);
    // c gives up: its node's deletion wakes d alone, which now watches both holders.
    c.wait_for(Duration::from_secs(20)).assert_failure(75);
    wait_until("d watches both holders", WAIT, || {
        zk.watches().iter().any(|w| {
            let mut w = w.clone();
            w.sort();
            w == holders
        })
    });
    assert_eq!(zk.watches().len(), 1, "{:?}", zk.watches());
    assert!(!scratch[2].exists("started"));
    // Either holder leaving now admits d.
    scratch[1].touch("go");
    b.wait().assert_code(0);
    let (_, slot) = token_and_slot(&scratch[2]);
    assert_eq!(slot, 1);
    scratch[0].touch("go");
    scratch[2].touch("go");
    a.wait().assert_code(0);
    d.wait().assert_code(0);
    assert!(zk.ephemerals().is_empty(), "left: {:?}", zk.ephemerals());
}
