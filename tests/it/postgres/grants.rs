//! The privileges lockrun needs on its lock table, and the line of each one missing:
//! a role that may not create the missing table, one without rights on the existing
//! table's rows, one without USAGE on its sequence. Each is refused with exit 125 and
//! one line naming the table, the user and the GRANT that fixes it; the test then runs
//! exactly that GRANT and the same run works. A role with just the README's grants
//! runs, waits, inspects, breaks locks and holds a semaphore's slots.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

/// The cluster (trust authentication: a role logs in by name) and a fresh table name.
struct Cluster {
    pg: PrivatePg,
    admin: Db,
    table: String,
}

impl Cluster {
    fn start() -> Cluster {
        let pg = PrivatePg::start();
        let admin = Db::connect(&pg.url());
        // PostgreSQL 15 and later already deny it; older ones grant it to PUBLIC.
        admin.exec("REVOKE CREATE ON SCHEMA public FROM PUBLIC");
        Cluster {
            pg,
            admin,
            table: format!("locks_{}", std::process::id()),
        }
    }

    /// Makes login role `role`.
    fn role(&self, role: &str) {
        self.admin.exec(&format!("CREATE ROLE {role} LOGIN"));
    }

    /// `lockrun ARGS...` as `role` with `--pg-table` (ARGS: `run ...`, `status ...`).
    fn lockrun(&self, role: &str, args: &[&str]) -> Command {
        let url = format!(
            "postgres://{role}@127.0.0.1:{}/postgres?sslmode=disable",
            self.pg.port()
        );
        let mut cmd = lockrun();
        cmd.arg(args[0])
            .args(["--url", &url, "--pg-table", &self.table])
            .args(&args[1..]);
        cmd
    }

    /// `lockrun run` of `name` as `role`; its command touches `s`'s "ran".
    fn run_as(&self, role: &str, name: &str, s: &Scratch) -> Finished {
        let marker = s.path("ran");
        let marker = marker.to_str().expect("a UTF-8 path");
        run(self.lockrun(role, &["run", name, "--", "touch", marker]))
    }
}

/// Asserts that `f` was refused in one line holding each of `want`, and that the
/// command did not run.
fn refused(f: &Finished, s: &Scratch, want: &[&str]) {
    f.assert_failure(125);
    assert!(!s.exists("ran"), "the command ran");
    eprintln!("LINE {}", f.stderr);
    let lines: Vec<&str> = f.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {}", f.stderr);
    for w in want {
        assert!(lines[0].contains(w), "{:?} lacks {w:?}", lines[0]);
    }
}

#[test]
fn each_missing_privilege_is_one_line_with_the_grant_that_fixes_it() {
    let c = Cluster::start();
    let t = c.table.clone();
    for role in ["maker", "reader", "noseq"] {
        c.role(role);
    }
    let grants = |role: &str| {
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {role}; \
             GRANT USAGE ON SEQUENCE {t}_fence TO {role}"
        )
    };

    // The table is missing and "maker" may not create it in the schema.
    let s = Scratch::new();
    let f = c.run_as("maker", "job", &s);
    let create = "GRANT CREATE ON SCHEMA public TO maker";
    let what = format!("does not let user \"maker\" create the lock table {t}");
    refused(
        &f,
        &s,
        &[
            &what,
            "permission denied for schema public",
            &grants("maker"),
            create,
        ],
    );
    // status and release --force create nothing: the lock is simply not held.
    run(c.lockrun("maker", &["status", "job"])).assert_code(1);
    c.admin.exec(create);
    c.run_as("maker", "job", &s).assert_code(0);
    assert!(s.exists("ran"));

    // The table exists (made by "maker"); "reader" has no right on it.
    let s = Scratch::new();
    let what = format!("denied user \"reader\" access to the lock table {t}");
    let denied = format!("permission denied for table {t}");
    for f in [
        c.run_as("reader", "job", &s),
        run(c.lockrun("reader", &["status", "job"])),
        run(c.lockrun("reader", &["release", "--force", "job"])),
    ] {
        refused(&f, &s, &[&what, &denied, &grants("reader")]);
    }
    c.admin.exec(&grants("reader"));
    c.run_as("reader", "job", &s).assert_code(0);

    // Rights on the rows, none on the sequence the fencing tokens come from.
    let s = Scratch::new();
    c.admin.exec(&format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO noseq"
    ));
    let fix = format!("GRANT USAGE ON SEQUENCE {t}_fence TO noseq");
    let what = format!("denied user \"noseq\" the lock table's sequence {t}_fence");
    let f = c.run_as("noseq", "other", &s);
    refused(&f, &s, &[&what, "permission denied for sequence", &fix]);
    c.admin.exec(&fix);
    c.run_as("noseq", "other", &s).assert_code(0);
}

#[test]
fn a_role_with_the_readme_grants_does_everything() {
    let c = Cluster::start();
    let t = c.table.clone();
    c.role("app");
    // The table made once by its owner (here the superuser, by a first run).
    let s = Scratch::new();
    c.run_as("postgres", "job", &s).assert_code(0);
    c.admin.exec(&format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO app; \
         GRANT USAGE ON SEQUENCE {t}_fence TO app"
    ));
    let (s1, s2) = (Scratch::new(), Scratch::new());
    let opts = ["run", "--ttl", "30s", "--renew-every", "500ms", "job", "--"];
    let holding: Vec<&str> = opts.iter().copied().chain(sh(HOLD)).collect();
    let (mut first, token) = hold(c.lockrun("app", &holding), &s1);
    let waiter = ["run", "--wait", "30s", "job", "--", "sh", "-c"];
    let mut w: Vec<&str> = waiter.to_vec();
    w.push(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#);
    let mut w = c.lockrun("app", &w);
    w.env("OUT", s2.path("second"));
    let mut w = spawn(w);
    let f = run(c.lockrun("app", &["status", "job"]));
    f.assert_code(0);
    assert!(f.stdout.contains(&first.pid().to_string()), "{}", f.stdout);
    s1.touch("go");
    let second = parse_token(&wait_line(&s2.path("second")));
    assert!(second > token);
    first.wait().assert_code(0);
    w.wait().assert_code(0);

    // release --force, and a semaphore of 3.
    let s3 = Scratch::new();
    let (mut broken, _) = hold(c.lockrun("app", &holding), &s3);
    run(c.lockrun("app", &["release", "--force", "job"])).assert_code(0);
    broken.wait_for(Duration::from_secs(10)).assert_failure(124);
    let sem = [
        "run",
        "--slots",
        "3",
        "--ttl",
        "30s",
        "--renew-every",
        "500ms",
        "sem",
        "--",
    ];
    let sem: Vec<&str> = sem.iter().copied().chain(sh(HOLD)).collect();
    let scratch: Vec<Scratch> = (0..3).map(|_| Scratch::new()).collect();
    let mut holders = Vec::new();
    for s in &scratch {
        holders.push(hold(c.lockrun("app", &sem), s).0);
    }
    let f = run(c.lockrun("app", &["status", "--slots", "3", "sem"]));
    f.assert_code(0);
    run(c.lockrun("app", &["release", "--slots", "3", "--force", "sem"])).assert_code(0);
    for mut h in holders {
        h.wait_for(Duration::from_secs(60)).assert_failure(124);
    }
}
