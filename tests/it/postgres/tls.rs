//! PostgreSQL over TLS as libpq users set it up, against a private cluster with
//! `ssl = on`, a server certificate for 127.0.0.1 from a CA of the test's own,
//! `ssl_ca_file` for client certificates, and a `pg_hba.conf` with a line per way in:
//! `cert` (a client certificate for `certuser`), `scram-sha-256` (`scramuser`), `md5`
//! (`md5user`), `trust` over TLS only (`tlsonly`) and `trust` for `postgres`.
//!
//! - every setup that libpq accepts works here: each `sslmode`, `verify-ca` to a name
//!   the certificate does not hold, `verify-full` by IP address, several hosts (each
//!   checked under its own name), client certificates from the URL, from
//!   `LOCKRUN_TLS_CERT`/`_KEY` and from `~/.postgresql`, `LOCKRUN_TLS_CA`,
//!   `channel_binding=require` with SCRAM; the server's log shows which sessions were
//!   encrypted and how each authenticated;
//! - a whole acquire, run and release through `verify-full` with a client certificate,
//!   whose session the server shows encrypted with that certificate;
//! - every refusal (a certificate from an unknown CA, for another name, expired; a
//!   client certificate demanded or refused; no TLS at the server; channel binding not
//!   used; a password wrong or missing; a file unreadable or open to others; ...) is one
//!   line on stderr, exit 125, saying what to set, never a password or key, and the
//!   command never runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::*;

const PASSWORD: &str = "pgtls-Pw-51c9";
const WRONG: &str = "wrong-Pw-0d2e";

/// The `pg_hba.conf` of the cluster.
const HBA: &str = "\
local   all all                    trust
hostssl all certuser  127.0.0.1/32 cert
hostssl all scramuser 127.0.0.1/32 scram-sha-256
hostssl all md5user   127.0.0.1/32 md5
hostssl all tlsonly   127.0.0.1/32 trust
host    all postgres  127.0.0.1/32 trust
";

/// A cluster serving TLS, its CA, a stranger CA, and client certificates.
struct Setup {
    ca: TestCa,
    stranger: TestCa,
    /// `certuser`'s certificate and key, from `ca`.
    client: (PathBuf, PathBuf),
    pg: PrivatePg,
    /// An empty HOME for lockrun (no `~/.postgresql` of the developer's).
    home: Scratch,
}

impl Setup {
    fn new() -> Setup {
        let ca = TestCa::new("pg");
        let stranger = TestCa::new("stranger");
        let (cert, key) = ca.issue(
            "server",
            "pg-tls-server",
            "subjectAltName=IP:127.0.0.1",
            false,
        );
        let client = ca.issue("client", "certuser", "extendedKeyUsage=clientAuth", false);
        let pg = PrivatePg::start_ssl(&cert, &key, &ca.ca(), HBA);
        let db = Db::connect(&pg.url());
        db.exec(&format!(
            "SET password_encryption = 'scram-sha-256';
             CREATE ROLE scramuser LOGIN SUPERUSER PASSWORD '{PASSWORD}';
             CREATE ROLE certuser LOGIN SUPERUSER;
             CREATE ROLE tlsonly LOGIN SUPERUSER;
             SET password_encryption = 'md5';
             CREATE ROLE md5user LOGIN SUPERUSER PASSWORD '{PASSWORD}';"
        ));
        Setup {
            ca,
            stranger,
            client,
            pg,
            home: Scratch::new(),
        }
    }

    /// `postgres://USER@HOST:PORT/postgres?QUERY`
    fn url(&self, user: &str, host: &str, query: &str) -> String {
        format!(
            "postgres://{user}@{host}:{}/postgres?{query}",
            self.pg.port()
        )
    }

    /// lockrun with `url` running `touch $RAN` under lock `name` in `table`, with
    /// HOME and `env`.
    fn lockrun(
        &self,
        url: &str,
        table: &str,
        name: &str,
        env: &[(&str, String)],
        ran: &Path,
    ) -> Command {
        let mut cmd = lockrun_run(url, name, &["--pg-table", table], &sh(r#"touch "$RAN""#));
        cmd.env("RAN", ran).env("HOME", self.home.path("."));
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// One way in that must work, told apart in the server's log by its application_name.
struct Works {
    what: &'static str,
    url: String,
    env: Vec<(&'static str, String)>,
    /// The session is encrypted.
    tls: bool,
    /// In the log's "connection authenticated" line of the session, if it has one.
    method: Option<&'static str>,
    /// A HOME with `~/.postgresql` files instead of the empty one.
    home: Option<PathBuf>,
}

#[test]
fn every_setup_libpq_accepts_connects_as_it_should() {
    let s = Setup::new();
    let t = Table::on(&s.pg.url());
    let ca = path(&s.ca.ca());
    let (cert, key) = (path(&s.client.0), path(&s.client.1));
    let port = s.pg.port();
    // libpq's default files: ~/.postgresql/root.crt, postgresql.crt, postgresql.key.
    let libpq_home = Scratch::new();
    let dot = libpq_home.path(".postgresql");
    std::fs::create_dir(&dot).unwrap();
    std::fs::copy(s.ca.ca(), dot.join("root.crt")).unwrap();
    std::fs::copy(&s.client.0, dot.join("postgresql.crt")).unwrap();
    std::fs::copy(&s.client.1, dot.join("postgresql.key")).unwrap();
    let pw = || ("LOCKRUN_PASSWORD", PASSWORD.to_owned());
    let works = |what, url: String, env: Vec<(&'static str, String)>, tls, method| Works {
        what,
        url,
        env,
        tls,
        method,
        home: None,
    };
    let mut cases = vec![
        works(
            "disable",
            s.url("postgres", "127.0.0.1", "sslmode=disable"),
            vec![],
            false,
            None,
        ),
        works(
            "prefer by default",
            s.url("postgres", "127.0.0.1", "x=1").replace("?x=1", ""),
            vec![],
            true,
            None,
        ),
        works(
            "allow (taken as prefer)",
            s.url("postgres", "127.0.0.1", "sslmode=allow"),
            vec![],
            true,
            None,
        ),
        works(
            "require, no root",
            s.url("postgres", "127.0.0.1", "sslmode=require"),
            vec![],
            true,
            None,
        ),
        works(
            "require with LOCKRUN_TLS_CA (the chain checked)",
            s.url("postgres", "127.0.0.1", "sslmode=require"),
            vec![("LOCKRUN_TLS_CA", ca.clone())],
            true,
            None,
        ),
        works(
            "verify-ca to a name the certificate lacks",
            s.url(
                "postgres",
                "localhost",
                &format!("sslmode=verify-ca&sslrootcert={ca}"),
            ),
            vec![],
            true,
            None,
        ),
        works(
            "verify-full by IP address",
            s.url(
                "postgres",
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ),
            vec![],
            true,
            None,
        ),
        works(
            "verify-full with LOCKRUN_TLS_CA",
            s.url("postgres", "127.0.0.1", "sslmode=verify-full"),
            vec![("LOCKRUN_TLS_CA", ca.clone())],
            true,
            None,
        ),
        works(
            "verify-full, several hosts: each checked under its own name",
            format!(
                "postgres://postgres@localhost:{port},127.0.0.1:{port}/postgres?\
                 sslmode=verify-full&sslrootcert={ca}"
            ),
            vec![],
            true,
            None,
        ),
        works(
            "client certificate from sslcert and sslkey",
            s.url(
                "certuser",
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}"),
            ),
            vec![],
            true,
            Some("identity=\"CN=certuser\" method=cert"),
        ),
        works(
            "client certificate from LOCKRUN_TLS_CERT and _KEY",
            s.url("certuser", "127.0.0.1", "sslmode=verify-full"),
            vec![
                ("LOCKRUN_TLS_CA", ca.clone()),
                ("LOCKRUN_TLS_CERT", cert.clone()),
                ("LOCKRUN_TLS_KEY", key.clone()),
            ],
            true,
            Some("identity=\"CN=certuser\" method=cert"),
        ),
        works(
            "channel_binding=require with scram-sha-256 and verify-full",
            s.url(
                "scramuser",
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={ca}&channel_binding=require"),
            ),
            vec![pw()],
            true,
            Some("method=scram-sha-256"),
        ),
        works(
            "channel_binding=require with scram-sha-256 and require",
            s.url(
                "scramuser",
                "127.0.0.1",
                "sslmode=require&channel_binding=require",
            ),
            vec![pw()],
            true,
            Some("method=scram-sha-256"),
        ),
        works(
            "channel_binding=disable with scram-sha-256",
            s.url(
                "scramuser",
                "127.0.0.1",
                "sslmode=require&channel_binding=disable",
            ),
            vec![pw()],
            true,
            Some("method=scram-sha-256"),
        ),
    ];
    cases.push(Works {
        what: "libpq's default files in ~/.postgresql, verify-full",
        url: s.url("certuser", "127.0.0.1", "sslmode=verify-full"),
        env: vec![],
        tls: true,
        method: Some("identity=\"CN=certuser\" method=cert"),
        home: Some(libpq_home.path(".")),
    });

    // All at once: each its own lock name's row, in one table.
    let runs: Vec<(Running, Scratch, String)> = cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let app = format!("pgtls_case_{i}");
            let sep = if case.url.contains('?') { '&' } else { '?' };
            let url = format!("{}{sep}application_name={app}", case.url);
            let scratch = Scratch::new();
            let name = format!("job{i}");
            let mut cmd = s.lockrun(&url, &t.name, &name, &case.env, &scratch.path("ran"));
            if let Some(home) = &case.home {
                cmd.env("HOME", home);
            }
            (spawn(cmd), scratch, app)
        })
        .collect();
    let mut failures = Vec::new();
    for ((mut run, scratch, _), case) in runs.into_iter().zip(&cases) {
        let f = run.wait_for(Duration::from_secs(30));
        if f.code != Some(0) || !scratch.exists("ran") {
            failures.push(format!(
                "{}: exit {:?}: {}",
                case.what,
                f.code,
                f.stderr.trim()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The server's word on each session.
    let log = s.pg.log();
    for (i, case) in cases.iter().enumerate() {
        let app = format!("application_name=pgtls_case_{i}");
        let authorized: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("connection authorized") && l.contains(&app))
            .collect();
        assert!(
            !authorized.is_empty(),
            "{}: no session in the log:\n{log}",
            case.what
        );
        for line in &authorized {
            assert_eq!(
                line.contains("SSL enabled"),
                case.tls,
                "{}: {line}",
                case.what
            );
        }
        if let Some(method) = case.method {
            // The authenticated line comes just before the authorized one, same pid.
            let pid_of = |l: &str| {
                l.split_once(" [")
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .map(|(pid, _)| pid.to_owned())
            };
            let pids: Vec<_> = authorized.iter().filter_map(|l| pid_of(l)).collect();
            assert!(
                log.lines().any(|l| l.contains("connection authenticated")
                    && l.contains(method)
                    && pid_of(l).is_some_and(|p| pids.contains(&p))),
                "{}: no {method:?} in the log:\n{log}",
                case.what
            );
        }
    }
}

#[test]
fn a_lock_is_taken_held_and_released_through_verify_full_with_a_client_certificate() {
    let s = Setup::new();
    let t = Table::on(&s.pg.url());
    let url = s.url(
        "certuser",
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            path(&s.ca.ca()),
            path(&s.client.0),
            path(&s.client.1)
        ),
    );
    let scratch = Scratch::new();
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
    .env("HOME", s.home.path("."));
    let (mut holder, token) = hold(cmd, &scratch);
    assert!(t.held("job"), "the lock is not held while the command runs");
    // The server's view of lockrun's session: encrypted, with certuser's certificate.
    let session = t.db.value(
        "SELECT s.ssl::text || ' ' || coalesce(s.client_dn, '-') FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.usename = 'certuser' \
         AND a.application_name = 'lockrun'",
    );
    assert_eq!(session.as_deref(), Some("true /CN=certuser"));
    // A second lockrun through the same URL finds it held.
    let mut busy = lockrun_run(&url, "job", &["--pg-table", &t.name], &["true"]);
    busy.env("HOME", s.home.path("."));
    let busy = run(busy);
    assert_eq!(busy.code, Some(75), "{}", busy.stderr);
    scratch.touch("go");
    holder.wait().assert_code(0);
    assert!(!t.held("job"), "the lock was not released");
    let fence = t.sql("job", "SELECT fence::text FROM $T WHERE name = $K");
    assert_eq!(fence, Some(token.to_string()));
}

/// Runs `case` against `s`'s lock table, and checks its line.
fn refused(case: &Refusal, secrets: &[&str]) {
    let secrets: Vec<&str> = secrets
        .iter()
        .copied()
        .chain([PASSWORD, WRONG, "PRIVATE", "postgres://"])
        .collect();
    let opts = ["--pg-table", "lockrun_tls_errors"];
    case.check(&opts, Duration::from_secs(5), &secrets);
}

#[test]
fn every_refused_tls_or_authentication_setup_is_one_line_saying_what_to_set() {
    let s = Setup::new();
    let ca = path(&s.ca.ca());
    let cert = path(&s.client.0);
    let (stray_cert, stray_key) =
        s.stranger
            .issue("client", "certuser", "extendedKeyUsage=clientAuth", false);
    let (stray_cert, stray_key) = (path(&stray_cert), path(&stray_key));
    let open_key = s.home.path("open.key");
    std::fs::copy(&s.client.1, &open_key).unwrap();
    std::fs::set_permissions(
        &open_key,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let not_pem = s.home.path("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    // Key material: a line of the client key's base64.
    let key_pem = std::fs::read_to_string(&s.client.1).unwrap();
    let key_line = key_pem.lines().nth(1).unwrap().to_owned();
    let secrets = [key_line.as_str()];
    let full = |user: &str, host: &str, more: &str| {
        s.url(
            user,
            host,
            &format!("sslmode=verify-full&sslrootcert={ca}{more}"),
        )
    };
    let pw = |p: &str| vec![("LOCKRUN_PASSWORD", p.to_owned())];
    let home = ("HOME", path(&s.home.path(".")));
    let case = |what, url, mut env: Vec<(&'static str, String)>, says| {
        env.push(home.clone());
        Refusal {
            what,
            url,
            env,
            says,
            never: vec![],
        }
    };
    let cases = [
        case(
            "verify-full, the server's CA unknown",
            s.url(
                "postgres",
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={}", path(&s.stranger.ca())),
            ),
            vec![],
            vec!["signed by an unknown CA", "set sslrootcert=FILE"],
        ),
        case(
            "require with LOCKRUN_TLS_CA of another CA: the chain is checked, as libpq does",
            s.url("postgres", "127.0.0.1", "sslmode=require"),
            vec![("LOCKRUN_TLS_CA", path(&s.stranger.ca()))],
            vec!["signed by an unknown CA"],
        ),
        case(
            "verify-full to localhost, a certificate for 127.0.0.1 only",
            full("postgres", "localhost", ""),
            vec![],
            vec![
                "not valid for the host name localhost (it names: 127.0.0.1)",
                "sslmode=verify-ca",
            ],
        ),
        case(
            "verify-full without any root",
            s.url("postgres", "127.0.0.1", "sslmode=verify-full"),
            vec![],
            vec![
                "sslmode=verify-full needs the CA",
                "sslrootcert=system",
                "LOCKRUN_TLS_CA",
            ],
        ),
        case(
            "a client certificate demanded, none given",
            full("certuser", "127.0.0.1", ""),
            vec![],
            vec![
                "requires a client certificate",
                "sslcert=FILE and sslkey=FILE",
            ],
        ),
        case(
            "a client certificate from another CA",
            full(
                "certuser",
                "127.0.0.1",
                &format!("&sslcert={stray_cert}&sslkey={stray_key}"),
            ),
            vec![],
            vec!["the server refused the client certificate", "ssl_ca_file"],
        ),
        case(
            "channel_binding=require against trust",
            full("postgres", "127.0.0.1", "&channel_binding=require"),
            vec![],
            vec!["did not use channel binding", "scram-sha-256"],
        ),
        case(
            "channel_binding=require against md5",
            full("md5user", "127.0.0.1", "&channel_binding=require"),
            pw(PASSWORD),
            vec!["did not use channel binding", "scram-sha-256"],
        ),
        case(
            "channel_binding=require without TLS",
            s.url(
                "postgres",
                "127.0.0.1",
                "sslmode=disable&channel_binding=require",
            ),
            vec![],
            vec!["channel_binding=require needs TLS"],
        ),
        case(
            "a wrong password",
            full("scramuser", "127.0.0.1", ""),
            pw(WRONG),
            vec!["refused the password", "LOCKRUN_PASSWORD"],
        ),
        case(
            "a wrong password in the URL",
            full("scramuser", "127.0.0.1", "")
                .replace("scramuser@", &format!("scramuser:{WRONG}@")),
            vec![],
            vec!["refused the password"],
        ),
        case(
            "no password",
            full("scramuser", "127.0.0.1", ""),
            vec![],
            vec!["asks for a password and none was given", "LOCKRUN_PASSWORD"],
        ),
        case(
            "no pg_hba.conf line without TLS",
            s.url("tlsonly", "127.0.0.1", "sslmode=disable"),
            vec![],
            vec!["no pg_hba.conf line", "sslmode=require"],
        ),
        case(
            "sslrootcert unreadable",
            s.url(
                "postgres",
                "127.0.0.1",
                "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            ),
            vec![],
            vec!["cannot read sslrootcert (/nonexistent/ca.pem)"],
        ),
        case(
            "sslrootcert without a certificate",
            full("postgres", "127.0.0.1", "").replace(&ca, &path(&not_pem)),
            vec![],
            vec!["holds no PEM certificate", "sslrootcert="],
        ),
        case(
            "sslkey unreadable (a directory)",
            full(
                "certuser",
                "127.0.0.1",
                &format!("&sslcert={cert}&sslkey=/tmp"),
            ),
            vec![],
            vec!["cannot read sslkey (/tmp)"],
        ),
        case(
            "sslkey open to others",
            full(
                "certuser",
                "127.0.0.1",
                &format!("&sslcert={cert}&sslkey={}", path(&open_key)),
            ),
            vec![],
            vec!["can be read by others (mode 0644)", "chmod 600"],
        ),
        case(
            "sslcert without sslkey",
            full("certuser", "127.0.0.1", &format!("&sslcert={cert}")),
            vec![],
            vec!["sslcert and sslkey go together"],
        ),
        case(
            "LOCKRUN_TLS_KEY of another certificate",
            full("certuser", "127.0.0.1", ""),
            vec![
                ("LOCKRUN_TLS_CERT", cert.clone()),
                ("LOCKRUN_TLS_KEY", stray_key.clone()),
            ],
            vec![
                "the client key does not belong to the client certificate",
                "LOCKRUN_TLS_CERT",
            ],
        ),
        case(
            "sslrootcert=system with sslmode=require",
            s.url(
                "postgres",
                "127.0.0.1",
                "sslmode=require&sslrootcert=system",
            ),
            vec![],
            vec!["sslrootcert=system needs sslmode=verify-full"],
        ),
        case(
            "a parameter lockrun does not know",
            s.url("postgres", "127.0.0.1", "sslcrl=/x"),
            vec![],
            vec!["\"sslcrl\""],
        ),
    ];
    for case in &cases {
        refused(case, &secrets);
    }

    // A certificate for another name: verify-full to 127.0.0.1 refuses it, verify-ca not.
    let (other, other_key) = s.ca.issue(
        "other",
        "pg-other-name",
        "subjectAltName=DNS:db.other.example",
        false,
    );
    s.pg.swap_server_cert(&other, &other_key, "pg-other-name");
    refused(
        &case(
            "verify-full to 127.0.0.1, a certificate for another name",
            full("postgres", "127.0.0.1", ""),
            vec![],
            vec!["not valid for the host name 127.0.0.1 (it names: db.other.example)"],
        ),
        &secrets,
    );
    let scratch = Scratch::new();
    let url = s.url(
        "postgres",
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    );
    let f = run(s.lockrun(&url, "lockrun_tls_errors", "job", &[], &scratch.path("ran")));
    f.assert_code(0);

    // An expired certificate.
    let (expired, expired_key) =
        s.ca.issue("expired", "pg-expired", "subjectAltName=IP:127.0.0.1", true);
    s.pg.swap_server_cert(&expired, &expired_key, "pg-expired");
    for mode in ["verify-full", "verify-ca"] {
        refused(
            &case(
                "an expired certificate",
                s.url(
                    "postgres",
                    "127.0.0.1",
                    &format!("sslmode={mode}&sslrootcert={ca}"),
                ),
                vec![],
                vec!["the server's certificate has expired", "renew"],
            ),
            &secrets,
        );
    }

    // Channel binding with a certificate signed with SHA-384: the end point is hashed
    // with SHA-384 (RFC 5929), as the server hashes it.
    let (sha384, sha384_key) = s.ca.issue_signed(
        "sha384",
        "pg-sha384",
        "subjectAltName=IP:127.0.0.1",
        false,
        "sha384",
    );
    s.pg.swap_server_cert(&sha384, &sha384_key, "pg-sha384");
    let url = full("scramuser", "127.0.0.1", "&channel_binding=require");
    let cmd = s.lockrun(
        &url,
        "lockrun_tls_errors",
        "job",
        &pw(PASSWORD),
        &scratch.path("ran"),
    );
    run(cmd).assert_code(0);

    // No TLS at the server.
    s.pg.ssl_off();
    for query in [
        "sslmode=require".to_owned(),
        format!("sslmode=verify-full&sslrootcert={ca}"),
    ] {
        refused(
            &case(
                "no TLS at the server",
                s.url("postgres", "127.0.0.1", &query),
                vec![],
                vec!["does not offer TLS", "ssl = on"],
            ),
            &secrets,
        );
    }
}
