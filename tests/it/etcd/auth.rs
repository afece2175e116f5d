//! etcd with `auth enable` as production runs it: a least-privilege user whose role
//! has readwrite on the key prefix only (the `etcdctl` lines the README states,
//! [`ROLE_LINES`]) can run, wait and be handed the lock, see `status`, break a lock
//! with `release --force`, and do all of it for a `--slots 3` semaphore; and each
//! misconfiguration (no user, a wrong password, a user whose role does not cover the
//! prefix, a user given to an etcd without authentication) is one line, exit 125,
//! naming the cause and the fix, never the password.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

const ROOT_PASSWORD: &str = "root-Pw-7d2e";
const PASSWORD: &str = "app-Pw-93fa";

/// The README's lines for a least-privilege user (etcdctl run as root), `PASSWORD`
/// being [`PASSWORD`].
const ROLE_LINES: [&str; 4] = [
    "role add lockrun-role",
    "role grant-permission lockrun-role --prefix=true readwrite lockrun:",
    "user add lockrun-app --new-user-password=PASSWORD",
    "user grant-role lockrun-app lockrun-role",
];

/// `docs/backends.md` shows [`ROLE_LINES`] as they are (the password is asked for there).
#[test]
fn the_readme_shows_the_role_lines_this_test_uses() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/backends.md"))
        .expect("read docs/backends.md");
    for line in ROLE_LINES {
        let shown = format!("etcdctl {line}")
            .replace(" --new-user-password=PASSWORD", "")
            .replace("readwrite lockrun:", "readwrite 'lockrun:'");
        assert!(
            readme.contains(&shown),
            "docs/backends.md does not show the line {shown:?}"
        );
    }
}

/// An etcd with authentication on and the user `lockrun-app` made by [`ROLE_LINES`].
fn least_privilege_etcd() -> EtcdServer {
    let mut etcd = EtcdServer::start();
    etcd.enable_auth(ROOT_PASSWORD);
    for line in ROLE_LINES {
        let line = line.replace("PASSWORD", PASSWORD);
        let words: Vec<&str> = line.split_whitespace().collect();
        etcd.etcdctl(&words);
    }
    etcd
}

/// `lockrun run` as `user` (password [`PASSWORD`]) on `etcd`.
fn run_as(etcd: &EtcdServer, user: &str, name: &str, opts: &[&str], command: &[&str]) -> Command {
    let url = format!("etcd://{user}@127.0.0.1:{}", etcd.port());
    let mut cmd = lockrun_run(&url, name, opts, command);
    cmd.env("LOCKRUN_PASSWORD", PASSWORD);
    cmd
}

/// `lockrun ADMIN` (`status`, `release`) as `lockrun-app` on `etcd`.
fn admin(etcd: &EtcdServer, what: &str, args: &[&str]) -> Finished {
    let mut cmd = lockrun();
    cmd.arg(what)
        .arg("--url")
        .arg(format!("etcd://lockrun-app@127.0.0.1:{}", etcd.port()))
        .args(args)
        .env("LOCKRUN_PASSWORD", PASSWORD);
    run(cmd)
}

/// A holder of `name` as `lockrun-app` running [`HOLD_SLOT`] until `s`'s "go" exists:
/// it, its slot and its token.
fn hold_as_app(etcd: &EtcdServer, name: &str, s: &Scratch, opts: &[&str]) -> (Running, u32, u128) {
    let mut cmd = run_as(etcd, "lockrun-app", name, opts, &sh(HOLD_SLOT));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let lr = spawn(cmd);
    let line = wait_line(&s.path("started"));
    let (slot, token) = line.split_once(' ').expect("a slot and a token");
    (lr, slot.parse().expect("LOCKRUN_SLOT"), parse_token(token))
}

/// Writes `$LOCKRUN_SLOT $LOCKRUN_FENCING_TOKEN` to `$STARTED`, then runs until `$GO`.
const HOLD_SLOT: &str = r#"echo "$LOCKRUN_SLOT $LOCKRUN_FENCING_TOKEN" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// Asserts that `f` went well and printed no password.
fn clean(f: &Finished, code: i32) {
    f.assert_code(code);
    for pw in [PASSWORD, ROOT_PASSWORD] {
        assert!(
            !f.stderr.contains(pw) && !f.stdout.contains(pw),
            "a password was printed"
        );
    }
    assert!(
        !f.stderr.contains("denied") && !f.stderr.contains("permission"),
        "a denial: {}",
        f.stderr
    );
}

#[test]
fn a_user_confined_to_the_prefix_runs_waits_inspects_and_breaks_locks() {
    let etcd = least_privilege_etcd();
    // A run.
    clean(&run(run_as(&etcd, "lockrun-app", "job", &[], &["true"])), 0);

    // Held, busy, waited for and handed over (the waiter's watch reads the prefix).
    let (s1, s2) = (Scratch::new(), Scratch::new());
    let (mut first, _, token) = hold_as_app(&etcd, "job", &s1, &["--ttl", "30s"]);
    clean(
        &run(run_as(&etcd, "lockrun-app", "job", &[], &["true"])),
        75,
    );
    let mut waiter = run_as(
        &etcd,
        "lockrun-app",
        "job",
        &["--wait", "30s"],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    waiter.env("OUT", s2.path("second"));
    let mut waiter = spawn(waiter);
    let f = admin(&etcd, "status", &["job"]);
    clean(&f, 0);
    assert!(f.stdout.contains(&first.pid().to_string()), "{}", f.stdout);
    let go = Instant::now();
    s1.touch("go");
    let second = parse_token(&wait_line(&s2.path("second")));
    assert!(second > token, "token {second} after {token}");
    assert!(
        go.elapsed() < Duration::from_secs(5),
        "hand-off took {:?}",
        go.elapsed()
    );
    clean(&first.wait(), 0);
    clean(&waiter.wait(), 0);

    // release --force: the holder is told at its next renewal.
    let s3 = Scratch::new();
    let opts = ["--ttl", "30s", "--renew-every", "500ms"];
    let (mut broken, _, _) = hold_as_app(&etcd, "job", &s3, &opts);
    let f = admin(&etcd, "release", &["--force", "job"]);
    clean(&f, 0);
    assert!(f.stderr.contains(&broken.pid().to_string()), "{}", f.stderr);
    broken.wait_for(Duration::from_secs(10)).assert_failure(124);

    // A semaphore of 3: three holders, a queued waiter served when one leaves,
    // status and release --force over every slot.
    let slots = ["--slots", "3", "--ttl", "30s"];
    let scratch: Vec<Scratch> = (0..3).map(|_| Scratch::new()).collect();
    let mut holders: Vec<Running> = Vec::new();
    for (want, s) in scratch.iter().enumerate() {
        let (lr, slot, _) = hold_as_app(&etcd, "sem", s, &slots);
        assert_eq!(slot, want as u32);
        holders.push(lr);
    }
    let ws = Scratch::new();
    let wait_opts = ["--slots", "3", "--ttl", "30s", "--wait", "30s"];
    let mut w = run_as(&etcd, "lockrun-app", "sem", &wait_opts, &sh(HOLD_SLOT));
    w.env("STARTED", ws.path("started"))
        .env("GO", ws.path("go"));
    let w = spawn(w);
    wait_until("the waiter queued", WAIT, || {
        !etcd.keys_with_prefix("lockrun:{sem}%").is_empty()
    });
    scratch[1].touch("go");
    let line = wait_line(&ws.path("started"));
    assert!(
        line.starts_with("1 "),
        "the waiter took {line:?}, not slot 1"
    );
    clean(&holders.remove(1).wait(), 0);
    let f = admin(&etcd, "status", &["--slots", "3", "--json", "sem"]);
    clean(&f, 0);
    let f = admin(&etcd, "release", &["--slots", "3", "--force", "sem"]);
    clean(&f, 0);
    for mut h in holders.into_iter().chain([w]) {
        h.wait_for(Duration::from_secs(60)).assert_failure(124);
    }
    // Only the records (and last successes) of the runs that gave their locks back, on
    // their lease.
    let records = [
        "lockrun:{job}:last",
        "lockrun:{job}:ok",
        "lockrun:{sem}:last",
        "lockrun:{sem}:ok",
    ];
    assert_eq!(etcd.keys_with_prefix("lockrun:"), records);
    let mut on_leases = etcd.keys_on_leases().concat();
    on_leases.sort();
    assert_eq!(on_leases, records, "a key was left behind");
}

/// A misconfiguration: the URL, the password, extra options, what the line must say.
type Case<'a> = (String, Option<&'a str>, Vec<&'a str>, Vec<String>);

#[test]
fn each_authentication_and_permission_mistake_is_one_line_naming_the_fix() {
    let etcd = least_privilege_etcd();
    let port = etcd.port();
    // A user of its own, with a role on another prefix only.
    for line in [
        "role add other",
        "role grant-permission other --prefix=true readwrite other:",
        "user add elsewhere --new-user-password=PASSWORD",
        "user grant-role elsewhere other",
    ] {
        let line = line.replace("PASSWORD", PASSWORD);
        etcd.etcdctl(&line.split_whitespace().collect::<Vec<_>>());
    }
    let plain = EtcdServer::start();
    let at = format!("127.0.0.1:{port}");
    let team_line = "etcdctl role grant-permission ROLE --prefix=true readwrite 'team:'";
    let lockrun_line = "etcdctl role grant-permission ROLE --prefix=true readwrite 'lockrun:'";
    let cases: Vec<Case> = vec![
        (
            format!("etcd://{at}"),
            None,
            vec![],
            vec![
                "authentication enabled and no user was given".into(),
                format!("etcd://USER@{at}"),
            ],
        ),
        (
            format!("etcd://lockrun-app@{at}"),
            Some("wrong-Pw-1"),
            vec![],
            vec![
                "refused authentication as user \"lockrun-app\"".into(),
                "password".into(),
            ],
        ),
        (
            format!("etcd://nobody@{at}"),
            Some(PASSWORD),
            vec![],
            vec!["refused authentication as user \"nobody\"".into()],
        ),
        (
            format!("etcd://elsewhere@{at}"),
            Some(PASSWORD),
            vec![],
            vec![
                "denied user \"elsewhere\" access to the keys under the prefix \"lockrun:\"".into(),
                lockrun_line.into(),
            ],
        ),
        (
            format!("etcd://lockrun-app@{at}"),
            Some(PASSWORD),
            vec!["--key-prefix", "team:"],
            vec![
                "denied user \"lockrun-app\" access to the keys under the prefix \"team:\"".into(),
                team_line.into(),
            ],
        ),
        (
            format!("etcd://lockrun-app@127.0.0.1:{}", plain.port()),
            Some(PASSWORD),
            vec![],
            vec![
                "has authentication disabled, yet user \"lockrun-app\" was given".into(),
                "remove the user".into(),
            ],
        ),
    ];
    for (url, password, opts, want) in cases {
        let s = Scratch::new();
        let what = format!("{url} {opts:?}");
        let mut runs = vec![lockrun_run(&url, "job", &opts, &sh(r#"touch "$MARK""#))];
        for admin in [&["status"][..], &["release", "--force"]] {
            let mut cmd = lockrun();
            cmd.arg(admin[0]).arg("--url").arg(&url).args(&opts);
            cmd.args(&admin[1..]).arg("job");
            runs.push(cmd);
        }
        for mut cmd in runs {
            cmd.env("MARK", s.path("ran"));
            cmd.env_remove("LOCKRUN_PASSWORD");
            if let Some(pw) = password {
                cmd.env("LOCKRUN_PASSWORD", pw);
            }
            let f = run(cmd);
            f.assert_failure(125);
            assert!(!s.exists("ran"), "{what}: the command ran");
            let lines: Vec<&str> = f.stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{what}: not one line: {}", f.stderr);
            for w in &want {
                assert!(
                    lines[0].contains(w.as_str()),
                    "{what}: {:?} lacks {w:?}",
                    lines[0]
                );
            }
            for pw in [PASSWORD, ROOT_PASSWORD, "wrong-Pw-1"] {
                assert!(!f.stderr.contains(pw), "{what}: the password was printed");
            }
        }
    }
    // Nothing was written by any of them.
    assert_eq!(etcd.keys_with_prefix(""), Vec::<String>::new());
    assert_eq!(plain.keys_with_prefix(""), Vec::<String>::new());
}
