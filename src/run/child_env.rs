//! The command's environment: lockrun's own, plus the lock's variables, less the
//! credentials. The job must not get the backend password: it could print it into CI
//! logs or crash reports, and with it break any lock on the server. So
//! `LOCKRUN_PASSWORD` and `LOCKRUN_SENTINEL_PASSWORD` are removed (and `LOCKRUN_PING`,
//! `--ping`'s URL) and `LOCKRUN_URL` is
//! passed on with every URL of its comma-separated list stripped of its password (the
//! user is kept). A URL that cannot be taken apart with certainty is left out entirely
//! rather than passed on with a secret in it. A job that itself calls lockrun reads the
//! password from a file (`LOCKRUN_PASSWORD_FILE` stays). Part of [`crate::run`]; pure
//! except [`changes`], which reads lockrun's environment.

use crate::backend::url::percent_decode;
use crate::supervisor::EnvChange;

/// The environment variables the command gets besides lockrun's own, and the
/// credentials it must not get.
pub(super) fn changes(lock: Vec<(&'static str, String)>) -> Vec<EnvChange> {
    let mut out: Vec<EnvChange> = lock
        .into_iter()
        .map(|(k, v)| EnvChange::Set(k.to_owned(), v))
        .collect();
    out.push(EnvChange::Remove("LOCKRUN_PASSWORD".into()));
    out.push(EnvChange::Remove("LOCKRUN_SENTINEL_PASSWORD".into()));
    // --ping's URL is a secret of sorts (whoever has it can report the job's runs),
    // and a lockrun inside the job must not ping the same check.
    out.push(EnvChange::Remove("LOCKRUN_PING".into()));
    if let Some(url) = std::env::var_os("LOCKRUN_URL") {
        // Not UTF-8: nothing can be told about it, so it is not passed on.
        match url.to_str().and_then(url_list_without_passwords) {
            Some(clean) => out.push(EnvChange::Set("LOCKRUN_URL".into(), clean)),
            None => out.push(EnvChange::Remove("LOCKRUN_URL".into())),
        }
    }
    out
}

/// A comma-separated list of URLs, each without its password; `None` if none is left.
/// A comma starts a new URL only if a scheme (`...://`) follows it: the others
/// separate hosts within one URL (`etcd://a:1,b:2`), or belong to a password.
pub(crate) fn url_list_without_passwords(list: &str) -> Option<String> {
    let mut urls: Vec<String> = Vec::new();
    // Pieces before the first scheme belong to no URL: they are left out.
    let mut current: Option<String> = None;
    for piece in list.split(',') {
        if piece.contains("://") {
            urls.extend(current.replace(piece.to_owned()));
        } else if let Some(url) = &mut current {
            url.push(',');
            url.push_str(piece);
        }
    }
    urls.extend(current);
    let clean: Vec<String> = urls
        .iter()
        .filter_map(|u| url_without_password(u.trim()))
        .collect();
    (!clean.is_empty()).then(|| clean.join(","))
}

/// `scheme://[user[:password]@]hosts[/path][?query][#fragment]` without the password
/// (in the user information, or a query parameter whose name has `pass` in it);
/// `None` if the URL does not have that form for certain.
fn url_without_password(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme_ok = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // The last `@` ends the user information, as URL parsers read it.
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (userinfo.split(':').next(), hosts),
        None => (None, authority),
    };
    // An `@` or a misshapen host list left over means the URL was split elsewhere than
    // where its parser would split it: a password may hide in what remains.
    if !scheme_ok || tail.contains('@') || !hosts.split(',').all(host_port_ok) {
        return None;
    }
    let user = match user {
        Some(u) if !u.is_empty() => format!("{u}@"),
        _ => String::new(),
    };
    Some(format!(
        "{scheme}://{user}{hosts}{}",
        tail_without_password(tail)
    ))
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` (any of them may be empty).
fn host_port_ok(entry: &str) -> bool {
    let (host, port) = match entry.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, after)) if addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':') => {
                (None, after)
            }
            _ => return false,
        },
        None => {
            let (host, port) = entry.split_at(entry.find(':').unwrap_or(entry.len()));
            (Some(host), port)
        }
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.chars().all(|c| c.is_ascii_digit()));
    port_ok && host.is_none_or(|h| !h.contains([':', '[', ']']))
}

/// The path, query and fragment of a URL without the query parameters whose name has
/// `pass` in it (`password=`, libpq's `sslpassword=`, also when percent-encoded).
fn tail_without_password(tail: &str) -> String {
    let (before_fragment, fragment) = match tail.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (tail, None),
    };
    let mut out = match before_fragment.split_once('?') {
        Some((path, query)) => {
            let kept: Vec<&str> = query
                .split('&')
                .filter(|p| {
                    // Decoded as the backend's parser decodes it: `p%61ssword` is one.
                    let name = percent_decode(p.split('=').next().unwrap_or(""));
                    !name.to_ascii_lowercase().contains("pass")
                })
                .collect();
            if kept.is_empty() {
                path.to_owned()
            } else {
                format!("{path}?{}", kept.join("&"))
            }
        }
        None => before_fragment.to_owned(),
    };
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(list: &str) -> Option<String> {
        url_list_without_passwords(list)
    }

    #[test]
    fn the_password_is_removed_and_the_user_kept() {
        for (given, passed) in [
            ("redis://:s3cret@h:6379/2", "redis://h:6379/2"),
            ("redis://u:s3cret@h:6379", "redis://u@h:6379"),
            ("rediss://u:p:with:colons@h:1", "rediss://u@h:1"),
            ("redis://u@h:1", "redis://u@h:1"),
            ("redis://h:1", "redis://h:1"),
            ("etcd://root:pw@a:1,b:2", "etcd://root@a:1,b:2"),
            (
                "redis+sentinel://:pw@s:1,t:2/mymaster",
                "redis+sentinel://s:1,t:2/mymaster",
            ),
            (
                "rediss+sentinel://:pw@s:1,t:2/mymaster/3",
                "rediss+sentinel://s:1,t:2/mymaster/3",
            ),
            (
                "redis+sentinel://app:p,w@[::1]:26379,s:2/mymaster",
                "redis+sentinel://app@[::1]:26379,s:2/mymaster",
            ),
            (
                "postgres://app:pw@db:5432/app?sslmode=verify-full",
                "postgres://app@db:5432/app?sslmode=verify-full",
            ),
            (
                "postgres://app@[::1]:5432/app",
                "postgres://app@[::1]:5432/app",
            ),
            (
                "postgres:///app?host=/run/postgresql",
                "postgres:///app?host=/run/postgresql",
            ),
        ] {
            assert_eq!(clean(given).as_deref(), Some(passed), "{given}");
        }
    }

    #[test]
    fn a_password_with_url_delimiters_in_it_is_removed_too() {
        // The last `@` ends the user information; a comma in a password does not start
        // a new URL, since no scheme follows it.
        assert_eq!(clean("redis://:p@ss@h:1").as_deref(), Some("redis://h:1"));
        assert_eq!(clean("redis://:a,b@h:1").as_deref(), Some("redis://h:1"));
        assert_eq!(
            clean("etcd://u:a,b@h:1,k:2").as_deref(),
            Some("etcd://u@h:1,k:2")
        );
    }

    #[test]
    fn password_query_parameters_are_removed() {
        assert_eq!(
            clean("postgres://db/app?password=pw&sslmode=require&sslpassword=k#f").as_deref(),
            Some("postgres://db/app?sslmode=require#f")
        );
        assert_eq!(
            clean("postgres://db/app?PASSWORD=pw").as_deref(),
            Some("postgres://db/app")
        );
        assert_eq!(
            clean("postgres://db/app?p%61ssword=pw&ssl%70assword=k&user=u").as_deref(),
            Some("postgres://db/app?user=u")
        );
    }

    #[test]
    fn every_url_of_a_list_is_cleaned() {
        assert_eq!(
            clean("redis://:a@h:1, redis://:b@h:2 ,redis://u:c@h:3").as_deref(),
            Some("redis://h:1,redis://h:2,redis://u@h:3")
        );
    }

    #[test]
    fn what_cannot_be_taken_apart_is_left_out_entirely() {
        for bad in [
            // No scheme: no telling where a password would be.
            "h:1",
            ":pw@h:1",
            // A `/` or `?` in the password ends the authority early.
            "redis://:pa/ss@h:1",
            "redis://:pa?ss@h:1",
            "redis://:pa#ss@h:1",
            // What looks like a port is not one.
            "redis://:pw",
            "redis://u:pw",
            "etcd://h:1,u:pw",
            "redis://[::1:6379",
            "://h:1",
            "re dis://h:1",
            "",
        ] {
            assert_eq!(clean(bad), None, "{bad:?}");
        }
        assert_eq!(
            clean("h:1,redis://:pw@h:2,redis://:pa/ss@h:3").as_deref(),
            Some("redis://h:2"),
            "only the URLs that can be taken apart stay"
        );
    }
}
