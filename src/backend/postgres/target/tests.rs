//! Unit tests of [`super`] (`backend::postgres::target`).

use super::*;
use crate::backend::url::testing::{ctx, options};

#[test]
fn postgres_urls_parse_and_hide_the_password() {
    let a = options();
    let pg = parse(
        "postgres://u:pw@db.example:6543/app?sslmode=disable",
        &ctx(&a, None),
    )
    .unwrap();
    assert_eq!(pg.display(), "db.example:6543");
    assert!(pg.tls.is_none());
    assert_eq!(pg.table, "lockrun_locks");
    assert!(!format!("{pg:?}").contains("pw@") && !format!("{pg:?}").contains("\"pw\""));
    let pg = parse("postgresql://localhost/test", &ctx(&a, Some("envpw"))).unwrap();
    assert_eq!(pg.config.get_password(), Some(&b"envpw"[..]));
    assert_eq!(
        pg.tls.unwrap().mode,
        SslMode::Prefer,
        "sslmode defaults to prefer"
    );
}

#[test]
fn port_0_is_refused() {
    let a = options();
    for url in [
        "postgres://u:pw@h:0/db",
        "postgresql://h1:5432,h2:0/db",
        "postgres://h/db?port=0",
    ] {
        let e = parse(url, &ctx(&a, None)).unwrap_err();
        assert_eq!(e, UrlError::PortZero, "{url}");
    }
    assert!(parse("postgres://h:5432/db", &ctx(&a, None)).is_ok());
}

#[test]
fn the_table_name_must_be_a_plain_identifier() {
    let mut a = options();
    a.pg_table = "x; drop table y".into();
    assert!(matches!(
        parse("postgres://localhost/test", &ctx(&a, None)),
        Err(UrlError::Backend(m)) if m.contains("--pg-table")
    ));
    assert!(valid_table_name("locks.lockrun_leases"));
    assert!(!valid_table_name("a.b.c"));
}

/// Parses `url` with the environment `env` (name, value).
#[test]
fn a_raw_at_in_the_password_is_refused_without_echoing_it() {
    let a = options();
    for url in [
        "postgres://u:MARK@x@127.0.0.1/db",
        "postgresql://u@MARK:pw@h:5432/db?sslmode=disable",
    ] {
        let e = parse(url, &ctx(&a, None)).unwrap_err().to_string();
        assert!(e.contains("%40") && !e.contains("MARK"), "{url}: {e}");
    }
    let pg = parse("postgres://u:MARK%40x@127.0.0.1/db", &ctx(&a, None)).unwrap();
    assert_eq!(pg.display(), "127.0.0.1:5432");
    assert_eq!(pg.config.get_password(), Some(&b"MARK@x"[..]));
    // An `@` after the host (in the query) is not in the user information.
    assert!(parse("postgres://h/db?application_name=a@b", &ctx(&a, None)).is_ok());
}

fn parse_env(url: &str, env: &[(&str, String)]) -> Result<PostgresTarget, UrlError> {
    let a = options();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let get = move |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let ctx = UrlContext {
        password: None,
        options: &a,
        env: &get,
    };
    parse(url, &ctx)
}

fn line(r: Result<PostgresTarget, UrlError>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn libpq_parameters_are_taken_out_and_the_rest_passed_on() {
    let (rest, p) = split_params(
        "postgres://u:p%3F@h1,h2:5433/db?sslmode=verify-full&application_name=x\
         &sslrootcert=%2Ftmp%2Fca%20x.pem&channel_binding=require&sslmode=require",
    )
    .unwrap();
    assert_eq!(rest, "postgres://u:p%3F@h1,h2:5433/db?application_name=x");
    assert_eq!(p.sslmode.as_deref(), Some("require"), "the last one wins");
    assert_eq!(p.sslrootcert.as_deref(), Some("/tmp/ca x.pem"));
    assert_eq!(p.channel_binding.as_deref(), Some("require"));
    let (rest, _) = split_params("postgres://h/db?sslmode=disable").unwrap();
    assert_eq!(rest, "postgres://h/db");
    let e = line(parse_env("postgres://h/db?sslcrl=/x&password=pw", &[]));
    assert!(e.contains("\"sslcrl\"") && !e.contains("pw"), "{e}");
    let e = line(parse_env("postgres://h/db?sslmode=verify-all", &[]));
    assert!(e.starts_with("sslmode=verify-all is not valid"), "{e}");
    let e = line(parse_env("postgres://h/db?gssencmode=require", &[]));
    assert!(e.contains("gssencmode=disable"), "{e}");
    assert!(parse_env("postgres://h/db?gssencmode=disable", &[]).is_ok());
}

/// The mode and the server check of `url` parsed with the environment `env`.
fn check(url: &str, env: &[(&str, String)]) -> Option<(SslMode, ServerCheck)> {
    let t = parse_env(url, env).unwrap().tls;
    t.map(|t| (t.mode, t.check))
}

#[test]
fn sslmode_and_the_roots_decide_what_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    crate::backend::tls::testing::ca_and_server(d, "ca", "DNS:db.example");
    let ca = d.join("ca.pem").display().to_string();
    use ServerCheck::*;
    assert_eq!(check("postgres://h/db?sslmode=disable", &[]), None);
    assert_eq!(
        check("postgres://h/db", &[]),
        Some((SslMode::Prefer, EncryptOnly))
    );
    assert_eq!(
        check("postgres://h/db?sslmode=allow", &[]),
        Some((SslMode::Prefer, EncryptOnly))
    );
    assert_eq!(
        check("postgres://h/db?sslmode=require", &[]),
        Some((SslMode::Require, EncryptOnly))
    );
    // A root makes require check the chain, as libpq does.
    let with_ca = format!("postgres://h/db?sslmode=require&sslrootcert={ca}");
    assert_eq!(check(&with_ca, &[]), Some((SslMode::Require, Chain)));
    let env_ca = [("LOCKRUN_TLS_CA", ca.clone())];
    assert_eq!(
        check("postgres://h/db?sslmode=require", &env_ca),
        Some((SslMode::Require, Chain))
    );
    assert_eq!(
        check("postgres://h/db?sslmode=verify-ca", &env_ca),
        Some((SslMode::VerifyCa, Chain))
    );
    assert_eq!(
        check(
            &format!("postgres://h/db?sslmode=verify-full&sslrootcert={ca}"),
            &[]
        ),
        Some((SslMode::VerifyFull, ChainAndNameOrCommonName))
    );
    // libpq's default root file, under HOME.
    std::fs::create_dir(d.join(".postgresql")).unwrap();
    std::fs::copy(d.join("ca.pem"), d.join(".postgresql/root.crt")).unwrap();
    let home = [("HOME", d.display().to_string())];
    assert_eq!(
        check("postgres://h/db?sslmode=verify-full", &home),
        Some((SslMode::VerifyFull, ChainAndNameOrCommonName))
    );
}

#[test]
fn sslrootcert_system_means_verify_full_and_the_stricter_modes_need_a_root() {
    use ServerCheck::*;
    // sslrootcert=system: verify-full by default, and nothing weaker.
    assert_eq!(
        check("postgres://h/db?sslrootcert=system", &[]),
        Some((SslMode::VerifyFull, ChainAndNameOrCommonName))
    );
    let e = line(parse_env(
        "postgres://h/db?sslrootcert=system&sslmode=require",
        &[],
    ));
    assert!(e.contains("needs sslmode=verify-full"), "{e}");
    for mode in ["verify-ca", "verify-full"] {
        let e = line(parse_env(&format!("postgres://h/db?sslmode={mode}"), &[]));
        assert!(
            e.starts_with(&format!("sslmode={mode} needs the CA"))
                && e.contains("sslrootcert=system"),
            "{e}"
        );
    }
}

#[test]
fn channel_binding_require_needs_tls_and_unix_sockets_never_use_it() {
    let e = line(parse_env(
        "postgres://h/db?sslmode=disable&channel_binding=require",
        &[],
    ));
    assert!(e.contains("channel_binding=require needs TLS"), "{e}");
    // As libpq: no TLS over a Unix-domain socket, whatever sslmode says.
    let pg = parse_env(
        "postgres:///db?host=%2Fvar%2Frun%2Fpostgresql&sslmode=verify-full",
        &[],
    )
    .unwrap();
    assert!(pg.tls.is_none());
    assert_eq!(
        pg.config.get_ssl_mode(),
        tokio_postgres::config::SslMode::Disable
    );
    let pg = parse_env("postgres://h/db?channel_binding=require", &[]).unwrap();
    assert_eq!(
        pg.config.get_channel_binding(),
        tokio_postgres::config::ChannelBinding::Require
    );
}

#[test]
fn tls_files_are_read_once_and_refused_in_one_line() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    crate::backend::tls::testing::ca_and_server(d, "ca", "DNS:client");
    let p = |n: &str| d.join(n).display().to_string();
    let missing = line(parse_env(
        "postgres://h/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem",
        &[],
    ));
    assert_eq!(
        missing,
        "cannot read sslrootcert (/nonexistent/ca.pem): entity not found"
    );
    std::fs::write(d.join("empty.pem"), "nothing").unwrap();
    let empty = line(parse_env(
        &format!(
            "postgres://h/db?sslmode=verify-ca&sslrootcert={}",
            p("empty.pem")
        ),
        &[],
    ));
    assert!(
        empty.starts_with("the CA file holds no PEM certificate (sslrootcert="),
        "{empty}"
    );
    let key = p("ca-server.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let client = format!(
        "postgres://h/db?sslmode=require&sslcert={}&sslkey={key}",
        p("ca-server.pem")
    );
    let open_key = line(parse_env(&client, &[]));
    assert!(open_key.contains("(mode 0644): chmod 600"), "{open_key}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let pg = parse_env(&client, &[]).unwrap();
    assert!(pg.tls.as_ref().unwrap().client_cert);
    assert!(!format!("{pg:?}").contains("PRIVATE"));
    let half = line(parse_env(
        &format!("postgres://h/db?sslcert={}", p("ca-server.pem")),
        &[],
    ));
    assert_eq!(half, "sslcert and sslkey go together: give both or neither");
    // The environment's pair is the fallback.
    let env = [
        ("LOCKRUN_TLS_CERT", p("ca-server.pem")),
        ("LOCKRUN_TLS_KEY", key.clone()),
    ];
    let pg = parse_env("postgres://h/db?sslmode=require", &env).unwrap();
    assert!(pg.tls.unwrap().client_cert);
    // Nothing is read with sslmode=disable.
    let env = [("LOCKRUN_TLS_CA", "/nonexistent".to_owned())];
    assert!(parse_env("postgres://h/db?sslmode=disable", &env).is_ok());
}
