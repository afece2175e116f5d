//! TLS to MariaDB as the `mysql` client names it: a server with a certificate from a test
//! CA for `localhost` only. `VERIFY_IDENTITY` connects by that name and refuses the
//! address the certificate does not name; `VERIFY_CA` takes any name but not another
//! CA; `REQUIRED` encrypts without checking, and refuses a server without TLS, which
//! `PREFERRED` speaks to in plain text; a user that requires a client certificate gets
//! in with `ssl-cert` and `ssl-key`. Each refusal is one 125 line.

use crate::support::*;

/// A server with a certificate for DNS name `localhost` (no IP address) from `ca`.
fn server(ca: &TestCa) -> PrivateMysql {
    let (cert, key) = ca.issue("server", "localhost", "subjectAltName=DNS:localhost", false);
    PrivateMysql::start_tls(&cert, &key)
}

/// `lockrun` of `job` at `host` with `query`; the finished run.
fn run_at(server: &PrivateMysql, host: &str, query: &str) -> Finished {
    let url = format!("mysql://root@{host}:{}/lockrun?{query}", server.port());
    run(lockrun_run(&url, "job", &[], &["true"]))
}

/// How many TLS handshakes the server accepted.
fn accepts(server: &PrivateMysql) -> u64 {
    let sql = "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
               WHERE VARIABLE_NAME = 'SSL_ACCEPTS'";
    server.db("mysql").value(sql).unwrap().parse().unwrap()
}

/// Asserts one 125 line holding `want`.
fn refused(f: &Finished, want: &str) {
    f.assert_failure(125);
    assert_eq!(f.stderr.lines().count(), 1, "{}", f.stderr);
    assert!(f.stderr.contains(want), "{want:?} missing: {}", f.stderr);
}

#[test]
fn verify_identity_connects_by_the_certificates_name_and_refuses_another() {
    let ca = TestCa::new("mysql");
    let server = server(&ca);
    let ca_file = ca.ca();
    let ca_file = ca_file.to_str().unwrap();
    let q = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca_file}");
    let before = accepts(&server);
    run_at(&server, "localhost", &q).assert_code(0);
    assert!(accepts(&server) > before, "no TLS handshake");
    refused(&run_at(&server, "127.0.0.1", &q), "TLS refused");
    // VERIFY_CA takes the address; not a certificate from another CA.
    run_at(
        &server,
        "127.0.0.1",
        &format!("ssl-mode=VERIFY_CA&ssl-ca={ca_file}"),
    )
    .assert_code(0);
    let other = TestCa::new("other");
    let other = other.ca();
    let q = format!("ssl-mode=VERIFY_CA&ssl-ca={}", other.to_str().unwrap());
    refused(&run_at(&server, "127.0.0.1", &q), "ssl-ca");
}

#[test]
fn required_encrypts_and_refuses_a_server_without_tls_which_preferred_takes() {
    let ca = TestCa::new("mysql-required");
    let server = server(&ca);
    let before = accepts(&server);
    run_at(&server, "127.0.0.1", "ssl-mode=REQUIRED").assert_code(0);
    run_at(&server, "127.0.0.1", "").assert_code(0);
    assert!(
        accepts(&server) >= before + 2,
        "REQUIRED and PREFERRED must encrypt"
    );
    let plain = PrivateMysql::start();
    refused(
        &run_at(&plain, "127.0.0.1", "ssl-mode=REQUIRED"),
        "does not offer TLS",
    );
    run_at(&plain, "127.0.0.1", "ssl-mode=PREFERRED").assert_code(0);
}

#[test]
fn a_user_that_requires_a_certificate_gets_in_with_ssl_cert_and_ssl_key() {
    let ca = TestCa::new("mysql-clients");
    let (cert, key) = ca.issue("server", "localhost", "subjectAltName=DNS:localhost", false);
    let server = PrivateMysql::start_tls_clients(&cert, &key, &ca.ca());
    let admin = server.db("mysql");
    admin.exec("CREATE USER 'certuser'@'127.0.0.1' REQUIRE X509");
    admin.exec("GRANT ALL ON lockrun.* TO 'certuser'@'127.0.0.1'");
    let (ccert, ckey) = ca.issue("client", "certuser", "extendedKeyUsage=clientAuth", false);
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let url = |query: &str| {
        format!(
            "mysql://certuser@127.0.0.1:{}/lockrun?ssl-mode=VERIFY_CA&ssl-ca={}{query}",
            server.port(),
            path(&ca.ca())
        )
    };
    let with_cert = url(&format!(
        "&ssl-cert={}&ssl-key={}",
        path(&ccert),
        path(&ckey)
    ));
    run(lockrun_run(&with_cert, "job", &[], &["true"])).assert_code(0);
    refused(
        &run(lockrun_run(&url(""), "job", &[], &["true"])),
        "ssl-cert and ssl-key",
    );
}

#[test]
fn bad_tls_files_are_refused_before_connecting() {
    let port = closed_port();
    let s = Scratch::new();
    std::fs::write(s.path("junk.pem"), "not a certificate").unwrap();
    let junk = s.path("junk.pem");
    let junk = junk.to_str().unwrap();
    for (query, want) in [
        (format!("ssl-mode=VERIFY_CA&ssl-ca={junk}"), "certificate"),
        (
            "ssl-mode=REQUIRED&ssl-ca=/nonexistent.pem".to_owned(),
            "ssl-ca",
        ),
        (
            format!("ssl-cert={junk}"),
            "ssl-cert and ssl-key go together",
        ),
        (
            format!("ssl-mode=DISABLED&ssl-ca={junk}"),
            "DISABLED and TLS files",
        ),
        (
            "ssl-mode=sometimes".to_owned(),
            "ssl-mode=sometimes is not valid",
        ),
    ] {
        let url = format!("mysql://root@127.0.0.1:{port}/lockrun?{query}");
        refused(&run(lockrun_run(&url, "job", &[], &["true"])), want);
    }
}
