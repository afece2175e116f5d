//! Redis Cluster: one `redis://` URL at any node (or `redis+cluster://` seeds) works for
//! every name, through redirections, a slot migration and master failovers (manual,
//! killed, frozen); a semaphore's slots live together on the name's master; every master
//! is checked for eviction; several nodes of one Cluster are never taken for a Redlock
//! quorum.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::*;

/// Runs `true` under `name` and answers its fencing token.
fn token_run(url: &str, name: &str, s: &Scratch, opts: &[&str]) -> u128 {
    let mut cmd = lockrun_run(
        url,
        name,
        opts,
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    cmd.env("OUT", s.path("out"));
    run(cmd).assert_code(0);
    parse_token(s.read("out").trim())
}

fn admin(sub: &str, url: &str, args: &[&str]) -> Finished {
    let mut cmd = lockrun();
    cmd.arg(sub).args(["--url", url]).args(args);
    run(cmd)
}

/// How many times `server` ran `command` (INFO commandstats).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = server.query(redis::cmd("INFO").arg("commandstats"));
    let field = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(field.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a number of calls"))
}

/// The master of lock `name`'s slot.
fn owner(c: &RedisCluster, name: &str) -> usize {
    c.master_of(c.key_slot(&lock_key(name)))
}

/// A name of the form `PREFIXi` whose slot lives on master `master`.
fn name_on(c: &RedisCluster, prefix: &str, master: usize) -> String {
    (0..200)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| owner(c, n) == master)
        .unwrap_or_else(|| panic!("no name on node {master}"))
}

/// The masters, by index.
fn masters(c: &RedisCluster) -> BTreeSet<usize> {
    [0, 8000, 16383]
        .into_iter()
        .map(|s| c.master_of(s))
        .collect()
}

#[test]
fn twenty_names_through_one_node_all_work() {
    let c = RedisCluster::start();
    let url = c.url(0);
    let s = Scratch::new();
    let mut owners = BTreeSet::new();
    for i in 0..20 {
        let name = format!("job{i}");
        let at = owner(&c, &name);
        owners.insert(at);
        let token = token_run(&url, &name, &s, &[]);
        let fence: Option<String> = c.node(at).query(redis::cmd("GET").arg(fence_key(&name)));
        assert_eq!(fence, Some(token.to_string()), "{name} on node {at}");
        admin("status", &url, &[&name]).assert_code(1);
        admin("release", &url, &["--force", &name]).assert_code(0);
    }
    assert_eq!(owners.len(), 3, "20 names should span the 3 masters");

    // On every master: status and release --force of a held lock, and a --wait
    // hand-off woken by the release.
    for m in masters(&c) {
        let name = name_on(&c, "held", m);
        let s = Scratch::new();
        let (mut h, _) = start_holder(&url, &name, &s, &["--ttl", "30s", "--renew-every", "500ms"]);
        let f = admin("status", &url, &[&name]);
        f.assert_code(0);
        assert!(f.stdout.contains("held by"), "{}", f.stdout);
        let f = admin("release", &url, &["--force", &name]);
        f.assert_code(0);
        assert!(f.stderr.contains(&h.pid().to_string()), "{}", f.stderr);
        h.wait_for(Duration::from_secs(20)).assert_failure(124);

        let s = Scratch::new();
        let (mut h, token) = start_holder(&url, &name, &s, &["--ttl", "30s"]);
        let mut waiter = lockrun_run(
            &url,
            &name,
            &["--wait", "30s"],
            &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
        );
        waiter.env("OUT", s.path("out"));
        let mut waiter = spawn(waiter);
        let pattern = format!("lockrun:{{{name}}}:wake:*");
        wait_until("the waiter subscribed on the slot's master", WAIT, || {
            let channels: Vec<String> = c
                .node(m)
                .query(redis::cmd("PUBSUB").arg("CHANNELS").arg(&pattern));
            !channels.is_empty()
        });
        let go = Instant::now();
        s.touch("go");
        h.wait().assert_code(0);
        wait_until("the waiter ran", WAIT, || {
            s.exists("out") && !s.read("out").is_empty()
        });
        let handoff = go.elapsed();
        waiter.wait().assert_code(0);
        assert!(parse_token(s.read("out").trim()) > token);
        // A waiter that was not woken polls every 2 s: the wake-up came sooner.
        assert!(
            handoff < Duration::from_millis(1500),
            "hand-off on node {m} took {handoff:?}"
        );
    }
}

#[test]
fn a_lock_lives_on_across_a_slot_migration() {
    let c = RedisCluster::start();
    let all = masters(&c);
    let from = *all.first().unwrap();
    let to = *all.last().unwrap();
    let name = name_on(&c, "moving", from);
    let slot = c.key_slot(&lock_key(&name));
    let s = Scratch::new();
    // A lease of 6 s: the migration's steps may take seconds on a loaded machine (seen
    // with Valkey 8.1 and 3 s), and the lease must outlast them.
    let (mut h, token) = start_holder(&c.url(from), &name, &s, &["--ttl", "6s"]);
    c.start_migration(slot, from, to);
    // A renewal (every 2 s) falls while the slot is open: ASK, then TRYAGAIN.
    std::thread::sleep(Duration::from_millis(2400));
    c.finish_migration(slot, to);
    assert!(
        calls(c.node(to), "asking") > 0,
        "no renewal followed an ASK to the importing node"
    );
    let left: i64 = c
        .node(from)
        .query(redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot));
    assert_eq!(left, 0, "keys left on the old owner");
    // Past a whole lease: only renewals on the new owner kept it.
    std::thread::sleep(Duration::from_millis(6500));
    assert!(h.is_running(), "the holder stopped: {}", h.stderr_so_far());
    let pttl = c.node(to).pttl(&lock_key(&name));
    assert!(pttl > 0, "the lock is not on the new owner (PTTL {pttl})");
    s.touch("go");
    h.wait_for(Duration::from_secs(20)).assert_code(0);
    assert!(
        !c.node(to).exists(&lock_key(&name)),
        "released on the new owner"
    );
    let s = Scratch::new();
    let next = token_run(&c.url(from), &name, &s, &[]);
    assert!(
        next > token,
        "token {next} after the migration is not above {token}"
    );
}

#[test]
fn a_holder_keeps_its_lock_across_a_manual_failover() {
    let c = RedisCluster::start();
    let m = *masters(&c).first().unwrap();
    let r = c.replica_of(m);
    let name = name_on(&c, "failover", m);
    let s = Scratch::new();
    let (mut h, token) = start_holder(&c.url(m), &name, &s, &["--ttl", "3s"]);
    wait_until("the lock is replicated", WAIT, || {
        c.has_key(r, &lock_key(&name))
    });
    c.failover_to(r);
    std::thread::sleep(Duration::from_millis(3500));
    assert!(h.is_running(), "the holder stopped: {}", h.stderr_so_far());
    assert!(c.node(r).pttl(&lock_key(&name)) > 0);
    s.touch("go");
    h.wait_for(Duration::from_secs(20)).assert_code(0);
    let s = Scratch::new();
    let next = token_run(&c.url(m), &name, &s, &[]);
    assert!(
        next > token,
        "token {next} after the failover is not above {token}"
    );
    let fence: Option<String> = c.node(r).query(redis::cmd("GET").arg(fence_key(&name)));
    assert_eq!(
        fence,
        Some(next.to_string()),
        "the new master holds the counter"
    );
}

#[test]
fn a_killed_master_is_followed_to_its_promoted_replica() {
    let mut c = RedisCluster::start();
    let all: Vec<usize> = masters(&c).into_iter().collect();
    let (m, other) = (all[0], all[1]);
    let r = c.replica_of(m);
    let name = name_on(&c, "killed", m);
    // Through another master: the first MOVED tells lockrun it is in a Cluster.
    let url = c.url(other);
    let s = Scratch::new();
    let (mut h, token) = start_holder(&url, &name, &s, &["--ttl", "10s"]);
    wait_until("the lock is replicated", WAIT, || {
        c.has_key(r, &lock_key(&name))
    });
    c.kill(m);
    c.wait_master(r);
    // Past a renewal (every 3.3 s) on the promoted replica.
    std::thread::sleep(Duration::from_millis(4000));
    s.touch("go");
    let f = h.wait_for(Duration::from_secs(60));
    assert!(
        matches!(f.code, Some(0) | Some(124)),
        "the holder neither kept its lock nor was stopped by its deadline: {f:?}"
    );
    eprintln!("the holder across the kill: exit {:?}", f.code);
    let s = Scratch::new();
    let next = token_run(&url, &name, &s, &["--wait", "30s"]);
    assert!(
        next > token,
        "token {next} after the failover is not above {token}"
    );
    let fence: Option<String> = c.node(r).query(redis::cmd("GET").arg(fence_key(&name)));
    assert_eq!(fence, Some(next.to_string()));
}

#[test]
fn a_dead_first_seed_is_skipped() {
    let c = RedisCluster::start();
    let url = format!(
        "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
        closed_port(),
        c.node(1).port()
    );
    let s = Scratch::new();
    for m in masters(&c) {
        let name = name_on(&c, "seeded", m);
        let token = token_run(&url, &name, &s, &[]);
        let fence: Option<String> = c.node(m).query(redis::cmd("GET").arg(fence_key(&name)));
        assert_eq!(fence, Some(token.to_string()));
        admin("status", &url, &[&name]).assert_code(1);
    }
}

#[test]
fn nodes_of_one_cluster_are_never_a_redlock_quorum() {
    let c = RedisCluster::start();
    let s = Scratch::new();
    for name in ["job0", "job1", "job2"] {
        let mut cmd = lockrun();
        for m in masters(&c) {
            cmd.args(["--url", &c.url(m)]);
        }
        cmd.args([name, "--", "sh", "-c", r#"touch "$MARKER""#])
            .env("MARKER", s.path("marker"));
        let f = run(cmd);
        f.assert_failure(125);
        assert!(f.stderr.contains("Redis Cluster"), "{}", f.stderr);
        assert!(
            !s.exists("marker"),
            "{name} ran under a Redlock of one Cluster"
        );
    }
}

#[test]
fn a_semaphores_slots_live_on_the_names_master() {
    let c = RedisCluster::start();
    let m = *masters(&c).last().unwrap();
    let name = name_on(&c, "sem", m);
    let url = c.url(if m == 0 { 1 } else { 0 });
    let opts = ["--slots", "2", "--ttl", "30s"];
    let mut holders: Vec<(Running, Scratch)> = (0..2)
        .map(|_| {
            let s = Scratch::new();
            let (lr, _) = start_holder(&url, &name, &s, &opts);
            (lr, s)
        })
        .collect();
    assert!(c.node(m).exists(&slot_key(&name, 0)));
    assert!(c.node(m).exists(&slot_key(&name, 1)));
    assert!(c.node(m).exists(&limit_key(&name)));
    let s = Scratch::new();
    let mut third = lockrun_run(&url, &name, &opts, &sh(r#"touch "$MARKER""#));
    third.env("MARKER", s.path("marker"));
    run(third).assert_failure(75);
    assert!(!s.exists("marker"), "a third holder ran");
    let f = admin("status", &url, &["--slots", "2", &name]);
    f.assert_code(0);
    let f = admin("release", &url, &["--force", "--slots", "2", &name]);
    f.assert_code(0);
    for (lr, s) in &mut holders {
        s.touch("go");
        // Broken by the force: each finds out at its next renewal, or ends first.
        let f = lr.wait_for(Duration::from_secs(30));
        assert!(matches!(f.code, Some(0) | Some(124)), "{f:?}");
    }
    assert!(!c.node(m).exists(&slot_key(&name, 1)));
}

#[test]
fn a_frozen_master_is_left_for_its_promoted_replica() {
    let c = RedisCluster::start();
    let all: Vec<usize> = masters(&c).into_iter().collect();
    let (m, other) = (all[2], all[0]);
    let r = c.replica_of(m);
    let name = name_on(&c, "frozen", m);
    let url = c.url(other);
    let s = Scratch::new();
    let (mut h, token) = start_holder(&url, &name, &s, &["--ttl", "20s"]);
    wait_until("the lock is replicated", WAIT, || {
        c.has_key(r, &lock_key(&name))
    });
    // Frozen, not dead: the holder's renewal to it goes unanswered, and is abandoned.
    c.freeze(m);
    c.wait_master(r);
    // Past two renewals (every 6.7 s), each bounded by 6.7 s.
    std::thread::sleep(Duration::from_millis(14000));
    s.touch("go");
    let f = h.wait_for(Duration::from_secs(60));
    assert!(
        matches!(f.code, Some(0) | Some(124)),
        "the holder neither kept its lock nor was stopped by its deadline: {f:?}"
    );
    eprintln!("the holder across the freeze: exit {:?}", f.code);
    let s = Scratch::new();
    let next = token_run(&url, &name, &s, &["--wait", "30s"]);
    assert!(
        next > token,
        "token {next} after the failover is not above {token}"
    );
    c.thaw(m);
}

#[test]
fn every_master_is_checked_for_eviction() {
    let c = RedisCluster::start();
    let all: Vec<usize> = masters(&c).into_iter().collect();
    let (evicting, seed) = (all[1], all[0]);
    for (key, value) in [("maxmemory", "100mb"), ("maxmemory-policy", "allkeys-lru")] {
        let _: String = c
            .node(evicting)
            .query(redis::cmd("CONFIG").arg("SET").arg(key).arg(value));
    }
    let url = c.url(seed);
    let s = Scratch::new();
    // A name on a safe master runs; one on the evicting master is refused, naming it.
    token_run(&url, &name_on(&c, "safe", seed), &s, &[]);
    let name = name_on(&c, "evicted", evicting);
    let mut cmd = lockrun_run(&url, &name, &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    let at = format!("127.0.0.1:{}", c.node(evicting).port());
    assert!(
        f.stderr.contains(&at) && f.stderr.contains("allkeys-lru"),
        "{}",
        f.stderr
    );
    assert!(!s.exists("marker"));
    token_run(&url, &name, &s, &["--allow-eviction"]);
}
