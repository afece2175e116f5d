//! etcd over TLS (`etcds://`) against real `etcd` processes that serve clients over TLS
//! only and demand a client certificate (`--client-cert-auth`): a run, a `--wait`
//! hand-off, `status` and `release --force` with the CA and client certificate of
//! `LOCKRUN_TLS_*`; a user and password over TLS (no warning); members that are down or
//! fail the TLS check passed over; every way TLS is set up wrong ending in one line that
//! says what to set; and the warning when a password would cross the network in clear
//! text over `etcd://`. The contract itself runs over TLS in the conformance suite
//! (`conformance::etcd_tls`).

use std::process::Command;
use std::time::Duration;

use crate::support::*;

const PASSWORD: &str = "tls-Pw-51e0";

/// `cmd` with the TLS files that let lockrun into `etcd`.
fn with_tls(mut cmd: Command, etcd: &EtcdServer) -> Command {
    for (var, value) in etcd.tls_env() {
        cmd.env(var, value);
    }
    cmd
}

/// `lockrun SUBCOMMAND --url URL ARGS...` with `etcd`'s TLS files.
fn admin(etcd: &EtcdServer, subcommand: &str, args: &[&str]) -> Command {
    let mut cmd = lockrun();
    cmd.args([subcommand, "--url", &etcd.url()]).args(args);
    with_tls(cmd, etcd)
}

#[test]
fn etcds_runs_hands_off_shows_status_and_breaks_locks_with_a_client_certificate() {
    let etcd = EtcdServer::start_tls(TlsFiles::generate(true));
    let url = etcd.url();
    assert!(url.starts_with("etcds://"), "{url}");
    let s = Scratch::new();
    let holder_cmd = lockrun_run(&url, "job", &["--ttl", "10s"], &sh(HOLD));
    let (mut holder, token) = hold(with_tls(holder_cmd, &etcd), &s);
    let key = etcd.get(&etcd_key("job")).expect("the lock key exists");
    assert_eq!(key.create_revision as u128, token);

    let f = run(admin(&etcd, "status", &["--json", "job"]));
    f.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(f.stdout.trim()).expect("status JSON");
    assert_eq!(v["pid"].as_u64(), Some(holder.pid() as u64), "{v}");

    // A waiter takes the lock when the holder lets it go, with a larger token.
    let w = Scratch::new();
    let mut cmd = lockrun_run(
        &url,
        "job",
        &["--wait", "20s"],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$TOKEN""#),
    );
    cmd.env("TOKEN", w.path("token"));
    let mut waiter = spawn(with_tls(cmd, &etcd));
    s.touch("go");
    holder.wait().assert_code(0);
    waiter.wait_for(WAIT).assert_code(0);
    assert!(parse_token(&wait_line(&w.path("token"))) > token);

    // release --force breaks a holder's lock over TLS too.
    let b = Scratch::new();
    let holder_cmd = lockrun_run(
        &url,
        "job",
        &["--ttl", "10s", "--renew-every", "500ms"],
        &sh(HOLD),
    );
    let (mut broken, _) = hold(with_tls(holder_cmd, &etcd), &b);
    run(admin(&etcd, "release", &["--force", "job"])).assert_code(0);
    assert!(!etcd.exists(&etcd_key("job")), "the lock is still there");
    broken.wait_for(Duration::from_secs(10)).assert_failure(124);
    // The released holders' leases hold nothing; the last run's record is kept.
    assert_eq!(
        etcd.keys_on_leases(),
        [["lockrun:{job}:last", "lockrun:{job}:ok"]],
        "a key was left behind"
    );
}

#[test]
fn a_user_and_password_go_over_tls_without_a_warning() {
    let mut etcd = EtcdServer::start_tls(TlsFiles::generate(true));
    etcd.enable_auth(PASSWORD);
    // By name: the certificate's DNS name is checked (elsewhere, its IP address).
    let url = format!("etcds://root@localhost:{}", etcd.port());
    let run_with = |password: &str| {
        let mut cmd = lockrun_run(&url, "job", &[], &["true"]);
        cmd.env("LOCKRUN_PASSWORD", password);
        run(with_tls(cmd, &etcd))
    };
    let f = run_with(PASSWORD);
    f.assert_code(0);
    assert_eq!(f.stderr, "", "no warning over TLS");
    let f = run_with("wrong-Pw-0c3d");
    f.assert_failure(125);
    assert!(f.stderr.contains("refused authentication"), "{}", f.stderr);
    assert!(!f.stderr.contains("wrong-Pw-0c3d") && !f.stderr.contains(PASSWORD));
}

#[test]
fn a_member_down_or_failing_the_tls_check_is_passed_over() {
    let etcd = EtcdServer::start_tls(TlsFiles::generate(true));
    // 127.0.0.2 is served by the same etcd, but its certificate does not hold that
    // address: nothing may be sent there. The request goes to the next member.
    let url = format!(
        "etcds://127.0.0.1:{},127.0.0.2:{port},127.0.0.1:{port}",
        closed_port(),
        port = etcd.port()
    );
    let s = Scratch::new();
    let mut cmd = lockrun_run(&url, "job", &[], &sh(r#"touch "$RAN""#));
    cmd.env("RAN", s.path("ran"));
    let f = run(with_tls(cmd, &etcd));
    f.assert_code(0);
    assert!(s.exists("ran"));
    assert!(!etcd.exists(&etcd_key("job")));
}

/// Runs `case` with `opts`, and checks its line; returns how long it took. Two looks at
/// the port at most, a second each, on a loaded machine.
fn check(case: &Refusal, opts: &[&str]) -> Duration {
    let secrets = [PASSWORD, "PRIVATE KEY", "BEGIN"];
    case.check(opts, Duration::from_secs(4), &secrets).elapsed
}

#[test]
fn every_misconfigured_tls_connection_says_what_to_set_in_one_line() {
    let mtls = EtcdServer::start_tls(TlsFiles::generate(true));
    let plain = EtcdServer::start();
    // Another CA, and a client certificate it signed: trusted by neither server.
    let stranger = TlsFiles::generate(true);
    let path = |files: &TlsFiles, name: &str| files.path(name).display().to_string();
    let ours = |name: &str| path(mtls.tls_files(), name);
    let ca = || ("LOCKRUN_TLS_CA", ours("ca.pem"));
    let cert = || ("LOCKRUN_TLS_CERT", ours("client.pem"));
    let key = || ("LOCKRUN_TLS_KEY", ours("client.key"));
    let port = mtls.port();
    let cases = [
        Refusal {
            what: "a private CA, no LOCKRUN_TLS_CA",
            url: mtls.url(),
            env: vec![cert(), key()],
            says: vec![
                "etcd at 127.0.0.1:",
                "signed by an unknown CA",
                "set LOCKRUN_TLS_CA to the CA that signed it",
            ],
            never: vec![],
        },
        Refusal {
            what: "another CA in LOCKRUN_TLS_CA",
            url: mtls.url(),
            env: vec![("LOCKRUN_TLS_CA", path(&stranger, "ca.pem")), cert(), key()],
            // (Both test CAs have one name: webpki finds a bad signature.)
            says: vec!["point LOCKRUN_TLS_CA at the CA that signed"],
            never: vec!["set LOCKRUN_TLS_CA"],
        },
        Refusal {
            what: "an address the certificate does not hold",
            url: format!("etcds://127.0.0.2:{port}"),
            env: vec![ca(), cert(), key()],
            says: vec![
                "etcd at 127.0.0.2:",
                "not valid for the host name 127.0.0.2",
                "connect by a name or address the certificate holds",
            ],
            never: vec!["LOCKRUN_TLS_CA"],
        },
        Refusal {
            what: "a client certificate demanded, none given",
            url: mtls.url(),
            env: vec![ca()],
            says: vec![
                "demands a client certificate",
                "set LOCKRUN_TLS_CERT and LOCKRUN_TLS_KEY",
            ],
            never: vec!["LOCKRUN_TLS_CA"],
        },
        Refusal {
            what: "a client certificate another CA signed",
            url: mtls.url(),
            env: vec![
                ca(),
                ("LOCKRUN_TLS_CERT", path(&stranger, "client.pem")),
                ("LOCKRUN_TLS_KEY", path(&stranger, "client.key")),
            ],
            says: vec!["did not accept the client certificate of LOCKRUN_TLS_CERT"],
            never: vec!["LOCKRUN_TLS_CA"],
        },
        Refusal {
            what: "etcds:// at a plain port",
            url: format!("etcds://127.0.0.1:{}", plain.port()),
            env: vec![ca(), cert(), key()],
            says: vec!["answers without TLS on that port", "use etcd://"],
            never: vec!["connection closed"],
        },
        Refusal {
            what: "etcd:// at a TLS port",
            url: format!("etcd://127.0.0.1:{port}"),
            env: vec![],
            says: vec!["speaks TLS on that port", "use etcds://"],
            never: vec!["connection closed"],
        },
        Refusal {
            what: "a user and password for etcd:// at a TLS port",
            url: format!("etcd://root@127.0.0.1:{port}"),
            env: vec![("LOCKRUN_PASSWORD", PASSWORD.into())],
            says: vec!["speaks TLS on that port", "use etcds://"],
            never: vec!["clear text"],
        },
        Refusal {
            what: "a missing LOCKRUN_TLS_CA",
            url: mtls.url(),
            env: vec![
                ("LOCKRUN_TLS_CA", "/nonexistent/ca.pem".into()),
                cert(),
                key(),
            ],
            says: vec!["cannot read LOCKRUN_TLS_CA (/nonexistent/ca.pem)"],
            never: vec![],
        },
        Refusal {
            what: "an unreadable LOCKRUN_TLS_KEY (a directory)",
            url: mtls.url(),
            env: vec![ca(), cert(), ("LOCKRUN_TLS_KEY", "/".into())],
            says: vec!["cannot read LOCKRUN_TLS_KEY (/)"],
            never: vec![],
        },
        Refusal {
            what: "a key that is not the certificate's",
            url: mtls.url(),
            env: vec![ca(), cert(), ("LOCKRUN_TLS_KEY", ours("server.key"))],
            says: vec!["the client key does not belong to the client certificate"],
            never: vec![],
        },
    ];
    let mut slowest = Duration::ZERO;
    for case in &cases {
        slowest = slowest.max(check(case, &[]));
        slowest = slowest.max(check(case, &["--wait", "10s"]));
    }
    eprintln!("slowest error line: {slowest:?}");
}

#[test]
fn a_password_over_plain_etcd_to_a_host_that_is_not_loopback_is_warned_about() {
    let mut etcd = EtcdServer::start();
    etcd.enable_auth(PASSWORD);
    // Written as 0.0.0.0, which is not a loopback address but reaches this machine's
    // listeners: the warning goes by the host as written, and the run works.
    let port = etcd.port();
    let run_with = |url: String, opts: &[&str]| {
        let mut cmd = lockrun_run(&url, "job", opts, &["true"]);
        cmd.env("LOCKRUN_PASSWORD", PASSWORD);
        run(cmd)
    };
    let f = run_with(format!("etcd://root@0.0.0.0:{port}"), &[]);
    f.assert_code(0);
    assert_eq!(f.stderr.lines().count(), 1, "one line:\n{}", f.stderr);
    let line = f.stderr.trim_end();
    let said = format!("the etcd password crosses the network in clear text to 0.0.0.0:{port}");
    assert!(line.contains(&said), "{said:?} in {line}");
    assert!(line.contains("use etcds://"), "{line}");
    assert!(!line.contains(PASSWORD));
    // As a JSON line, with its event.
    let f = run_with(
        format!("etcd://root@0.0.0.0:{port}"),
        &["--log-format", "json"],
    );
    f.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(f.stderr.trim()).expect("one JSON line");
    assert_eq!(
        (&v["level"], &v["event"]),
        (&"warn".into(), &"password_in_clear".into())
    );
    // Loopback as written: no warning.
    for host in ["127.0.0.1", "localhost"] {
        let f = run_with(format!("etcd://root@{host}:{port}"), &[]);
        f.assert_code(0);
        assert_eq!(f.stderr, "", "{host}");
    }
}
