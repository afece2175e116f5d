//! Every way a Redis connection is set up wrong ends in one line on stderr, exit 125,
//! within 2 s, saying what is wrong and what to set, and never showing a password: no
//! password where one is required, a wrong one, a server certificate no CA given
//! signed (with and without `LOCKRUN_TLS_CA`), a client certificate demanded or
//! refused, and the wrong scheme for the port (`redis://` at a TLS port, `rediss://`
//! at a plain one). Each case runs a plain run and a `--wait` run (which speaks
//! `HELLO` first) against real servers.

use std::time::Duration;

use crate::support::*;

const PASSWORD: &str = "errs-Pw-7c21";
const WRONG: &str = "wrong-Pw-3e8a";

/// The port of a `rediss://127.0.0.1:PORT` URL.
fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

/// Runs `case` with `opts`, and checks its line.
fn check(case: &Refusal, opts: &[&str]) {
    case.check(opts, Duration::from_secs(2), &[PASSWORD, WRONG]);
}

#[test]
fn every_misconfigured_connection_says_what_to_set_in_one_line() {
    let with_password = RedisServer::with_password(PASSWORD);
    let tls = RedisServer::with_tls(TlsFiles::generate(false));
    let mtls = RedisServer::with_tls(TlsFiles::generate(true));
    // Another CA, and a client certificate it signed: trusted by neither server.
    let stranger = TlsFiles::generate(true);
    let path = |files: &TlsFiles, name: &str| files.path(name).display().to_string();
    let ca = |server: &RedisServer| ("LOCKRUN_TLS_CA", path(server.tls_files(), "ca.pem"));
    let cases = [
        Refusal {
            what: "no password against requirepass",
            url: with_password.url(),
            env: vec![],
            says: vec!["requires a password", "LOCKRUN_PASSWORD"],
            never: vec!["Protocol error"],
        },
        Refusal {
            what: "a wrong password in the URL",
            url: format!("redis://:{WRONG}@127.0.0.1:{}", with_password.port()),
            env: vec![],
            says: vec![
                "refused the password of user \"default\"",
                "check the password",
            ],
            never: vec![],
        },
        Refusal {
            what: "a wrong password in LOCKRUN_PASSWORD",
            url: with_password.url(),
            env: vec![("LOCKRUN_PASSWORD", WRONG.into())],
            says: vec!["refused the password", "LOCKRUN_PASSWORD"],
            never: vec![],
        },
        Refusal {
            what: "a server certificate, no LOCKRUN_TLS_CA",
            url: tls.tls_url(),
            env: vec![],
            says: vec!["no CA of this system signed", "set LOCKRUN_TLS_CA"],
            never: vec![],
        },
        Refusal {
            what: "a server certificate another CA signed than LOCKRUN_TLS_CA's",
            url: tls.tls_url(),
            env: vec![("LOCKRUN_TLS_CA", path(&stranger, "ca.pem"))],
            says: vec![
                "the CA in LOCKRUN_TLS_CA did not sign",
                "point LOCKRUN_TLS_CA at",
            ],
            never: vec!["set LOCKRUN_TLS_CA"],
        },
        Refusal {
            what: "a client certificate demanded, none given",
            url: mtls.tls_url(),
            env: vec![ca(&mtls)],
            says: vec![
                "demands a client certificate",
                "set LOCKRUN_TLS_CERT and LOCKRUN_TLS_KEY",
            ],
            never: vec!["LOCKRUN_TLS_CA"],
        },
        Refusal {
            what: "a client certificate the server does not trust",
            url: mtls.tls_url(),
            env: vec![
                ca(&mtls),
                ("LOCKRUN_TLS_CERT", path(&stranger, "client.pem")),
                ("LOCKRUN_TLS_KEY", path(&stranger, "client.key")),
            ],
            says: vec!["did not accept the client certificate of LOCKRUN_TLS_CERT"],
            never: vec!["set LOCKRUN_TLS_CA"],
        },
        Refusal {
            what: "redis:// at a TLS port",
            url: format!("redis://127.0.0.1:{}", port_of(&tls.tls_url())),
            env: vec![],
            says: vec!["speaks TLS on that port", "use rediss://"],
            never: vec!["connection closed"],
        },
        Refusal {
            what: "rediss:// at a plain port",
            url: format!("rediss://127.0.0.1:{}", tls.port()),
            env: vec![ca(&tls)],
            says: vec!["answers without TLS on that port", "use redis://"],
            never: vec![],
        },
    ];
    for case in &cases {
        check(case, &[]);
        check(case, &["--wait", "10s"]);
    }
}
