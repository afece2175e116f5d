//! `rediss://`: TLS to Redis with a private CA (`LOCKRUN_TLS_CA`) and client certificates
//! (`LOCKRUN_TLS_CERT`, `LOCKRUN_TLS_KEY`); an untrusted server or a missing client
//! certificate fails closed.

use crate::support::*;

/// Records the fencing token in `$OUT`.
const RECORD: &str = r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#;

#[test]
fn rediss_with_a_private_ca_works() {
    let redis = RedisServer::with_tls(TlsFiles::generate(false));
    let s = Scratch::new();
    let mut cmd = lockrun_run(&redis.tls_url(), "job", &[], &sh(RECORD));
    cmd.env("OUT", s.path("out"))
        .env("LOCKRUN_TLS_CA", redis_tls_path(&redis, "ca.pem"));
    run(cmd).assert_code(0);
    parse_token(&wait_line(&s.path("out")));
    assert!(!redis.lock_held("job"));
}

#[test]
fn rediss_with_an_untrusted_certificate_fails_closed() {
    let redis = RedisServer::with_tls(TlsFiles::generate(false));
    let s = Scratch::new();
    let mut cmd = lockrun_run(&redis.tls_url(), "job", &[], &sh(RECORD));
    cmd.env("OUT", s.path("out"));
    run(cmd).assert_failure(125);
    assert!(
        !s.exists("out"),
        "the command ran over an untrusted TLS connection"
    );
}

#[test]
fn rediss_with_a_client_certificate_works() {
    let redis = RedisServer::with_tls(TlsFiles::generate(true));
    let s = Scratch::new();
    let mut cmd = lockrun_run(&redis.tls_url(), "job", &[], &sh(RECORD));
    cmd.env("OUT", s.path("out"))
        .env("LOCKRUN_TLS_CA", redis_tls_path(&redis, "ca.pem"))
        .env("LOCKRUN_TLS_CERT", redis_tls_path(&redis, "client.pem"))
        .env("LOCKRUN_TLS_KEY", redis_tls_path(&redis, "client.key"));
    run(cmd).assert_code(0);
    parse_token(&wait_line(&s.path("out")));
}

#[test]
fn rediss_without_a_required_client_certificate_fails_closed() {
    let redis = RedisServer::with_tls(TlsFiles::generate(true));
    let s = Scratch::new();
    let mut cmd = lockrun_run(&redis.tls_url(), "job", &[], &sh(RECORD));
    cmd.env("OUT", s.path("out"))
        .env("LOCKRUN_TLS_CA", redis_tls_path(&redis, "ca.pem"));
    run(cmd).assert_failure(125);
    assert!(!s.exists("out"));
}

fn redis_tls_path(redis: &RedisServer, name: &str) -> std::path::PathBuf {
    redis.tls_files().path(name)
}
