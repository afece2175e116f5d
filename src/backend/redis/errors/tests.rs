//! Unit tests of [`super`] (`backend::redis::errors`).

use super::*;

fn ctx(user: Option<&'static str>, password: bool) -> Context<'static> {
    Context {
        at: "h:1",
        user,
        password,
        tls: None,
        key_prefix: "lockrun:",
    }
}

/// The error of a server that answered `-CODE detail`.
fn server(code: &'static str, detail: &str) -> RedisError {
    let reply = format!("-{code} {detail}\r\n");
    let value = redis::parse_redis_value(reply.as_bytes()).unwrap();
    value.extract_error().unwrap_err()
}

fn line(e: &RedisError, ctx: &Context<'_>, script: Option<Script>) -> String {
    match describe_in(e, ctx, script) {
        BackendError::Refused(m) => m,
        other => panic!("not a refusal: {other:?}"),
    }
}

#[test]
fn authentication_and_permission_errors_are_refusals() {
    let e = RedisError::from((ErrorKind::AuthenticationFailed, "auth", "bad".to_owned()));
    let d = line(&e, &ctx(None, true), None);
    assert!(
        d.starts_with("Redis at h:1 refused the password of user \"default\""),
        "{d}"
    );
    assert!(!d.contains("()"), "{d}");
    let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    assert_eq!(
        describe(&io, "h:1"),
        BackendError::Unavailable("cannot reach Redis at h:1: connection refused".into())
    );
}

#[test]
fn a_missing_password_says_to_set_one() {
    for e in [
        server("ERR", "Protocol error: unauthenticated multibulk length"),
        server("NOAUTH", "Authentication required."),
        server(
            "NOAUTH",
            "HELLO must be called with the client already authenticated",
        ),
    ] {
        let d = line(&e, &ctx(None, false), None);
        assert!(
            d.contains("requires a password") && d.contains("LOCKRUN_PASSWORD"),
            "{d}"
        );
    }
    let e = server(
        "WRONGPASS",
        "invalid username-password pair or user is disabled.",
    );
    let d = line(&e, &ctx(Some("app"), true), None);
    assert!(d.contains("refused the password of user \"app\""), "{d}");
}

#[test]
fn a_command_denied_inside_a_script_is_named_from_its_line() {
    let src = Script::Acquire.source();
    let n = src
        .lines()
        .position(|l| l.contains("redis.call('PTTL'"))
        .unwrap()
        + 1;
    let e = server(
        "ERR",
        &format!(
            "The user executing the script can't run this command or subcommand script: \
             43761249a5e42637f9639eea2ce4f422c1a8fcd1, on @user_script:{n}."
        ),
    );
    let d = line(&e, &ctx(Some("locker"), true), Some(Script::Acquire));
    assert_eq!(
        d,
        "Redis at h:1 does not let user \"locker\" run PTTL (inside lockrun's acquire \
         script): grant it with ACL SETUSER locker +pttl (docs/backends.md, \"Redis keys\", gives \
         the whole rule)"
    );
}

#[test]
fn every_wording_of_a_denial_is_understood() {
    let cases = [
        // Redis 6.2 / 7.0, outside a script.
        ("NOPERM", "this user has no permissions to run the 'subscribe' command", "run SUBSCRIBE"),
        ("NOPERM", "this user has no permissions to run the 'eval' command", "+eval"),
        ("NOPERM", "this user has no permissions to access one of the keys used as arguments", "~lockrun:*"),
        ("NOPERM", "this user has no permissions to access one of the channels used as arguments", "&lockrun:*"),
        // Redis 7.0, inside a script.
        ("ERR", "The user executing the script can't access at least one of the keys mentioned in the command arguments script: 3b0b, on @user_script:1.", "~lockrun:*"),
        ("ERR", "The user executing the script can't publish to the channel mentioned in the command script: 3b0b, on @user_script:1.", "&lockrun:*"),
        // Redis 7.2+ and Valkey.
        ("NOPERM", "User locker has no permissions to run the 'pttl' command", "+pttl"),
        ("ERR", "ACL failure in script: User locker has no permissions to run the 'hset' command script: 3b0b, on @user_script:9.", "+hset"),
        ("ERR", "ACL failure in script: No permissions to access a key script: 3b0b, on @user_script:9.", "~lockrun:*"),
        ("NOPERM", "No permissions to access the 'channel-key' channel", "&lockrun:*"),
        ("NOPERM", "No permissions to access the 'a-channel' key", "~lockrun:*"),
    ];
    for (code, detail, wanted) in cases {
        let d = line(
            &server(code, detail),
            &ctx(Some("locker"), true),
            Some(Script::Acquire),
        );
        assert!(d.contains(wanted), "{detail:?} gave {d:?}");
        assert!(d.contains("ACL SETUSER locker"), "{d}");
    }
}

#[test]
fn an_unknown_line_grants_the_whole_rule() {
    let e = server(
        "ERR",
        "The user executing the script can't run this command or subcommand script: x, on @user_script:9999.",
    );
    let d = line(&e, &ctx(None, false), Some(Script::Release));
    assert!(d.contains("inside lockrun's release script"), "{d}");
    assert!(d.contains(&acl::permissions("lockrun:")), "{d}");
    assert!(d.contains("ACL SETUSER default "), "{d}");
}

#[test]
fn other_errors_stay_as_they_were() {
    let e = server("ERR", "lockrun: ttl_ms must be a whole number");
    let d = line(&e, &ctx(None, false), Some(Script::Acquire));
    assert!(
        d.contains("answered with an error: ERR lockrun: ttl_ms"),
        "{d}"
    );
    let e = server("LOADING", "Redis is loading the dataset in memory");
    assert!(describe(&e, "h:1").is_transient());
}

#[test]
fn command_lines_are_found_on_the_line_or_just_above() {
    let src = "local a = 1\nlocal x = redis.call('HSET', k,\n  'f', v)\nreturn x\n";
    assert_eq!(command_on_line(src, 2).as_deref(), Some("HSET"));
    assert_eq!(command_on_line(src, 3).as_deref(), Some("HSET"));
    assert_eq!(command_on_line(src, 1), None);
    assert_eq!(command_on_line(src, 0), None);
    assert_eq!(script_line("x, on @user_script:12."), Some(12));
    assert_eq!(script_line("no line"), None);
}
