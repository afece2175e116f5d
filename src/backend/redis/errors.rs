//! Redis client errors translated into [`BackendError`]s: one line that says what is
//! wrong and what to set, naming the server as `host:port` only (never the URL, nor a
//! password). Part of [`super`].
//!
//! What the line needs besides the error is in a [`Context`]: the ACL user, whether a
//! password and which TLS files were given, the key prefix. The causes told apart:
//!
//! - no password where one is required (`NOAUTH`, or Redis 7's "Protocol error:
//!   unauthenticated multibulk length" for a first command too large for a client not
//!   yet authenticated): set one; a password refused (`WRONGPASS`, or the client's
//!   "authentication failed", which has no detail): check it and the user;
//! - a permission missing from the ACL user (`NOPERM`, or inside a script Redis 7.0's
//!   "The user executing the script can't run this command ... on @user_script:LINE",
//!   which names no command: the command is read off that line of the script lockrun
//!   sent): the `ACL SETUSER` that grants it (see `acl.rs`);
//! - TLS: the server's certificate not signed by the CA lockrun trusts (the line says
//!   whether `LOCKRUN_TLS_CA` is set), made for another name, or expired; the server
//!   refusing our client certificate, or asking for one that was not given; a port
//!   that answers without TLS. rustls' error reaches us as text only (the I/O error
//!   that carries it hides it from `source()`), so the text is matched;
//! - the wrong scheme for the port: [`plain_port`] and [`tls_port`], which `conn.rs`
//!   chooses after looking at the port (`probe.rs`).

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::acl;
use super::scripts::Script;
use super::target::RedisTarget;
use crate::backend::tls::TlsFiles;
use crate::backend::BackendError;

/// What an error line needs to know about the connection, besides the error.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    /// The server, as `host:port`.
    pub at: &'a str,
    /// The ACL user of the URL (`None`: the `default` user).
    pub user: Option<&'a str>,
    /// Whether a password was given.
    pub password: bool,
    /// For `rediss://`: the TLS files given.
    pub tls: Option<&'a TlsFiles>,
    /// The key prefix, for the key and channel patterns of a missing permission.
    pub key_prefix: &'a str,
}

impl<'a> Context<'a> {
    /// The context of a connection to `target`, the server being `at`, its keys under
    /// `key_prefix`.
    pub fn new(target: &'a RedisTarget, at: &'a str, key_prefix: &'a str) -> Context<'a> {
        let settings = target.info.redis_settings();
        Context {
            at,
            user: settings.username(),
            password: settings.password().is_some(),
            tls: target.tls.as_ref(),
            key_prefix,
        }
    }

    /// The ACL user's name as `ACL SETUSER` takes it.
    fn user_name(&self) -> &str {
        self.user.unwrap_or("default")
    }
}

/// The refusal of a server (`at`, `host:port`) that sent a reply over the byte budget
/// ([`crate::backend::budget`]): not a Redis server lockrun can use, or something in
/// the way rewrites its replies.
pub fn too_large(at: &str) -> BackendError {
    BackendError::Refused(format!(
        "the Redis server at {at} sent a reply larger than {} (or of more than {} \
         values), more than lockrun ever asks for: it is not a Redis server, or something \
         between rewrites its replies (rediss:// keeps them intact)",
        crate::backend::budget::REPLY_BUDGET_WORDS,
        crate::backend::budget::REPLY_LINES
    ))
}

/// Translates a client error from the server at `at` (`host:port`), knowing nothing
/// else about the connection (a Sentinel's).
pub fn describe(e: &RedisError, at: &str) -> BackendError {
    let ctx = Context {
        at,
        user: None,
        password: false,
        tls: None,
        key_prefix: "",
    };
    describe_in(e, &ctx, None)
}

/// Translates a client error on the connection `ctx` describes, from a call of
/// `script` if it is one.
pub fn describe_in(e: &RedisError, ctx: &Context<'_>, script: Option<Script>) -> BackendError {
    let at = ctx.at;
    let code = e.code().unwrap_or("");
    let detail = e.detail().unwrap_or("").trim();
    let refused = |what: String| BackendError::Refused(format!("Redis at {at} {what}"));
    if let Some(denied) = denied(code, detail) {
        return refused(denied_line(&denied, ctx, script, detail));
    }
    let no_password = code == "NOAUTH" || detail.contains("unauthenticated");
    if no_password && !ctx.password {
        return refused(
            "requires a password and none was given: set LOCKRUN_PASSWORD or \
             LOCKRUN_PASSWORD_FILE (--password-file), or put user:password@ in the URL"
                .into(),
        );
    }
    if no_password || code == "WRONGPASS" || e.kind() == ErrorKind::AuthenticationFailed {
        return refused(format!(
            "refused the password of user {:?} (a wrong password, or no such user, or the \
             user is disabled): check the password (LOCKRUN_PASSWORD, --password-file or \
             the URL) and the user (redis://USER:PASSWORD@HOST)",
            ctx.user_name()
        ));
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::ClusterDown,
        ) => BackendError::Unavailable(format!("Redis at {at} is not ready: {code}")),
        ErrorKind::Server(_)
        | ErrorKind::Extension
        | ErrorKind::UnexpectedReturnType
        | ErrorKind::Parse => refused(format!(
            "answered with an error: {}",
            one_line(&format!("{code} {detail}"))
        )),
        // lockrun speaks RESP2 only (it never sends HELLO), so a server without RESP3
        // is no reason to refuse; the client library's kind is kept for completeness.
        ErrorKind::InvalidClientConfig | ErrorKind::RESP3NotSupported => {
            refused("cannot be used: bad client configuration".to_owned())
        }
        _ => match tls_line(e, ctx) {
            Some(line) => refused(line),
            None => {
                BackendError::Unavailable(format!("cannot reach Redis at {at}: {}", io_reason(e)))
            }
        },
    }
}

/// The line for `rediss://` at a port that answers without TLS.
pub fn plain_port(at: &str) -> BackendError {
    BackendError::Refused(format!(
        "Redis at {at} answers without TLS on that port: use redis:// for it, or rediss:// \
         with the server's tls-port"
    ))
}

/// The line for `redis://` at a port that speaks TLS.
pub fn tls_port(at: &str) -> BackendError {
    BackendError::Refused(format!(
        "Redis at {at} speaks TLS on that port: use rediss:// (and LOCKRUN_TLS_CA for a \
         private CA)"
    ))
}

/// The operating-system reason of an I/O error, without addresses.
pub fn io_reason(e: &RedisError) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connection_refusal() {
        "connection refused".into()
    } else if e.is_connection_dropped() {
        "connection closed".into()
    } else {
        // The I/O error's own text: an OS or TLS reason, never the URL.
        e.to_string()
    }
}

/// A permission the ACL user lacks.
#[derive(Debug, PartialEq, Eq)]
enum Denied {
    /// A command: named (lower case, as Redis names it), or to be read off the script.
    Command(Option<String>),
    /// One of the keys.
    Key,
    /// One of the wake-up channels.
    Channel,
}

/// The permission an error says is missing, if it says so. The wording differs
/// between Redis 6/7.0 and 7.2+ (and Valkey); quoted names (keys, channels) are left
/// out before the words are looked at, since a lock name may hold any of them.
fn denied(code: &str, detail: &str) -> Option<Denied> {
    let lower = detail.to_ascii_lowercase();
    let acl = code == "NOPERM"
        || lower.contains("user executing the script")
        || lower.contains("acl failure");
    if !acl {
        return None;
    }
    if let Some(name) = quoted_after(&lower, "to run the '") {
        return Some(Denied::Command(Some(name.to_owned())));
    }
    let bare = unquoted(&lower);
    if bare.contains("run this command") {
        Some(Denied::Command(None))
    } else if bare.contains("channel") {
        Some(Denied::Channel)
    } else if bare.contains("key") {
        Some(Denied::Key)
    } else {
        Some(Denied::Command(None))
    }
}

/// The text after `opening` up to the next `'`.
fn quoted_after<'t>(text: &'t str, opening: &str) -> Option<&'t str> {
    let rest = &text[text.find(opening)? + opening.len()..];
    rest.find('\'').map(|end| &rest[..end])
}

/// `text` without what stands between single quotes.
fn unquoted(text: &str) -> String {
    text.split('\'').step_by(2).collect::<Vec<_>>().join("")
}

/// The number N of `@user_script:N` in a script error.
fn script_line(detail: &str) -> Option<usize> {
    let rest = &detail[detail.find("@user_script:")? + "@user_script:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The command called on line `line` (from 1) of `src`, upper case: `redis.call('X'`
/// or `redis.pcall('X'` on that line, or on one of the two before it (a call is
/// reported at the line it starts on, but a long one may wrap).
fn command_on_line(src: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = src.lines().collect();
    (line.saturating_sub(2)..=line)
        .rev()
        .filter(|&n| n >= 1)
        .filter_map(|n| lines.get(n - 1))
        .find_map(|l| {
            ["redis.call('", "redis.pcall('"]
                .iter()
                .find_map(|opening| quoted_after(l, opening))
        })
        .map(str::to_ascii_uppercase)
}

/// The line for a missing permission: what the user may not do, and the `ACL SETUSER`
/// that grants it.
fn denied_line(denied: &Denied, ctx: &Context<'_>, script: Option<Script>, detail: &str) -> String {
    let user = ctx.user_name();
    let in_script = detail.to_ascii_lowercase().contains("script");
    let inside = match script {
        Some(s) if in_script => format!(" (inside lockrun's {} script)", s.name()),
        _ => String::new(),
    };
    let readme = "docs/backends.md, \"Redis keys\", gives the whole rule";
    match denied {
        Denied::Command(named) => {
            let name = named.as_ref().map(|n| n.to_ascii_uppercase()).or_else(|| {
                let s = script?;
                command_on_line(s.source(), script_line(detail)?)
            });
            match name {
                Some(name) => {
                    let why = if name == "SUBSCRIBE" {
                        ", needed by --wait"
                    } else {
                        ""
                    };
                    format!(
                        "does not let user {user:?} run {name}{inside}{why}: grant it with \
                         ACL SETUSER {user} +{} ({readme})",
                        name.to_ascii_lowercase()
                    )
                }
                None => format!(
                    "does not let user {user:?} run a command lockrun needs{inside}: grant \
                     them all with ACL SETUSER {user} {} ({readme})",
                    acl::permissions(ctx.key_prefix)
                ),
            }
        }
        Denied::Key => format!(
            "does not let user {user:?} use lockrun's keys (under {:?}){inside}: grant them \
             with ACL SETUSER {user} {} ({readme})",
            ctx.key_prefix,
            acl::key_pattern(ctx.key_prefix)
        ),
        Denied::Channel => format!(
            "does not let user {user:?} use lockrun's wake-up channels (under {:?}){inside}: \
             grant them with ACL SETUSER {user} {} ({readme})",
            ctx.key_prefix,
            acl::channel_pattern(ctx.key_prefix)
        ),
    }
}

/// The line for a failed TLS handshake, if `e` is one.
fn tls_line(e: &RedisError, ctx: &Context<'_>) -> Option<String> {
    let text = e.to_string();
    let ca_set = ctx.tls.is_some_and(|t| t.ca.is_some());
    let cert_set = ctx.tls.is_some_and(|t| t.client.is_some());
    if let Some(alert) = text.split("received fatal alert: ").nth(1).map(|rest| {
        rest.split(|c: char| !c.is_ascii_alphanumeric())
            .next()
            .unwrap_or("")
    }) {
        // The server ended the handshake: about our certificate, or lack of one (TLS
        // 1.2 servers say HandshakeFailure when none was sent).
        let about_ours = alert.contains("Certificate")
            || matches!(alert, "UnknownCA" | "AccessDenied" | "DecryptError")
            || (alert == "HandshakeFailure" && !cert_set);
        return Some(if about_ours && !cert_set {
            "demands a client certificate: set LOCKRUN_TLS_CERT and LOCKRUN_TLS_KEY to one \
             signed by a CA the server trusts (its tls-ca-cert-file)"
                .into()
        } else if about_ours {
            format!(
                "did not accept the client certificate of LOCKRUN_TLS_CERT ({alert}): use one \
                 signed by a CA the server trusts (its tls-ca-cert-file)"
            )
        } else {
            format!(
                "refused the TLS handshake ({alert}): check the server's TLS settings \
                 (tls-protocols, tls-ciphers)"
            )
        });
    }
    if let Some(rest) = text.split("invalid peer certificate: ").nth(1) {
        let rest = rest.to_ascii_lowercase().replace(' ', "");
        return Some(if rest.contains("notvalidforname") {
            "presented a certificate made for another name: connect by a name (or address) \
             the certificate holds"
                .into()
        } else if rest.contains("expired") || rest.contains("notvalidyet") {
            "presented a certificate that has expired or is not valid yet: renew it (or set \
             this machine's clock)"
                .into()
        } else if ca_set {
            "presented a certificate that the CA in LOCKRUN_TLS_CA did not sign: point \
             LOCKRUN_TLS_CA at the CA that signed the server's certificate (its tls-cert-file)"
                .into()
        } else {
            "presented a certificate that no CA of this system signed: set LOCKRUN_TLS_CA \
             to the CA that signed it"
                .into()
        });
    }
    if text.contains("corrupt message") || text.contains("InvalidContentType") {
        return Some(
            "answers without TLS on that port: use redis:// for it, or rediss:// with the \
             server's tls-port"
                .into(),
        );
    }
    None
}

#[cfg(test)]
mod tests;

/// `text` on one line: a server's words (a parse error quotes what it sent) may hold
/// line breaks and runs of blanks.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
