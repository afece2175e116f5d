//! Which proxy a ping goes through, read from the environment as curl reads it:
//! `https_proxy` or `HTTPS_PROXY` for an `https://` URL, `http_proxy` (lower case only,
//! as curl: `HTTP_PROXY` may be set by a CGI request) for `http://`, else `all_proxy`
//! or `ALL_PROXY`; none for a host that `no_proxy` (or `NO_PROXY`) names: `*`, the
//! host itself, or a domain it is in (`example.com` and `.example.com` both cover
//! `hc.example.com`). Only `http://` proxies (the scheme may be left out; port 1080 by
//! default, as curl): an `https://` URL goes through it with CONNECT, an `http://` one
//! in absolute form. Part of [`super`]; pure.

use crate::backend::url::percent_decode;
use crate::config::ping::split_host_port;
use crate::config::PingUrl;

/// A proxy to go through.
#[derive(Clone, PartialEq, Eq)]
pub struct Proxy {
    /// Its host (brackets removed) and port.
    pub host: String,
    /// The port.
    pub port: u16,
    /// `user:password` for `Proxy-Authorization: Basic`.
    pub basic: Option<String>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.origin())
    }
}

impl Proxy {
    /// `http://host:port/`: all that a log line may show of it.
    pub fn origin(&self) -> String {
        if self.host.contains(':') {
            format!("http://[{}]:{}/", self.host, self.port)
        } else {
            format!("http://{}:{}/", self.host, self.port)
        }
    }
}

/// The proxy for `url` by the variables `get` looks up: `Ok(None)` to go direct, an
/// error (in words without the proxy's password) for a proxy that cannot be used.
pub fn proxy_for(
    url: &PingUrl,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Proxy>, String> {
    let var = |names: &[&'static str]| {
        names
            .iter()
            .find_map(|n| get(n).filter(|v| !v.trim().is_empty()).map(|v| (*n, v)))
    };
    if let Some((_, list)) = var(&["no_proxy", "NO_PROXY"]) {
        if bypassed(url.bare_host(), &list) {
            return Ok(None);
        }
    }
    let scheme_vars: &[&str] = if url.tls {
        &["https_proxy", "HTTPS_PROXY"]
    } else {
        &["http_proxy"]
    };
    let Some((name, value)) = var(scheme_vars).or_else(|| var(&["all_proxy", "ALL_PROXY"])) else {
        return Ok(None);
    };
    parse_proxy(value.trim())
        .map(Some)
        .map_err(|why| format!("{name}: {why}"))
}

/// True if `no_proxy`'s `list` (commas or spaces) covers `host`.
fn bypassed(host: &str, list: &str) -> bool {
    let host = host.to_ascii_lowercase();
    list.split([',', ' '])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            let entry = entry.trim_start_matches('.').to_ascii_lowercase();
            let entry = entry.trim_start_matches('[').trim_end_matches(']');
            host == entry
                || host
                    .strip_suffix(entry)
                    .is_some_and(|rest| rest.ends_with('.'))
        })
}

/// `[http://][user[:password]@]host[:port][/]`.
fn parse_proxy(value: &str) -> Result<Proxy, String> {
    let rest = match value.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) => {
            return Err(format!(
                "a {}:// proxy is not supported (only http://)",
                scheme.to_ascii_lowercase()
            ))
        }
        None => value,
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (host, port) = split_host_port(hostport, 1080)?;
    Ok(Proxy {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port,
        basic: userinfo.map(|u| match u.split_once(':') {
            Some((user, pass)) => format!("{}:{}", percent_decode(user), percent_decode(pass)),
            None => format!("{}:", percent_decode(u)),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn url(u: &str) -> PingUrl {
        PingUrl::parse(u).unwrap()
    }

    #[test]
    fn the_proxy_is_chosen_as_curl_chooses_it() {
        let https = url("https://hc-ping.com/x");
        let http = url("http://hc.example.com/x");
        let get = env(&[
            ("HTTPS_PROXY", "http://u:p%3Aw@proxy:3128/"),
            ("HTTP_PROXY", "http://cgi:1"),
        ]);
        let p = proxy_for(&https, &get).unwrap().unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.basic.as_deref()),
            ("proxy", 3128, Some("u:p:w"))
        );
        assert_eq!(format!("{p:?}"), "http://proxy:3128/");
        // HTTP_PROXY in upper case is not read (curl: it may come from a CGI request).
        assert_eq!(proxy_for(&http, &get).unwrap(), None);
        let get = env(&[("http_proxy", "proxy"), ("all_proxy", "other:8")]);
        assert_eq!(proxy_for(&http, &get).unwrap().unwrap().port, 1080);
        assert_eq!(proxy_for(&https, &get).unwrap().unwrap().host, "other");
        let get = env(&[("https_proxy", "socks5://s:1")]);
        let e = proxy_for(&https, &get).unwrap_err();
        assert!(e.starts_with("https_proxy: a socks5:// proxy"), "{e}");
        let get = env(&[("https_proxy", "http://u:secret@:1")]);
        assert!(!proxy_for(&https, &get).unwrap_err().contains("secret"));
    }

    #[test]
    fn no_proxy_names_hosts_and_domains() {
        let get = env(&[
            ("https_proxy", "p:1"),
            ("no_proxy", "localhost, .example.com,10.0.0.1"),
        ]);
        for direct in [
            "https://hc.example.com/x",
            "https://example.com/x",
            "https://10.0.0.1/x",
        ] {
            assert_eq!(proxy_for(&url(direct), &get).unwrap(), None, "{direct}");
        }
        for proxied in [
            "https://badexample.com/x",
            "https://hc-ping.com/x",
            "https://10.0.0.11/x",
        ] {
            assert!(
                proxy_for(&url(proxied), &get).unwrap().is_some(),
                "{proxied}"
            );
        }
        let get = env(&[("https_proxy", "p:1"), ("NO_PROXY", "*")]);
        assert_eq!(
            proxy_for(&url("https://hc-ping.com/x"), &get).unwrap(),
            None
        );
        let get = env(&[("https_proxy", "p:1"), ("no_proxy", "::1")]);
        assert_eq!(proxy_for(&url("https://[::1]:8/x"), &get).unwrap(), None);
    }
}
