//! What only the MySQL backend has, end to end: the real binary against private
//! MariaDB servers of the tests' own: tokens that keep increasing across a crash and
//! restart of the server, the line of a wrong password and of each missing privilege,
//! a table created on first use and not by `status`, and URL parameters refused by
//! name. The contract every backend keeps (faults and a frozen server included) is
//! tested in the conformance suite. Beside it: `tls` (ssl-mode, a test CA).

mod tls;

use std::process::Command;

use crate::support::*;

/// `lockrun SUB --url URL ARGS...` (SUB: run, status, release, list).
fn lockrun_at(url: &str, args: &[&str]) -> Command {
    let mut cmd = lockrun();
    cmd.arg(args[0]).args(["--url", url]).args(&args[1..]);
    cmd
}

/// The fencing token a run of `name` at `url` gets.
fn token(url: &str, name: &str) -> u128 {
    let f = run(lockrun_run(
        url,
        name,
        &[],
        &sh("echo $LOCKRUN_FENCING_TOKEN"),
    ));
    parse_token(f.assert_code(0).stdout.trim())
}

#[test]
fn tokens_keep_increasing_across_a_crash_and_restart_of_the_server() {
    let mut server = PrivateMysql::start();
    let url = server.url();
    let mut seen = vec![token(&url, "job"), token(&url, "other")];
    // SIGKILL right after a run's commit: InnoDB's redo log keeps the counter.
    server.kill();
    server.restart();
    seen.push(token(&url, "job"));
    seen.push(token(&url, "other"));
    server.kill();
    server.restart();
    seen.push(token(&url, "job"));
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {seen:?}"
    );
}

#[test]
fn status_of_a_table_that_does_not_exist_yet_is_free_and_creates_nothing() {
    let server = PrivateMysql::start();
    let f = run(lockrun_at(&server.url(), &["status", "job"]));
    f.assert_code(1);
    assert!(f.stdout.contains("free"), "{}", f.stdout);
    let tables = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'lockrun'";
    assert_eq!(server.db("lockrun").value(tables).as_deref(), Some("0"));
    run(lockrun_run(&server.url(), "job", &[], &["true"])).assert_code(0);
    assert_eq!(server.db("lockrun").value(tables).as_deref(), Some("1"));
}

#[test]
fn a_wrong_password_exits_125_in_one_line_and_is_never_printed() {
    let server = PrivateMysql::start();
    let admin = server.db("mysql");
    admin.exec("CREATE USER 'pw'@'127.0.0.1' IDENTIFIED BY 'right-pw'");
    admin.exec("GRANT ALL ON lockrun.* TO 'pw'@'127.0.0.1'");
    let url = format!(
        "mysql://pw@127.0.0.1:{}/lockrun?ssl-mode=DISABLED",
        server.port()
    );
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &url,
        "job",
        &[],
        &["touch", s.path("ran").to_str().unwrap()],
    );
    cmd.env("LOCKRUN_PASSWORD", "wrong-pw");
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("ran"));
    assert_eq!(f.stderr.lines().count(), 1, "{}", f.stderr);
    assert!(f.stderr.contains("refused user \"pw\""), "{}", f.stderr);
    assert!(
        !f.stderr.contains("wrong-pw"),
        "the password leaked: {}",
        f.stderr
    );
    // The right one, from the URL this time, works.
    let url = url.replace("pw@", "pw:right-pw@");
    run(lockrun_run(&url, "job", &[], &["true"])).assert_code(0);
}

#[test]
fn each_missing_privilege_is_one_line_naming_the_table_the_user_and_the_grant() {
    let server = PrivateMysql::start();
    let admin = server.db("mysql");
    let port = server.port();
    let url = |user: &str| format!("mysql://{user}@127.0.0.1:{port}/lockrun?ssl-mode=DISABLED");
    let s = Scratch::new();
    let marker = s.path("ran");
    let marker = marker.to_str().unwrap();
    let want = [
        "lockrun.lockrun_locks",
        "\"few\"",
        "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `lockrun`.`lockrun_locks` TO 'few'",
    ];
    admin.exec("CREATE USER 'few'@'127.0.0.1'");
    admin.exec("GRANT SELECT ON lockrun.* TO 'few'@'127.0.0.1'");
    // The table is missing and may not be created; then it exists and may not be written.
    for setup in [None, Some("lockrun")] {
        if let Some(owner) = setup {
            admin.exec(&format!("CREATE USER '{owner}'@'127.0.0.1'"));
            admin.exec(&format!("GRANT ALL ON lockrun.* TO '{owner}'@'127.0.0.1'"));
            run(lockrun_run(&url(owner), "job", &[], &["true"])).assert_code(0);
        }
        let f = run(lockrun_run(&url("few"), "job", &[], &["touch", marker]));
        f.assert_failure(125);
        assert!(!s.exists("ran"), "the command ran");
        let lines: Vec<&str> = f.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "not one line: {}", f.stderr);
        for w in want {
            assert!(lines[0].contains(w), "{:?} lacks {w:?}", lines[0]);
        }
    }
    // Exactly the GRANT named (for the host of the test) makes it work.
    admin.exec(
        "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `lockrun`.`lockrun_locks` \
         TO 'few'@'127.0.0.1'",
    );
    run(lockrun_run(&url("few"), "job", &[], &["touch", marker])).assert_code(0);
    assert!(s.exists("ran"));
}

#[test]
fn unsupported_url_parameters_are_refused_by_name_before_connecting() {
    // Nothing listens on this port: each refusal comes before any connection.
    let port = closed_port();
    for (query, want) in [
        ("ssl-mode=DISABLED&bogus=1", "\"bogus\""),
        ("ssl-mode=REQUIRED&ssl-ca=/nonexistent.pem", "ssl-ca"),
        ("ssl-mode=DISABLED&table=a-b", "invalid table"),
    ] {
        let url = format!("mysql://u:secret@127.0.0.1:{port}/d?{query}");
        let f = run(lockrun_run(&url, "job", &[], &["true"]));
        f.assert_failure(125);
        assert_eq!(f.stderr.lines().count(), 1, "{}", f.stderr);
        assert!(f.stderr.contains(want), "{query}: {}", f.stderr);
        assert!(!f.stderr.contains("secret"), "{}", f.stderr);
    }
}

/// A run and a waiter that gives up close their connections (COM_QUIT): the server
/// counts no aborted client. (`status` and `list` still end theirs by exiting.)
#[test]
fn runs_close_their_connections_politely() {
    let server = PrivateMysql::start();
    let url = server.url();
    let admin = server.db("mysql");
    let status = |var: &str| {
        admin
            .value(&format!(
                "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = '{var}'"
            ))
            .unwrap()
    };
    // Every connection but ours has ended on the server's side (the test's own too).
    let settled = || {
        wait_until("other connections end", WAIT, || {
            status("THREADS_CONNECTED") == "1"
        });
        status("ABORTED_CLIENTS")
    };
    let before = settled();
    run(lockrun_run(&url, "job", &[], &["true"])).assert_code(0);
    let s = Scratch::new();
    let mut cmd = lockrun_run(&url, "held", &[], &sh(r#"touch "$M"; sleep 2"#));
    cmd.env("M", s.path("m"));
    let mut busy = spawn(cmd);
    wait_until("the lock is held", WAIT, || s.exists("m"));
    // A waiter that gives up leaves the queue and closes too.
    run(lockrun_run(&url, "held", &["--wait", "300ms"], &["true"])).assert_code(75);
    busy.wait().assert_code(0);
    assert_eq!(settled(), before, "a connection was dropped, not closed");
}

/// Property 8 (docs/guarantees.md): rows of names unused for a day are deleted by an
/// acquisition that adds a row, a few at a time; a row whose record is still kept, and
/// the counter, stay, and tokens keep increasing.
#[test]
fn rows_of_names_unused_for_a_day_are_deleted() {
    let server = PrivateMysql::start();
    let url = server.url();
    let first = token(&url, "old");
    token(&url, "kept");
    let db = server.db("lockrun");
    let two_days = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS UNSIGNED) - 172800000";
    // "old": its lease and its record ended two days ago; "kept": its lease too, but
    // its record is kept a while yet.
    db.exec(&format!(
        "UPDATE lockrun_locks SET expires_ms = {two_days}, record_ms = {two_days} \
         WHERE lock_key = 'lockrun:{{old}}'"
    ));
    db.exec(&format!(
        "UPDATE lockrun_locks SET expires_ms = {two_days} WHERE lock_key = 'lockrun:{{kept}}'"
    ));
    let count = |key: &str| {
        db.value(&format!(
            "SELECT COUNT(*) FROM lockrun_locks WHERE lock_key = '{key}'"
        ))
    };
    // A name that has a row adds none: nothing is swept.
    token(&url, "kept");
    assert_eq!(count("lockrun:{old}").as_deref(), Some("1"));
    // A new name adds one: the unused row goes.
    let later = token(&url, "new");
    assert_eq!(
        count("lockrun:{old}").as_deref(),
        Some("0"),
        "the unused row stays"
    );
    assert_eq!(
        count("lockrun:{kept}").as_deref(),
        Some("1"),
        "a kept record went"
    );
    assert_eq!(count("").as_deref(), Some("1"), "the counter row went");
    assert!(
        token(&url, "old") > later && later > first,
        "tokens must increase"
    );
}
