//! `--ping URL`, checked: an `http://` or `https://` URL of a dead man's switch in the
//! healthchecks.io style, taken apart once when the configuration is checked so that a
//! bad one is a one-line 125 before anything starts. The URL may carry a secret (the
//! check's UUID or slug in its path, a password in its user information): neither
//! [`PingUrl`]'s `Debug` nor any error shows more than `scheme://host:port/`.

use crate::backend::url::percent_decode;

/// A checked `--ping` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct PingUrl {
    /// `https://` (else `http://`).
    pub tls: bool,
    /// The host as written (an IPv6 address in brackets), lower case.
    pub host: String,
    /// The port, written or the scheme's.
    pub port: u16,
    /// The path without its trailing slash (`/` alone becomes empty).
    pub path: String,
    /// The query, if any, without its `?`.
    pub query: Option<String>,
    /// `user:password` of the user information, percent-decoded, for Basic auth.
    pub basic: Option<String>,
    /// The private CA to trust besides the system roots (`LOCKRUN_TLS_CA`), PEM.
    pub ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for PingUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the path, the query or the user information.
        f.write_str(&self.origin())
    }
}

impl PingUrl {
    /// Parses `--ping`'s value; the error is a sentence to follow `--ping: `, without
    /// the URL.
    pub fn parse(url: &str) -> Result<PingUrl, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or("not a URL: use http://HOST/PATH or https://HOST/PATH")?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" => false,
            _ => return Err("the scheme must be http:// or https://".to_owned()),
        };
        if rest.contains('#') {
            return Err("the URL must not have a fragment (#...)".to_owned());
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        if userinfo.is_some_and(|u| {
            u.chars()
                .any(|c| c.is_ascii_whitespace() || c.is_ascii_control())
        }) {
            return Err(
                "the URL's user information must not have spaces or control characters".into(),
            );
        }
        let (host, port) = split_host_port(hostport, if tls { 443 } else { 80 })?;
        let (path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, Some(q.to_owned())),
            None => (tail, None),
        };
        if path
            .chars()
            .any(|c| c.is_ascii_whitespace() || c.is_ascii_control())
        {
            return Err("the URL's path must not have spaces or control characters".into());
        }
        Ok(PingUrl {
            tls,
            host: host.to_ascii_lowercase(),
            port,
            path: path.trim_end_matches('/').to_owned(),
            query: query.filter(|q| !q.is_empty()),
            basic: userinfo.map(|u| match u.split_once(':') {
                Some((user, pass)) => format!("{}:{}", percent_decode(user), percent_decode(pass)),
                None => format!("{}:", percent_decode(u)),
            }),
            ca: None,
        })
    }

    /// `scheme://host:port/`: all that a log line may show of the URL.
    pub fn origin(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}:{}/", self.host, self.port)
    }

    /// The host without the brackets of an IPv6 address, to connect to and to check a
    /// certificate against.
    pub fn bare_host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }

    /// The request target for `what` (`start`, or an exit status): `PATH/what?rid=RID`,
    /// after the URL's own query if it has one.
    pub fn target(&self, what: &str, rid: &str) -> String {
        match &self.query {
            Some(q) => format!("{}/{what}?{q}&rid={rid}", self.path),
            None => format!("{}/{what}?rid={rid}", self.path),
        }
    }
}

/// `host[:port]` (a bracketed IPv6 address for a host), with `default` for a missing port.
pub fn split_host_port(s: &str, default: u16) -> Result<(&str, u16), String> {
    let (host, port) = if s.starts_with('[') {
        let close = s.find(']').ok_or("an IPv6 address lacks its closing ]")?;
        match &s[close + 1..] {
            "" => (&s[..=close], None),
            p => (
                &s[..=close],
                Some(p.strip_prefix(':').ok_or("junk after an IPv6 address")?),
            ),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c));
    if !host_ok {
        return Err("the URL has no host, or a host that is not a name or an address".into());
    }
    let port = match port {
        None | Some("") => default,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err("the port must be a number from 1 to 65535".into()),
        },
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthchecks_urls_are_taken_apart() {
        let u = PingUrl::parse("https://hc-ping.com/5f8a-UUID/").unwrap();
        assert!(u.tls);
        assert_eq!((u.host.as_str(), u.port), ("hc-ping.com", 443));
        assert_eq!(u.target("start", "R"), "/5f8a-UUID/start?rid=R");
        assert_eq!(u.origin(), "https://hc-ping.com:443/");
        let u =
            PingUrl::parse("HTTP://User:p%40ss@HC.example:8000/ping/key/slug?create=1").unwrap();
        assert_eq!(u.basic.as_deref(), Some("User:p@ss"));
        assert_eq!(u.target("3", "R"), "/ping/key/slug/3?create=1&rid=R");
        assert_eq!(format!("{u:?}"), "http://hc.example:8000/");
        let u = PingUrl::parse("http://[::1]:9/x").unwrap();
        assert_eq!((u.bare_host(), u.port), ("::1", 9));
        assert_eq!(
            PingUrl::parse("http://h").unwrap().target("0", "R"),
            "/0?rid=R"
        );
    }

    #[test]
    fn bad_urls_are_refused_without_being_echoed() {
        for bad in [
            "ftp://h/x",
            "hc-ping.com/uuid",
            "http:///x",
            "http://h:0/x",
            "http://h:99999/x",
            "http://h/x#frag",
            "http://h/a b",
            "http://us er:secret@h/x",
            "http://[::1/x",
        ] {
            let e = PingUrl::parse(bad).unwrap_err();
            assert!(
                !e.contains("secret") && !e.contains("hc-ping"),
                "{bad}: {e}"
            );
        }
    }
}
