//! Unit tests of [`super`] (`backend::redis::sentinel`).

use super::*;
use crate::backend::url::testing::{ctx, options};
use crate::backend::url::{BackendOptions, Target};

/// A context with `password` and the environment `env` (name, value pairs).
fn ctx_env<'a>(
    a: &'a BackendOptions,
    password: Option<&str>,
    env: &'a dyn Fn(&str) -> Option<String>,
) -> UrlContext<'a> {
    UrlContext {
        password: password.map(str::to_owned),
        options: a,
        env,
    }
}

fn sentinels(t: &RedisTarget) -> &Sentinels {
    t.sentinel.as_ref().unwrap()
}

#[test]
fn sentinel_urls_name_the_sentinels_and_the_master() {
    let a = options();
    let node = parse(
        "redis+sentinel://:pw@s1:26379,s2:26380/mymaster/2",
        &ctx(&a, None),
    )
    .unwrap();
    let s = sentinels(&node);
    assert_eq!(s.addrs, vec!["s1:26379", "s2:26380"]);
    assert_eq!(s.master, "mymaster");
    assert_eq!(node.info.redis_settings().password(), Some("pw"));
    assert_eq!(node.info.redis_settings().db(), 2);
    assert!(node.tls.is_none());
    assert_eq!(node.display(), "sentinel s1:26379,s2:26380/mymaster");
    for bad in [
        "redis+sentinel://s1:26379",
        "redis+sentinel://s1/m",
        "redis+sentinel://s1:1/",
        "redis+sentinel://s1:1/m/x",
        "rediss+sentinel://:pw@s1:1/m/x",
        "redis+sentinels://s1:1/m",
    ] {
        let e = parse(bad, &ctx(&a, None)).unwrap_err();
        assert_eq!(
            e,
            UrlError::BadUrl {
                expected: KIND.usage
            },
            "{bad}"
        );
        assert!(!e.to_string().contains("pw"), "{e}");
    }
    assert_eq!(
        parse("redis+sentinel://s1:1,s2:0/m", &ctx(&a, None)).unwrap_err(),
        UrlError::PortZero
    );
}

#[test]
fn rediss_sentinel_is_tls_to_the_sentinels_and_the_master() {
    let a = options();
    let node = parse("rediss+sentinel://s1:26379/m", &ctx(&a, None)).unwrap();
    assert!(node.tls.is_some());
    assert!(matches!(
        node.info.addr(),
        redis::ConnectionAddr::TcpTls {
            insecure: false,
            ..
        }
    ));
    // The TLS files are read when the URL is checked: a missing one is a 125 then.
    let env = |v: &str| (v == "LOCKRUN_TLS_CA").then(|| "/nonexistent/ca.pem".to_owned());
    assert!(matches!(
        parse("rediss+sentinel://s1:26379/m", &ctx_env(&a, None, &env)),
        Err(UrlError::TlsFile {
            var: "LOCKRUN_TLS_CA",
            ..
        })
    ));
}

#[test]
fn the_sentinels_get_the_masters_credentials_unless_they_have_their_own() {
    let a = options();
    let url = "redis+sentinel://app:urlpw@s1:1/m";
    let cred = |user: Option<&str>, password: &str| Credentials {
        user: user.map(str::to_owned),
        password: password.to_owned(),
    };
    // The URL's.
    let t = parse(url, &ctx(&a, None)).unwrap();
    assert_eq!(sentinels(&t).auth, Some(cred(Some("app"), "urlpw")));
    assert!(!sentinels(&t).own_auth);
    // LOCKRUN_PASSWORD (or --password-file) wins over the URL's, for both.
    let t = parse(url, &ctx(&a, Some("envpw"))).unwrap();
    assert_eq!(sentinels(&t).auth, Some(cred(Some("app"), "envpw")));
    assert_eq!(t.info.redis_settings().password(), Some("envpw"));
    // None at all.
    let t = parse("redis+sentinel://s1:1/m", &ctx(&a, None)).unwrap();
    assert_eq!(sentinels(&t).auth, None);
    // The Sentinels' own password: the default user unless LOCKRUN_SENTINEL_USER.
    let own = |v: &str| (v == PASSWORD_VAR).then(|| "sentinelpw".to_owned());
    let t = parse(url, &ctx_env(&a, None, &own)).unwrap();
    assert_eq!(sentinels(&t).auth, Some(cred(None, "sentinelpw")));
    assert!(sentinels(&t).own_auth);
    assert_eq!(t.info.redis_settings().password(), Some("urlpw"));
    assert_eq!(t.info.redis_settings().username(), Some("app"));
    let both = |v: &str| match v {
        PASSWORD_VAR => Some("sentinelpw".to_owned()),
        USER_VAR => Some("watcher".to_owned()),
        _ => None,
    };
    let t = parse(url, &ctx_env(&a, None, &both)).unwrap();
    assert_eq!(
        sentinels(&t).auth,
        Some(cred(Some("watcher"), "sentinelpw"))
    );
    // An empty variable is no variable.
    let empty = |v: &str| (v == PASSWORD_VAR).then(String::new);
    let t = parse(url, &ctx_env(&a, None, &empty)).unwrap();
    assert!(!sentinels(&t).own_auth);
    // A user without a password is a mistake, said before anything is connected.
    let user_only = |v: &str| (v == USER_VAR).then(|| "watcher".to_owned());
    let e = parse(url, &ctx_env(&a, None, &user_only)).unwrap_err();
    assert!(e.to_string().contains(PASSWORD_VAR), "{e}");
}

#[test]
fn no_password_is_ever_shown() {
    let a = options();
    let both = |v: &str| match v {
        PASSWORD_VAR => Some("SENTINEL-SECRET".to_owned()),
        USER_VAR => Some("watcher".to_owned()),
        _ => None,
    };
    let t = parse(
        "rediss+sentinel://app:MASTER-SECRET@s1:1,s2:2/m",
        &ctx_env(&a, None, &both),
    )
    .unwrap();
    let shown = format!("{t:?} {}", t.display());
    assert!(!shown.contains("SECRET"), "{shown}");
    assert!(shown.contains("watcher"), "{shown}");
}

/// A server error as a pipeline gives it (parsed from the wire).
fn reply_error(line: &str) -> RedisResult<Value> {
    match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap() {
        Value::ServerError(e) => Err(e.into()),
        other => panic!("not an error: {other:?}"),
    }
}

#[test]
fn answers_are_judged_and_refusals_named_as_the_sentinels() {
    let a = options();
    let t = parse("redis+sentinel://:pw@s1:1/m", &ctx(&a, None)).unwrap();
    let s = sentinels(&t);
    let addr = Value::Array(vec![
        Value::BulkString(b"10.0.0.5".to_vec()),
        Value::BulkString(b"6380".to_vec()),
    ]);
    let ok = Ok(Value::Okay);
    assert_eq!(
        s.judge("s1:1", Some(&ok), &Ok(addr.clone())),
        Ok(Answer::Master("10.0.0.5".into(), 6380))
    );
    assert_eq!(
        s.judge("s1:1", Some(&ok), &Ok(Value::Nil)),
        Ok(Answer::Unknown)
    );
    // A Sentinel without a password refuses AUTH, and answers anyway.
    let no_password = reply_error(
        "ERR AUTH <password> called without any password configured for the default user",
    );
    assert_eq!(
        s.judge("s1:1", Some(&no_password), &Ok(addr)),
        Ok(Answer::Master("10.0.0.5".into(), 6380))
    );
    // A wrong password: AUTH's error is the reason, the Sentinel is named.
    let wrong = reply_error("WRONGPASS invalid username-password pair or user is disabled.");
    let noauth = reply_error("NOAUTH Authentication required.");
    let e = s.judge("s1:1", Some(&wrong), &noauth).unwrap_err();
    let BackendError::Refused(line) = &e else {
        panic!("{e:?}")
    };
    assert!(
        line.starts_with("Sentinel s1:1 refused authentication (WRONGPASS invalid"),
        "{line}"
    );
    assert!(
        line.contains(PASSWORD_VAR) && !line.contains("pw@"),
        "{line}"
    );
    // No password given to a Sentinel that wants one.
    let t = parse("redis+sentinel://s1:1/m", &ctx(&a, None)).unwrap();
    let e = sentinels(&t).judge("s1:1", None, &noauth).unwrap_err();
    assert!(
        matches!(&e, BackendError::Refused(l) if l.contains("NOAUTH") && l.contains("needs a password")),
        "{e:?}"
    );
}

#[test]
fn a_reply_that_is_no_address_and_a_denied_question_are_refused() {
    let a = options();
    let t = parse("redis+sentinel://:pw@s1:1/m", &ctx(&a, None)).unwrap();
    let s = sentinels(&t);
    let ok = Ok(Value::Okay);
    // Something that is not a Sentinel.
    let e = s.judge("s1:1", Some(&ok), &Ok(Value::Int(3))).unwrap_err();
    assert!(matches!(&e, BackendError::Refused(l) if l.contains("is it a Sentinel")));
    let denied = reply_error(
        "NOPERM User default has no permissions to run the 'sentinel|get-master-addr-by-name' command",
    );
    let e = s.judge("s1:1", Some(&ok), &denied).unwrap_err();
    assert!(
        matches!(&e, BackendError::Refused(l) if l.contains("+sentinel|get-master-addr-by-name")),
        "{e:?}"
    );
    let other = reply_error("ERR unknown command 'SENTINEL'");
    assert!(matches!(
        s.judge("s1:1", Some(&ok), &other),
        Err(BackendError::Refused(_))
    ));
}

#[test]
fn ipv6_masters_are_bracketed_in_messages() {
    assert_eq!(host_port("::1", 6379), "[::1]:6379");
    assert_eq!(host_port("10.0.0.5", 6379), "10.0.0.5:6379");
}
