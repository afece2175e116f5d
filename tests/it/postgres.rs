//! The PostgreSQL backend end to end: the real binary against the machine's server on
//! 127.0.0.1:5432 (a fresh table per test) and against private clusters that a test kills
//! or puts on a fake clock.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;

/// A command that records it started, then runs until `$GO` exists.
const HOLD: &str = r#"touch "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// A command that records its pid and fencing token, then runs until killed.
const FOREVER: &str =
    r#"echo $LOCKRUN_FENCING_TOKEN > "$TOKEN"; echo $$ > "$PIDFILE"; exec sleep 600"#;

/// Starts a lockrun holding `name` until the scratch file "go" exists; returns once its
/// command runs.
fn start_holder(t: &Table, name: &str, s: &Scratch, opts: &[&str]) -> Running {
    let mut cmd = t.run(name, opts, &sh(HOLD));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let holder = spawn(cmd);
    wait_until("the holder's command started", WAIT, || s.exists("started"));
    holder
}

/// Starts a lockrun whose command runs until killed; returns it with the command's pid.
fn start_forever(t: &Table, name: &str, s: &Scratch, opts: &[&str]) -> (Running, i32) {
    let mut cmd = t.run(name, opts, &sh(FOREVER));
    cmd.env("TOKEN", s.path("token"))
        .env("PIDFILE", s.path("pid"));
    let r = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    (r, pid)
}

#[test]
fn runs_the_command_with_a_fencing_token_and_returns_its_status() {
    let t = Table::shared();
    let f = run(t.run(
        "job",
        &[],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN $LOCKRUN_LOCK_NAME"; exit 3"#),
    ));
    f.assert_code(3);
    let (token, name) = f.stdout.trim().split_once(' ').expect("token and name");
    parse_token(token);
    assert_eq!(name, "job");
    assert!(
        !t.held("job"),
        "the lock must be free at once after the run"
    );
    t.admin("status", &["job"]).assert_code(1);
}

#[test]
fn a_busy_lock_exits_75_without_running_the_command() {
    let t = Table::shared();
    let s = Scratch::new();
    let mut holder = start_holder(&t, "job", &s, &[]);
    let f = run(t.run("job", &[], &["touch", s.path("ran").to_str().unwrap()]));
    f.assert_failure(75);
    assert!(
        !s.exists("ran"),
        "the command ran although the lock was busy"
    );
    assert!(
        f.stderr.contains(&hostname()) && f.stderr.contains(&holder.pid().to_string()),
        "the busy line names the holder: {}",
        f.stderr
    );
    run(t.run("job", &["--conflict-exit-code", "9"], &["true"])).assert_code(9);
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn a_waiter_starts_within_a_second_of_the_release() {
    let t = Table::shared();
    let s = Scratch::new();
    let mut holder = start_holder(&t, "job", &s, &[]);
    let mut waiter = spawn(t.run(
        "job",
        &["--wait", "30s"],
        &["touch", s.path("ran").to_str().unwrap()],
    ));
    // Let the waiter find the lock busy and start listening.
    thread::sleep(Duration::from_millis(500));
    assert!(!s.exists("ran"), "the waiter ran while the lock was held");
    let released = Instant::now();
    s.touch("go");
    holder.wait().assert_code(0);
    wait_until("the waiter's command ran", WAIT, || s.exists("ran"));
    let handoff = released.elapsed();
    waiter.wait().assert_code(0);
    // The holder's lease had 30 s left and a waiter re-checks every 2 s: only the
    // release notification can make this fast.
    assert!(
        handoff < Duration::from_secs(1),
        "the waiter started {handoff:?} after the release"
    );
}

#[test]
fn contending_runs_never_overlap_and_tokens_increase() {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 8;
    let t = Table::shared();
    let s = Scratch::new();
    // Each critical section claims a directory (mkdir fails if another command is inside)
    // and logs its start and end (wall clock, ns) with its token.
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
                    let mut cmd = t.run("job", &["--wait", "60s"], &sh(script));
                    cmd.env("INSIDE", s.path("inside"))
                        .env("BAD", s.path("bad"))
                        .env("HIST", s.path("hist"));
                    spawn(cmd).wait_for(Duration::from_secs(90)).assert_code(0);
                }
            });
        }
    });
    assert_eq!(s.read("bad"), "", "two commands were inside at once");
    let mut sections: HashMap<u128, (u128, u128)> = HashMap::new();
    for line in s.read("hist").lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (at, token): (u128, u128) = (f[1].parse().unwrap(), parse_token(f[2]));
        let entry = sections.entry(token).or_insert((0, 0));
        match f[0] {
            "S" => entry.0 = at,
            _ => entry.1 = at,
        }
    }
    assert_eq!(
        sections.len(),
        WORKERS * ROUNDS,
        "one token per acquisition"
    );
    let mut by_start: Vec<(u128, (u128, u128))> = sections.into_iter().collect();
    by_start.sort_by_key(|(_, (start, _))| *start);
    for pair in by_start.windows(2) {
        let ((t1, (_, end1)), (t2, (start2, _))) = (pair[0], pair[1]);
        assert!(end1 <= start2, "sections of tokens {t1} and {t2} overlap");
        assert!(t1 < t2, "token {t2} came after {t1}: tokens must increase");
    }
}

#[test]
fn renewal_keeps_a_command_running_longer_than_the_ttl() {
    let t = Table::shared();
    let started = Instant::now();
    let f = run(t.run("job", &["--ttl", "1s"], &["sleep", "3"]));
    f.assert_code(0);
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert!(
        !f.stderr.contains("renew_failed") && !f.stderr.contains("could not renew"),
        "{}",
        f.stderr
    );
}

/// Runs a holder with a 3 s lease renewed every 300 ms, applies `fault` to its row, and
/// checks the command is stopped soon after (status 124), far sooner than the lease.
fn definite_loss_stops_the_command(fault: &str) {
    let t = Table::shared();
    let s = Scratch::new();
    let (mut holder, pid) =
        start_forever(&t, "job", &s, &["--ttl", "3s", "--renew-every", "300ms"]);
    let at = Instant::now();
    t.sql("job", fault);
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
fn a_deleted_row_stops_the_command_at_once() {
    definite_loss_stops_the_command("DELETE FROM $T WHERE name = $K");
}

#[test]
fn a_row_with_another_token_stops_the_command_at_once() {
    definite_loss_stops_the_command("UPDATE $T SET token = 'someone-else' WHERE name = $K");
}

#[test]
fn fencing_tokens_increase_across_runs_releases_and_lost_rows() {
    let t = Table::shared();
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
fn status_shows_the_holder_and_release_force_breaks_the_lock() {
    let t = Table::shared();
    let s = Scratch::new();
    let (mut holder, _pid) =
        start_forever(&t, "job", &s, &["--ttl", "20s", "--renew-every", "300ms"]);
    let token = parse_token(&wait_line(&s.path("token")));

    let f = t.admin("status", &["job"]);
    f.assert_code(0);
    assert!(f.stdout.contains(&hostname()), "{}", f.stdout);
    let (code, v) = t.status_json("job");
    assert_eq!(code, Some(0));
    assert_eq!(v["name"], "job");
    assert_eq!(v["held"], true);
    assert_eq!(v["host"], hostname());
    assert_eq!(v["pid"], holder.pid());
    assert_eq!(v["fencing_token"].as_u64().map(u128::from), Some(token));
    let ttl = v["ttl_ms"].as_u64().expect("ttl_ms");
    assert!(ttl > 0 && ttl <= 20_000, "ttl_ms {ttl}");

    let f = t.admin("release", &["--force", "job"]);
    f.assert_code(0);
    assert!(f.stderr.contains(&holder.pid().to_string()), "{}", f.stderr);
    let (code, v) = t.status_json("job");
    assert_eq!(
        (code, &v["held"]),
        (Some(1), &serde_json::Value::Bool(false))
    );
    // The broken holder finds out at its next renewal.
    holder.wait().assert_failure(124);
    // Nothing to break now; still not an error.
    t.admin("release", &["--force", "job"]).assert_code(0);
}

#[test]
fn status_of_a_table_that_does_not_exist_yet_is_free() {
    let t = Table::shared();
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
    let t = Table::shared();
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
    let t = Table::shared();
    let s = Scratch::new();
    t.db.exec(&format!("CREATE TABLE {} (id int)", t.name));
    let f = run(t.run("job", &[], &["touch", s.path("ran").to_str().unwrap()]));
    f.assert_failure(125);
    assert!(!s.exists("ran"));
    assert!(f.stderr.contains(&t.name), "{}", f.stderr);
}

#[test]
fn many_first_runs_create_the_table_once() {
    let t = Table::shared();
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
    let t = Table::shared();
    let s = Scratch::new();
    let url = SHARED_URL.replace("sslmode=disable", "sslmode=require");
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
    .args(sh(HOLD))
    .env("STARTED", s.path("started"))
    .env("GO", s.path("go"));
    let mut holder = spawn(cmd);
    wait_until("the holder's command started", WAIT, || s.exists("started"));
    let ssl = t.db.value(&format!(
        "SELECT bool_and(s.ssl)::text FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'lockrun' AND a.query LIKE '%{}%'",
        t.name
    ));
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
fn a_killed_server_gets_the_command_killed_before_the_lease_expires() {
    let mut pg = PrivatePg::start();
    let t = Table::on(&pg.url());
    let s = Scratch::new();
    let ttl = Duration::from_secs(3);
    // The command ignores SIGTERM: only the SIGKILL at the deadline stops it.
    let mut cmd = t.run(
        "job",
        &["--ttl", "3s", "--renew-every", "1s", "--kill-after", "30s"],
        &sh(r#"trap '' TERM; echo $$ > "$PIDFILE"; while :; do sleep 0.05; done"#),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut holder = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    // Wait for a renewal to have gone through, then kill every server process at once.
    thread::sleep(Duration::from_millis(1200));
    let killed = Instant::now();
    pg.kill();
    // The last successful renewal was sent before the kill: its lease ends within the TTL.
    let deadline = killed + ttl;
    while Instant::now() < deadline && !is_dead(pid) {
        thread::sleep(Duration::from_millis(2));
    }
    assert!(
        is_dead(pid),
        "the command was alive {:?} after the server died",
        killed.elapsed()
    );
    holder.wait().assert_failure(124);
    drop(t);
}

#[test]
fn a_frozen_server_gets_the_command_killed_before_the_lease_expires() {
    let pg = PrivatePg::start();
    let t = Table::on(&pg.url());
    let s = Scratch::new();
    let mut cmd = t.run(
        "job",
        &["--ttl", "3s", "--renew-every", "1s"],
        &sh(r#"echo $$ > "$PIDFILE"; exec sleep 600"#),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut holder = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    thread::sleep(Duration::from_millis(1200));
    let frozen = Instant::now();
    pg.pause();
    let deadline = frozen + Duration::from_secs(3);
    while Instant::now() < deadline && !is_dead(pid) {
        thread::sleep(Duration::from_millis(2));
    }
    let dead = is_dead(pid);
    pg.resume();
    assert!(
        dead,
        "the command was alive {:?} after the server froze",
        frozen.elapsed()
    );
    holder.wait().assert_failure(124);
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
