//! What only the PostgreSQL backend has, end to end: the real binary against private
//! clusters of the tests' own (a fresh table in each; some with a password, TLS or a fake
//! clock): the lock table and its sequence, TLS,
//! authentication, errors, and expiry by the database's clock. The contract every
//! backend keeps is tested in the conformance suite.
//!
//! Beside it: `grants` (least-privilege roles, and the line of each missing
//! permission), `tls` (verified TLS, client certificates, and the line of each refused
//! set-up), `pgbouncer` (PostgreSQL through PgBouncer, in each pool mode), `hostile` (a server
//! that sends without end, or never answers), `records` (the record of each name's
//! last run).

mod grants;
mod hostile;
mod pgbouncer;
mod records;
mod tls;

use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// A command that records its pid and fencing token, then runs until killed.
const FOREVER: &str =
    r#"echo $LOCKRUN_FENCING_TOKEN > "$TOKEN"; echo $$ > "$PIDFILE"; exec sleep 600"#;

/// Starts a lockrun whose command runs until killed; returns it with the command's pid.
fn start_forever(t: &Table, name: &str, s: &Scratch, opts: &[&str]) -> (Running, i32) {
    let mut cmd = t.run(name, opts, &sh(FOREVER));
    cmd.env("TOKEN", s.path("token"))
        .env("PIDFILE", s.path("pid"));
    let r = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    (r, pid)
}

/// A definite loss found by renewing (another token in the row) stops the command soon
/// after, far sooner than the lease. (A deleted row is `release --force`, in the
/// conformance suite.)
#[test]
fn a_row_with_another_token_stops_the_command_at_once() {
    let t = Table::private();
    let s = Scratch::new();
    let (mut holder, pid) =
        start_forever(&t, "job", &s, &["--ttl", "3s", "--renew-every", "300ms"]);
    let at = Instant::now();
    t.sql(
        "job",
        "UPDATE $T SET token = 'someone-else' WHERE name = $K",
    );
    let f = holder.wait();
    f.assert_failure(124);
    assert!(is_dead(pid), "the command survived the loss");
    assert!(
        at.elapsed() < Duration::from_millis(1500),
        "the loss took {:?} to stop the command",
        at.elapsed()
    );
}

#[test]
fn fencing_tokens_increase_across_runs_releases_and_lost_rows() {
    let t = Table::private();
    let token = || {
        let f = run(t.run("job", &[], &sh("echo $LOCKRUN_FENCING_TOKEN")));
        parse_token(f.assert_code(0).stdout.trim())
    };
    let mut seen = vec![token(), token()];
    // Every row gone (an operator's DELETE): the sequence still knows.
    t.sql("job", "DELETE FROM $T RETURNING 1");
    seen.push(token());
    // The same table shared by another lock name does not reset this one.
    run(t.run("other", &[], &["true"])).assert_code(0);
    seen.push(token());
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {seen:?}"
    );
}

#[test]
fn status_of_a_table_that_does_not_exist_yet_is_free() {
    let t = Table::private();
    let (code, v) = t.status_json("job");
    assert_eq!(
        (code, &v["held"]),
        (Some(1), &serde_json::Value::Bool(false))
    );
    assert_eq!(
        t.db.value(&format!("SELECT to_regclass('{}')::text", t.name))
            .as_deref(),
        Some("")
    );
}

#[test]
fn an_unreachable_server_exits_125_without_running_the_command() {
    let s = Scratch::new();
    let port = closed_port();
    let url = format!("postgres://lockrun:s3cret-pw@127.0.0.1:{port}/test?sslmode=disable");
    let mut cmd = lockrun_run(
        &url,
        "job",
        &[],
        &["touch", s.path("ran").to_str().unwrap()],
    );
    cmd.args(["--pg-table", "lockrun_never"]);
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("ran"), "the command ran without the lock");
    let line = f.lockrun_line().unwrap();
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(
        !f.stderr.contains("s3cret"),
        "the password leaked: {}",
        f.stderr
    );
    assert!(
        !f.stderr.contains("postgres://"),
        "the URL leaked: {}",
        f.stderr
    );
}

#[test]
fn a_table_in_a_missing_schema_exits_125() {
    let t = Table::private();
    let s = Scratch::new();
    let mut cmd = lockrun();
    cmd.args([
        "--url",
        &t.url,
        "--pg-table",
        "no_such_schema_xyz.locks",
        "job",
        "--",
    ])
    .args(["touch", s.path("ran").to_str().unwrap()]);
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("ran"));
    assert!(f.stderr.contains("no_such_schema_xyz"), "{}", f.stderr);
}

#[test]
fn a_table_that_is_not_a_lock_table_exits_125() {
    let t = Table::private();
    let s = Scratch::new();
    t.db.exec(&format!("CREATE TABLE {} (id int)", t.name));
    let f = run(t.run("job", &[], &["touch", s.path("ran").to_str().unwrap()]));
    f.assert_failure(125);
    assert!(!s.exists("ran"));
    assert!(f.stderr.contains(&t.name), "{}", f.stderr);
}

#[test]
fn many_first_runs_create_the_table_once() {
    let t = Table::private();
    let names: Vec<String> = (0..6).map(|i| format!("job{i}")).collect();
    let mut runs: Vec<Running> = names
        .iter()
        .map(|n| spawn(t.run(n, &[], &["true"])))
        .collect();
    for r in &mut runs {
        r.wait().assert_code(0);
    }
}

#[test]
fn sslmode_require_encrypts_the_connection() {
    let tls = TlsFiles::generate(false);
    let t = PrivatePg::start_tls(&tls).into_table();
    let s = Scratch::new();
    let url = t.url.replace("sslmode=disable", "sslmode=require");
    let mut cmd = lockrun();
    cmd.args([
        "--url",
        &url,
        "--pg-table",
        &t.name,
        "--renew-every",
        "200ms",
    ])
    .args(["job", "--"])
    .args(sh(HOLD));
    let (mut holder, _) = hold(cmd, &s);
    // lockrun's session (its last query is a step's COMMIT: every step is a
    // transaction).
    let ssl = t.db.value(
        "SELECT bool_and(s.ssl)::text FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'lockrun' AND a.pid <> pg_backend_pid()",
    );
    s.touch("go");
    holder.wait().assert_code(0);
    assert_eq!(
        ssl.as_deref(),
        Some("true"),
        "lockrun's session was not encrypted"
    );
}

#[test]
fn sslmode_require_against_a_server_without_tls_exits_125() {
    let pg = PrivatePg::start();
    let url = pg.url().replace("sslmode=disable", "sslmode=require");
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &url,
        "job",
        &[],
        &["touch", s.path("ran").to_str().unwrap()],
    );
    cmd.args(["--pg-table", "locks"]);
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("ran"));
    assert!(f.stderr.contains("TLS"), "{}", f.stderr);
}

#[test]
fn a_wrong_password_exits_125_and_is_never_printed() {
    let pg = PrivatePg::start_with(&[], &[]);
    let admin = Db::connect(&pg.url());
    admin.exec("CREATE ROLE lockrun LOGIN PASSWORD 'right-pw'");
    let hba = pg.dir().join("data/pg_hba.conf");
    std::fs::write(&hba, "host all all 127.0.0.1/32 scram-sha-256\n").unwrap();
    admin.exec("SELECT pg_reload_conf()");
    thread::sleep(Duration::from_millis(300));
    let s = Scratch::new();
    let url = format!(
        "postgres://lockrun@127.0.0.1:{}/postgres?sslmode=disable",
        pg.port()
    );
    let mut cmd = lockrun_run(
        &url,
        "job",
        &["--pg-table", "locks"],
        &["touch", s.path("ran").to_str().unwrap()],
    );
    cmd.env("LOCKRUN_PASSWORD", "wrong-pw");
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("ran"));
    assert!(f.stderr.contains("authentication"), "{}", f.stderr);
    assert!(
        !f.stderr.contains("wrong-pw"),
        "the password leaked: {}",
        f.stderr
    );
    // The right one works, and lockrun may not create tables there: a clear refusal.
    let mut cmd = lockrun_run(&url, "job", &["--pg-table", "locks"], &["true"]);
    cmd.env("LOCKRUN_PASSWORD", "right-pw");
    admin.exec("REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    let f = run(cmd);
    f.assert_failure(125);
    assert!(f.stderr.contains("create the lock table"), "{}", f.stderr);
}

#[test]
fn the_database_clock_decides_expiry() {
    let clock = FakeClock::new();
    let env = clock.env();
    // The server runs as another user: let it read the clock's timestamp file.
    for (k, v) in &env {
        if k == "FAKETIME_TIMESTAMP_FILE" {
            let dir = std::path::Path::new(v).parent().unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    let pg = PrivatePg::start_with(&env, &[]);
    let t = Table::on(&pg.url());
    let s = Scratch::new();
    let (mut holder, pid) = start_forever(&t, "job", &s, &["--ttl", "30s", "--renew-every", "1s"]);
    run(t.run("job", &[], &["true"])).assert_code(75);
    // Only the database's clock moves: past the lease, which is then expired there,
    // although no client has seen 30 s pass.
    clock.jump_forward(Duration::from_secs(60));
    wait_until("the database sees the lease expired", WAIT, || {
        !t.held("job")
    });
    let f = run(t.run("job", &[], &["true"]));
    f.assert_code(0);
    // The first holder's next renewal finds the lock taken: a definite loss.
    holder.wait().assert_failure(124);
    assert!(is_dead(pid));
}

/// The fencing token of one run of `name` on `t`.
fn token_on(t: &Table, name: &str) -> u128 {
    let f = run(t.run(name, &[], &sh("echo $LOCKRUN_FENCING_TOKEN")));
    parse_token(f.assert_code(0).stdout.trim())
}

#[test]
fn rows_of_names_unused_for_a_day_go_and_tokens_keep_increasing() {
    let t = Table::private();
    let mut seen = vec![
        token_on(&t, "job"),
        token_on(&t, "recent"),
        token_on(&t, "other"),
    ];
    // "job" was last released 25 hours ago, "recent" 23 hours ago.
    t.sql(
        "job",
        "UPDATE $T SET expires_at = now() - interval '25 hours' WHERE name = $K RETURNING 1",
    );
    t.sql(
        "recent",
        "UPDATE $T SET expires_at = now() - interval '23 hours' WHERE name = $K RETURNING 1",
    );
    // The rows of locks (not the run records, which last a week: `records`).
    let rows = |t: &Table| {
        t.db.column(&format!(
            "SELECT name FROM {} WHERE name NOT LIKE '%#last' ORDER BY name",
            t.name
        ))
    };
    // A name that has a row deletes nothing (that statement scans no other row).
    seen.push(token_on(&t, "other"));
    assert!(rows(&t).contains(&Table::key("job")), "{:?}", rows(&t));
    // A new name deletes the rows whose lease ended more than a day ago, and no other.
    seen.push(token_on(&t, "fresh"));
    let keys: Vec<String> = ["fresh", "other", "recent"].map(Table::key).into();
    assert_eq!(rows(&t), keys);
    // The name whose row went gets a token larger than every one before.
    seen.push(token_on(&t, "job"));
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {seen:?}"
    );
}

/// A command for a semaphore's holder: writes "SLOT TOKEN" to `$STARTED`, then runs
/// until `$GO` exists.
const HOLD_SLOT: &str = r#"echo "$LOCKRUN_SLOT $LOCKRUN_FENCING_TOKEN" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// Starts a lockrun of `name` with `opts` holding a slot until `s.touch("go")`; returns
/// it with its slot and fencing token once its command runs.
fn hold_slot(t: &Table, name: &str, s: &Scratch, opts: &[&str]) -> (Running, u32, u128) {
    let mut cmd = t.run(name, opts, &sh(HOLD_SLOT));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let r = spawn(cmd);
    let line = wait_line(&s.path("started"));
    let (slot, token) = line.trim().split_once(' ').expect("SLOT TOKEN");
    (r, slot.parse().expect("a slot"), parse_token(token))
}

/// The rows of `t`: `(name, token, live)`, by name.
fn rows(t: &Table) -> Vec<(String, String, bool)> {
    let sql = format!(
        "SELECT name || ' ' || token || ' ' || (expires_at > now())::text FROM {} \
         ORDER BY name",
        t.name
    );
    t.db.column(&sql)
        .iter()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            (f[0].to_owned(), f[1].to_owned(), f[2] == "true")
        })
        .collect()
}

/// Slot 0 of a semaphore is the plain lock's row; slot i is the row `KEY#i`; each
/// holder's token records N. A full semaphore is busy; a freed slot is the one taken
/// next, whatever the other slots.
#[test]
fn a_semaphores_slots_are_rows_of_their_own() {
    let t = Table::private();
    let slots = ["--slots", "3"];
    let scratch: Vec<Scratch> = (0..3).map(|_| Scratch::new()).collect();
    let mut holders = Vec::new();
    for (i, s) in scratch.iter().enumerate() {
        let (r, slot, token) = hold_slot(&t, "job", s, &slots);
        assert_eq!(slot, i as u32, "not the lowest free slot");
        holders.push((r, token));
    }
    let stored = rows(&t);
    let keys: Vec<String> = stored.iter().map(|r| r.0.clone()).collect();
    let limit = "lockrun:{job}#slots";
    assert_eq!(
        keys,
        ["lockrun:{job}", "lockrun:{job}#1", "lockrun:{job}#2", limit]
    );
    for (name, token, live) in &stored {
        assert!(*live, "{name} is not held");
        let (hex, n) = token.split_once('/').expect("a token with its N");
        assert_eq!(n, "3", "{name}: {token}");
        match name.as_str() {
            name if name == limit => assert_eq!(hex, ""),
            _ => assert!(hex.len() >= 16 && hex.bytes().all(|b| b.is_ascii_hexdigit())),
        }
    }
    // The limit row lasts as long as the last lease of a slot.
    let covers = t.db.value(&format!(
        "SELECT (l.expires_at >= max(s.expires_at))::text FROM {0} l, {0} s \
         WHERE l.name = '{limit}' AND s.name LIKE 'lockrun:{{job}}%' AND s.name <> l.name \
         GROUP BY l.expires_at",
        t.name
    ));
    assert_eq!(covers.as_deref(), Some("true"));
    let tokens: Vec<u128> = holders.iter().map(|h| h.1).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // Full: busy, without running the command.
    let busy = run(t.run("job", &slots, &["true"]));
    busy.assert_code(75);
    let (code, v) = t.status_json_with("job", &slots);
    assert_eq!(code, Some(0));
    let held: Vec<(u64, u64)> = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["slot"].as_u64().unwrap(),
                h["fencing_token"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(u64, u64)> = tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| (i as u64, t as u64))
        .collect();
    assert_eq!(held, expected);
    // Slot 1 freed: the next holder gets slot 1, with a larger token.
    scratch[1].touch("go");
    holders[1].0.wait().assert_code(0);
    let s = Scratch::new();
    let (mut next, slot, token) = hold_slot(&t, "job", &s, &slots);
    assert_eq!(slot, 1);
    assert!(token > tokens[2], "{token} after {tokens:?}");
    s.touch("go");
    next.wait().assert_code(0);
    for (s, (mut r, _)) in scratch.iter().zip(holders) {
        s.touch("go");
        let f = r.wait();
        assert!(f.code == Some(0), "{:?}", f.stderr);
    }
    // Released rows stay, free (empty token, expired); the last run's record beside
    // them is no holder's.
    let (records, locks): (Vec<_>, Vec<_>) = rows(&t)
        .into_iter()
        .partition(|(name, _, _)| name.ends_with("#last"));
    assert!(locks
        .iter()
        .all(|(_, token, live)| token.is_empty() && !live));
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(records[0].1.starts_with("run:") && records[0].2);
}

/// Two N for one name are refused (125) in both directions, before any command runs:
/// a plain holder against a semaphore, a semaphore's holder against a plain lock and
/// against another N.
#[test]
fn holders_with_another_slots_are_refused() {
    let t = Table::private();
    let s = Scratch::new();
    let ran = s.path("ran");
    let touch = ["touch", ran.to_str().unwrap()];
    let (mut plain, _, _) = hold_slot(&t, "job", &s, &[]);
    let f = run(t.run("job", &["--slots", "2"], &touch));
    f.assert_failure(125);
    assert!(
        f.stderr.contains("a plain lock (--slots 1), not --slots 2"),
        "{}",
        f.stderr
    );
    s.touch("go");
    plain.wait().assert_code(0);

    let s2 = Scratch::new();
    let (mut sem, slot, _) = hold_slot(&t, "job", &s2, &["--slots", "2"]);
    assert_eq!(slot, 0);
    for (opts, says) in [
        (&[][..], "--slots 2, not a plain lock (--slots 1)"),
        (&["--slots", "3"][..], "--slots 2, not --slots 3"),
    ] {
        let f = run(t.run("job", opts, &touch));
        f.assert_failure(125);
        assert!(f.stderr.contains(says), "{opts:?}: {}", f.stderr);
    }
    assert!(!s.exists("ran"), "a refused run ran its command");
    s2.touch("go");
    sem.wait().assert_code(0);
    // Once free, any N may take the name.
    run(t.run("job", &["--slots", "3"], &["true"])).assert_code(0);
}

/// A row written by a lockrun from before semaphores (a token without `/N`) is a plain
/// lock to a semaphore: refused while it is live, and shown as a plain lock's holder.
#[test]
fn a_row_of_an_older_lockrun_is_a_plain_lock() {
    let t = Table::private();
    run(t.run("job", &[], &["true"])).assert_code(0);
    t.sql(
        "job",
        "UPDATE $T SET token = '0123456789abcdef0123456789abcdef', host = 'old-host', \
         pid = 4242, expires_at = now() + interval '30 seconds' WHERE name = $K RETURNING 1",
    );
    let f = run(t.run("job", &["--slots", "4"], &["true"]));
    f.assert_failure(125);
    assert!(
        f.stderr.contains("a plain lock (--slots 1)"),
        "{}",
        f.stderr
    );
    // status sees a plain lock's holder in slot 0: shown without --slots, refused
    // with another N.
    let (code, v) = t.status_json("job");
    assert_eq!(code, Some(0));
    let holders = v["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{v}");
    assert_eq!(
        (&holders[0]["slot"], &holders[0]["host"], &holders[0]["pid"]),
        (&0.into(), &"old-host".into(), &4242.into())
    );
    let f = t.admin("status", &["--slots", "4", "job"]);
    f.assert_failure(125);
    assert!(
        f.stderr.contains("a plain lock (--slots 1)"),
        "{}",
        f.stderr
    );
    // Broken by force, it is free for the semaphore.
    t.admin("release", &["--force", "job"]).assert_code(0);
    let f = run(t.run("job", &["--slots", "4"], &sh("echo $LOCKRUN_SLOT")));
    assert_eq!(f.assert_code(0).stdout.trim(), "0");
}

/// Many lockruns started at once on a free semaphore of 2, without --wait: exactly two
/// take it, in slots 0 and 1; every other one finds it busy (75).
#[test]
fn concurrent_acquirers_take_distinct_slots() {
    let t = Table::private();
    // The table exists before the race, so that the race is on the slots.
    run(t.run("warm-up", &[], &["true"])).assert_code(0);
    let scratch: Vec<Scratch> = (0..8).map(|_| Scratch::new()).collect();
    let go = Scratch::new();
    let mut runs: Vec<Running> = scratch
        .iter()
        .map(|s| {
            let mut cmd = t.run("job", &["--slots", "2"], &sh(HOLD_SLOT));
            cmd.env("STARTED", s.path("started"))
                .env("GO", go.path("go"));
            spawn(cmd)
        })
        .collect();
    let n = runs.len();
    wait_until("every run but the holders ends", WAIT, || {
        runs.iter_mut()
            .map(|r| !r.is_running())
            .filter(|&ended| ended)
            .count()
            == n - 2
    });
    let mut slots: Vec<u32> = scratch
        .iter()
        .filter(|s| s.exists("started"))
        .map(|s| {
            let line = wait_line(&s.path("started"));
            line.split(' ').next().unwrap().parse().unwrap()
        })
        .collect();
    slots.sort();
    assert_eq!(slots, [0, 1]);
    go.touch("go");
    let codes: Vec<Option<i32>> = runs.iter_mut().map(|r| r.wait().code).collect();
    assert_eq!(
        codes.iter().filter(|&&c| c == Some(0)).count(),
        2,
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|&&c| c == Some(75)).count(),
        6,
        "{codes:?}"
    );
}

/// Waiters on a semaphore of 2 under contention: never more than two inside, never two
/// on one slot, every one runs, tokens increase with each start.
#[test]
fn waiters_on_a_semaphore_never_share_a_slot() {
    let t = Table::private();
    run(t.run("warm-up", &[], &["true"])).assert_code(0);
    let s = Scratch::new();
    let section = r#"
        mkdir "$DIR/slot$LOCKRUN_SLOT" 2>/dev/null || echo "slot $LOCKRUN_SLOT shared" >> "$DIR/bad"
        echo "S $(date +%s%N) $LOCKRUN_SLOT" >> "$DIR/hist"
        sleep 0.15
        echo "E $(date +%s%N) $LOCKRUN_SLOT" >> "$DIR/hist"
        rmdir "$DIR/slot$LOCKRUN_SLOT"
    "#;
    let mut runs: Vec<Running> = (0..8)
        .map(|_| {
            let mut cmd = t.run("job", &["--slots", "2", "--wait", "60s"], &sh(section));
            cmd.env("DIR", s.path("."));
            spawn(cmd)
        })
        .collect();
    for r in &mut runs {
        r.wait().assert_code(0);
    }
    assert!(!s.exists("bad"), "{}", s.read("bad"));
    // Replay the history: at most two inside at any time.
    let mut events: Vec<(u128, bool)> = s
        .read("hist")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[1].parse().unwrap(), f[0] == "S")
        })
        .collect();
    assert_eq!(events.len(), 16);
    events.sort();
    let mut inside = 0;
    for (_, start) in events {
        inside = if start { inside + 1 } else { inside - 1 };
        assert!(inside <= 2, "{inside} inside at once");
    }
}

/// The backend as lockrun opens it for `--slots slots` on `t`, in this process.
fn open(t: &Table, slots: u32) -> lockrun::backend::AnyBackend {
    use clap::Parser;
    use lockrun::cli::{Cli, Command};
    let n = slots.to_string();
    let argv = [
        "lockrun",
        "status",
        "--url",
        &t.url,
        "--pg-table",
        &t.name,
        "--slots",
        &n,
        "job",
    ];
    let Command::Status(args) = Cli::try_parse_from(argv).unwrap().command else {
        unreachable!("parsed as status")
    };
    let config = lockrun::config::BackendConfig::from_args(&args.backend, None).unwrap();
    lockrun::backend::AnyBackend::open(&config, false)
}

/// A release by a lockrun that never read its acquisition's answer (the acquisition
/// timed out, its token is given back) finds the token's slot among all N: the slot
/// frees at once, not at the lease's expiry. Only that token's row.
#[test]
fn a_token_whose_answer_was_lost_is_released_from_its_slot() {
    use lockrun::backend::{Acquire, AcquireRequest, Backend, BackendError, Release};
    let t = Table::private();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let request = |token: &str| AcquireRequest {
        token: token.to_owned(),
        ttl: Duration::from_secs(60),
        host: "test-host".to_owned(),
        pid: 7,
    };
    let (first, second) = ("a".repeat(32), "b".repeat(32));
    rt.block_on(async {
        let taken = open(&t, 3).acquire("job", &request(&first)).await.unwrap();
        assert!(
            matches!(taken, Acquire::Acquired { slot: 0, .. }),
            "{taken:?}"
        );
        // The acquisition whose answer is "lost": its backend is gone with it.
        let taken = open(&t, 3).acquire("job", &request(&second)).await.unwrap();
        assert!(
            matches!(taken, Acquire::Acquired { slot: 1, .. }),
            "{taken:?}"
        );
        let other = open(&t, 3);
        assert_eq!(
            other
                .release("job", &"c".repeat(32), Release::Now, None)
                .await,
            Err(BackendError::NotOwner)
        );
        other
            .release("job", &second, Release::Now, None)
            .await
            .unwrap();
        let holders = open(&t, 3).inspect("job").await.unwrap();
        let slots: Vec<u32> = holders.iter().map(|h| h.slot).collect();
        assert_eq!(slots, [0]);
        assert_eq!((holders[0].slots, holders[0].pid), (3, 7));
        // Renewal too finds a token's slot without its acquisition's answer.
        let other = open(&t, 3);
        other
            .renew("job", &first, Duration::from_secs(90))
            .await
            .unwrap();
        assert_eq!(
            other.renew("job", &second, Duration::from_secs(90)).await,
            Err(BackendError::NotOwner)
        );
    });
    assert_eq!(
        t.sql("job", "SELECT token FROM $T WHERE name = $K || '#1'")
            .as_deref(),
        Some("")
    );
    let left = t.sql(
        "job",
        "SELECT (expires_at - now() > interval '80 seconds')::text FROM $T WHERE name = $K",
    );
    assert_eq!(left.as_deref(), Some("true"), "slot 0 was not renewed");
}

/// `--hold-at-least` keeps a semaphore's slot after its command ended, then lets it
/// expire: the slot is taken again only after that.
#[test]
fn hold_at_least_keeps_a_slot() {
    let t = Table::private();
    let s = Scratch::new();
    let slots = ["--slots", "2"];
    let (mut first, slot, _) = hold_slot(&t, "job", &s, &slots);
    assert_eq!(slot, 0);
    let opts = ["--slots", "2", "--hold-at-least", "3s"];
    let f = run(t.run("job", &opts, &sh("echo $LOCKRUN_SLOT")));
    assert_eq!(f.assert_code(0).stdout.trim(), "1");
    run(t.run("job", &slots, &["true"])).assert_code(75);
    let kept = t.sql(
        "job",
        "SELECT (expires_at > now())::text FROM $T WHERE name = $K || '#1'",
    );
    assert_eq!(kept.as_deref(), Some("true"));
    let at = Instant::now();
    let f = run(t.run(
        "job",
        &["--slots", "2", "--wait", "20s"],
        &sh("echo $LOCKRUN_SLOT"),
    ));
    assert_eq!(f.assert_code(0).stdout.trim(), "1");
    assert!(at.elapsed() > Duration::from_secs(1), "{:?}", at.elapsed());
    s.touch("go");
    first.wait().assert_code(0);
}

/// How many waiters of lock "job" have a live place in its queue row (`KEY#queue`:
/// `id:until_ms` entries).
fn queue(t: &Table) -> u32 {
    let sql = "SELECT count(*) FROM $T q, unnest(string_to_array(q.token, ' ')) e(v) \
               WHERE q.name = $K || '#queue' \
               AND split_part(e.v, ':', 2)::bigint > (extract(epoch FROM now()) * 1000)::bigint";
    t.sql("job", sql).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A lockrun whose command runs [`HOLD_SLOT`] in its scratch directory.
type Run = (Running, Scratch);

/// Two holders of a semaphore of 2, then two waiters, one after the other: returns
/// them (holders, waiters) once the queue row holds both.
fn full_semaphore_with_two_waiters(t: &Table) -> (Vec<Run>, Vec<Run>) {
    let opts = ["--slots", "2", "--ttl", "30s", "--renew-every", "1s"];
    let holders: Vec<Run> = (0..2)
        .map(|_| {
            let s = Scratch::new();
            let (r, _, _) = hold_slot(t, "job", &s, &opts);
            (r, s)
        })
        .collect();
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let s = Scratch::new();
        let opts = ["-v", "--slots", "2", "--wait", "60s", "--ttl", "30s"];
        let mut cmd = t.run("job", &opts, &sh(HOLD_SLOT));
        cmd.env("STARTED", s.path("started"))
            .env("GO", s.path("go"));
        let mut r = spawn(cmd);
        wait_until("the waiter waits", WAIT, || {
            r.stderr_so_far().contains("waiting up to")
        });
        waiters.push((r, s));
    }
    wait_until("both waiters are in the queue", WAIT, || queue(t) == 2);
    (holders, waiters)
}

/// The head of a queue that stops trying (frozen) loses its place after
/// `WAITER_ALIVE` (6 s): the waiter behind it takes the slot freed meanwhile, long
/// before its --wait runs out.
#[test]
fn a_frozen_head_of_the_queue_lets_the_next_waiter_on() {
    let t = Table::private();
    let (mut holders, mut waiters) = full_semaphore_with_two_waiters(&t);
    waiters[0].0.signal(Signal::SIGSTOP);
    let freed = Instant::now();
    holders[0].1.touch("go");
    holders[0].0.wait().assert_code(0);
    wait_until("the second waiter runs", WAIT, || {
        waiters[1].1.exists("started")
    });
    let took = freed.elapsed();
    assert!(took < Duration::from_secs(12), "took {took:?}");
    waiters[0].0.signal(Signal::SIGCONT);
    for (r, s) in holders.iter_mut().chain(waiters.iter_mut()) {
        s.touch("go");
        r.wait().assert_code(0);
    }
}

/// A killed head of the queue loses its place once it lapses (`WAITER_ALIVE`, 6 s);
/// then the next waiter takes the next slot freed at once.
#[test]
fn a_killed_head_of_the_queue_lets_the_next_waiter_on() {
    let t = Table::private();
    let (mut holders, mut waiters) = full_semaphore_with_two_waiters(&t);
    waiters[0].0.signal(Signal::SIGKILL);
    waiters[0].0.wait();
    wait_until("the killed waiter's place lapses", WAIT, || queue(&t) == 1);
    let freed = Instant::now();
    holders[1].1.touch("go");
    holders[1].0.wait().assert_code(0);
    // The whole line: the file exists before `echo` has written into it.
    let slot = wait_line(&waiters[1].1.path("started"));
    assert!(
        freed.elapsed() < Duration::from_secs(2),
        "{:?}",
        freed.elapsed()
    );
    assert_eq!(
        slot.split(' ').next(),
        Some("1"),
        "not the slot freed: {slot}"
    );
    for (r, s) in [&mut holders[0], &mut waiters[1]] {
        s.touch("go");
        r.wait().assert_code(0);
    }
}

/// A waiter behind the head gives up when its --wait runs out (75), not later.
#[test]
fn a_queued_waiter_gives_up_when_its_wait_runs_out() {
    let t = Table::private();
    let (mut holders, mut waiters) = full_semaphore_with_two_waiters(&t);
    let at = Instant::now();
    let f = run(t.run("job", &["--slots", "2", "--wait", "1500ms"], &["true"]));
    f.assert_failure(75);
    let took = at.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(5),
        "gave up after {took:?}"
    );
    assert_eq!(queue(&t), 2, "the queue changed");
    for (r, s) in holders.iter_mut().chain(waiters.iter_mut()) {
        s.touch("go");
        r.wait().assert_code(0);
    }
}

/// The limit row (`KEY#slots`): a holder of slot 1 alone refuses a plain run through
/// it; a renewal writes it again if it went; `--hold-at-least` of the last holder
/// makes it end with that holder's kept lease, not with the lease before.
#[test]
fn the_limit_row_follows_the_holders_leases() {
    let t = Table::private();
    let limit = |t: &Table| {
        t.sql(
            "job",
            "SELECT token || ' ' || (expires_at > now())::text FROM $T WHERE name = $K || '#slots'",
        )
    };
    let opts = ["--slots", "2", "--ttl", "30s", "--renew-every", "200ms"];
    let (s0, s1) = (Scratch::new(), Scratch::new());
    let (mut first, _, _) = hold_slot(&t, "job", &s0, &opts);
    let kept = [&opts[..], &["--hold-at-least", "1500ms"]].concat();
    let (mut second, slot, _) = hold_slot(&t, "job", &s1, &kept);
    assert_eq!(slot, 1);
    s0.touch("go");
    first.wait().assert_code(0);
    assert_eq!(limit(&t).as_deref(), Some("/2 true"));
    t.sql(
        "job",
        "DELETE FROM $T WHERE name = $K || '#slots' RETURNING 1",
    );
    wait_until("a renewal writes the limit row again", WAIT, || {
        limit(&t).as_deref() == Some("/2 true")
    });
    let f = run(t.run("job", &[], &["true"]));
    f.assert_failure(125);
    assert!(
        f.stderr.contains("--slots 2, not a plain lock"),
        "{}",
        f.stderr
    );
    s1.touch("go");
    second.wait().assert_code(0);
    let same = t.sql(
        "job",
        "SELECT (l.expires_at = s.expires_at)::text FROM $T l, $T s \
         WHERE l.name = $K || '#slots' AND s.name = $K || '#1'",
    );
    assert_eq!(
        same.as_deref(),
        Some("true"),
        "the limit row outlives the kept slot"
    );
    wait_until("the kept slot ends", WAIT, || {
        limit(&t).as_deref() == Some("/2 false")
    });
    run(t.run("job", &[], &["true"])).assert_code(0);
}
