//! What only the PostgreSQL backend has, end to end: the real binary against private
//! clusters of the tests' own (a fresh table in each; some with a password, TLS or a fake
//! clock): the lock table and its sequence, TLS,
//! authentication, errors, and expiry by the database's clock. The contract every
//! backend keeps is tested in the conformance suite.

use std::thread;
use std::time::{Duration, Instant};

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
    let rows = |t: &Table| {
        t.db.column(&format!("SELECT name FROM {} ORDER BY name", t.name))
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
