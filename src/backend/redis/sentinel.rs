//! `redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[/db]`, and
//! `rediss+sentinel://` (TLS to the Sentinels and to the master): Redis behind Sentinel.
//! The URL names the Sentinels; each connection asks them, in turn, for the master's
//! address, and the connection insists on `ROLE master` (see `conn.rs`), so a failover
//! is followed at the next reconnection. Part of [`super`].
//!
//! Authentication: the Sentinels are asked with `LOCKRUN_SENTINEL_PASSWORD` (and
//! `LOCKRUN_SENTINEL_USER`, for a Sentinel ACL user) when it is set, and with the
//! master's user and password (the URL's, or `LOCKRUN_PASSWORD` / `--password-file`)
//! otherwise, as Lettuce and redis-rb do; go-redis' `SentinelPassword`, Jedis'
//! `sentinelPassword` and redis-py's `sentinel_kwargs` are the variable. `AUTH` goes in
//! one pipeline with the question, so asking costs no extra round trip, and a Sentinel
//! without a password (which refuses `AUTH`) answers anyway: only a Sentinel that
//! refuses the question itself (`NOAUTH`) is an authentication failure, reported as
//! the Sentinel's, never as the master's.
//!
//! TLS: `rediss+sentinel://` speaks TLS to every Sentinel and to the master (Sentinel's
//! `tls-port` with `tls-replication yes`), with the files of `rediss://`
//! (`LOCKRUN_TLS_CA`, `LOCKRUN_TLS_CERT`, `LOCKRUN_TLS_KEY`); the master's certificate
//! must name the address the Sentinels give out. Never a fall back to plain text. A
//! Sentinel port of the other scheme is looked at as `conn.rs` looks at a server's
//! (`probe.rs`) and named; a TLS Sentinel that hangs up before answering is told to be
//! checked for the client certificate it may demand (TLS 1.3 servers check it after
//! the handshake, and their alert is lost when our write fails first).

use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionAddr, IntoConnectionInfo, RedisResult, Value};

use super::conn::client;
use super::errors::{describe, describe_in, Context};
use super::probe;
use super::target::{self, RedisTarget};
use crate::backend::budget::Overrun;
use crate::backend::tls::TlsFiles;
use crate::backend::url::UrlError;
use crate::backend::url::{host_list, split_userinfo};
use crate::backend::url::{Kind, UrlContext};
use crate::backend::BackendError;

/// The table line of Redis behind Sentinel.
pub const KIND: Kind = Kind {
    schemes: &["redis+sentinel", "rediss+sentinel"],
    usage: "redis+sentinel://[user:pass@]host:port[,...]/MASTER[/db] (rediss+sentinel:// for TLS; \
            LOCKRUN_SENTINEL_PASSWORD if the Sentinels' password is not the master's)",
    parse: |url, ctx| Ok(Arc::new(parse(url, ctx)?)),
};

/// The Sentinels' own password, when it is not the master's.
pub const PASSWORD_VAR: &str = "LOCKRUN_SENTINEL_PASSWORD";

/// The Sentinels' own ACL user, with [`PASSWORD_VAR`].
pub const USER_VAR: &str = "LOCKRUN_SENTINEL_USER";

/// How long one Sentinel may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// The Sentinels that know a master's address.
#[derive(Clone, PartialEq, Eq)]
pub struct Sentinels {
    /// `host:port` of each Sentinel.
    pub addrs: Vec<String>,
    /// The master's name as the Sentinels know it.
    pub master: String,
    /// What the Sentinels are authenticated with, if anything.
    pub auth: Option<Credentials>,
    /// True when [`Sentinels::auth`] came from [`PASSWORD_VAR`], not from the master's.
    pub own_auth: bool,
}

/// A user (none: the default user) and its password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The ACL user; `None` sends `AUTH password`.
    pub user: Option<String>,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels")
            .field("addrs", &self.addrs)
            .field("master", &self.master)
            .field("auth", &self.auth)
            .field("own_auth", &self.own_auth)
            .finish()
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Checks a `redis+sentinel://` or `rediss+sentinel://` URL into the master's connection
/// settings (on a placeholder address) and the Sentinels to ask for the real one.
pub fn parse(url: &str, ctx: &UrlContext<'_>) -> Result<RedisTarget, UrlError> {
    let bad = || UrlError::BadUrl {
        expected: KIND.usage,
    };
    let (tls, rest) = match url.split_once("://") {
        Some(("redis+sentinel", rest)) => (false, rest),
        Some(("rediss+sentinel", rest)) => (true, rest),
        _ => return Err(bad()),
    };
    let (userinfo, rest) = split_userinfo(rest);
    let (hosts, path) = rest.split_once('/').ok_or_else(bad)?;
    let (master, db) = match path.split_once('/') {
        Some((m, db)) => (m, Some(db)),
        None => (path, None),
    };
    let addrs = host_list(hosts, KIND.usage)?;
    if master.is_empty() || db.is_some_and(|d| d.parse::<u32>().is_err()) {
        return Err(bad());
    }
    // The data nodes' settings (user, password, database, TLS files) on a placeholder
    // address.
    let template = format!(
        "{}://{}127.0.0.1:6379/{}",
        if tls { "rediss" } else { "redis" },
        userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
        db.unwrap_or("0")
    );
    let mut node = target::parse(&template, ctx).map_err(|e| match e {
        UrlError::BadUrl { .. } => bad(),
        other => other,
    })?;
    let (auth, own_auth) = sentinel_auth(&node, ctx)?;
    node.sentinel = Some(Sentinels {
        addrs,
        master: master.to_owned(),
        auth,
        own_auth,
    });
    Ok(node)
}

/// The Sentinels' credentials: [`PASSWORD_VAR`] (with [`USER_VAR`]) if set, else the
/// master's; and whether they are the Sentinels' own.
fn sentinel_auth(
    node: &RedisTarget,
    ctx: &UrlContext<'_>,
) -> Result<(Option<Credentials>, bool), UrlError> {
    let var = |name: &str| (ctx.env)(name).filter(|v| !v.is_empty());
    match (var(PASSWORD_VAR), var(USER_VAR)) {
        (Some(password), user) => Ok((Some(Credentials { user, password }), true)),
        (None, Some(_)) => Err(UrlError::Backend(format!(
            "{USER_VAR} is set without {PASSWORD_VAR}: set both for a Sentinel ACL user, \
             or neither to ask the Sentinels with the master's user and password"
        ))),
        (None, None) => {
            let settings = node.info.redis_settings();
            let auth = settings.password().map(|password| Credentials {
                user: settings.username().map(str::to_owned),
                password: password.to_owned(),
            });
            Ok((auth, false))
        }
    }
}

/// What one Sentinel said.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// The master's host and port.
    Master(String, u16),
    /// The Sentinel does not know a master of that name.
    Unknown,
}

impl Sentinels {
    /// Asks the Sentinels, in turn, for the master's address (over TLS with `tls`).
    /// Returns the address to connect to and how to name it in messages. A Sentinel
    /// that refuses us (a password, a certificate) is skipped, but its refusal is the
    /// error when no other Sentinel answers.
    pub async fn master_address(
        &self,
        tls: Option<&TlsFiles>,
    ) -> Result<(ConnectionAddr, String), BackendError> {
        let mut refused = None;
        let mut last_error = BackendError::Unavailable("no Sentinel answered".into());
        for addr in &self.addrs {
            match tokio::time::timeout(ASK_TIMEOUT, self.ask(addr, tls)).await {
                Ok(Ok(Answer::Master(host, port))) => {
                    let at = format!(
                        "{} (the Sentinels' {})",
                        host_port(&host, port),
                        self.master
                    );
                    let addr = match tls {
                        None => ConnectionAddr::Tcp(host, port),
                        Some(_) => ConnectionAddr::TcpTls {
                            host,
                            port,
                            insecure: false,
                            tls_params: None,
                        },
                    };
                    return Ok((addr, at));
                }
                Ok(Ok(Answer::Unknown)) => {
                    last_error = BackendError::Unavailable(format!(
                        "Sentinel {addr} does not know a master named {:?}",
                        self.master
                    ))
                }
                Ok(Err(e @ BackendError::Refused(_))) => {
                    refused.get_or_insert(e);
                }
                Ok(Err(e)) => last_error = e,
                Err(_) => {
                    last_error = BackendError::Unavailable(format!(
                        "Sentinel {addr} did not answer within 1s"
                    ))
                }
            }
        }
        Err(refused.unwrap_or(last_error))
    }

    /// Asks one Sentinel: `AUTH` (if we have credentials) and the question, in one
    /// pipeline. A connection that fails the way a wrong scheme makes it fail has the
    /// port looked at (`probe.rs`), as `conn.rs` does for a server.
    async fn ask(&self, addr: &str, tls: Option<&TlsFiles>) -> Result<Answer, BackendError> {
        let at = format!("Sentinel {addr}");
        // The error lines of any Redis server, naming the Sentinel.
        let ctx = Context {
            at: &at,
            user: self.auth.as_ref().and_then(|a| a.user.as_deref()),
            password: self.auth.is_some(),
            tls,
            key_prefix: "",
        };
        let scheme = if tls.is_some() { "rediss" } else { "redis" };
        let info = format!("{scheme}://{addr}")
            .into_connection_info()
            .map_err(|e| describe_in(&e, &ctx, None))?;
        let port = info.addr().clone();
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let info = info.set_redis_settings(settings);
        // The client checks the TLS files as the library reads them; the socket is ours.
        client(info.clone(), tls).map_err(|e| describe_in(&e, &ctx, None))?;
        let overrun = Overrun::default();
        let made = connect(&info, tls, addr, &port, &overrun).await?;
        let replies: RedisResult<Vec<RedisResult<Value>>> = match made {
            Ok(mut conn) => self.question().query_async(&mut conn).await,
            Err(e) => Err(e),
        };
        let replies = match replies {
            Ok(replies) => replies,
            Err(_) if overrun.happened() => return Err(super::errors::too_large(&at)),
            Err(e)
                if tls.is_none()
                    && e.is_connection_dropped()
                    && !e.is_connection_refusal()
                    && probe::speaks_tls(&port).await =>
            {
                return Err(wrong_scheme(addr, false))
            }
            // TLS 1.3: the server checks our certificate after the handshake has ended
            // on our side, and its alert is lost when our write fails first.
            Err(e) if e.is_connection_dropped() && !e.is_connection_refusal() => {
                return Err(match tls {
                    Some(tls) => closed_before_answering(addr, tls),
                    None => describe_in(&e, &ctx, None),
                });
            }
            Err(e) => return Err(describe_in(&e, &ctx, None)),
        };
        let (auth, answer) = match replies.as_slice() {
            [auth, answer] if self.auth.is_some() => (Some(auth), answer),
            [answer] if self.auth.is_none() => (None, answer),
            _ => {
                return Err(BackendError::Refused(format!(
                    "Sentinel {addr} gave {} replies to {} commands",
                    replies.len(),
                    1 + usize::from(self.auth.is_some())
                )))
            }
        };
        self.judge(addr, auth, answer)
    }

    /// The answer of Sentinel `addr` to the question, given its reply to `AUTH` (if
    /// sent): an address, no such master, or the error, an authentication failure
    /// named as the Sentinel's.
    fn judge(
        &self,
        addr: &str,
        auth: Option<&RedisResult<Value>>,
        answer: &RedisResult<Value>,
    ) -> Result<Answer, BackendError> {
        let e = match answer {
            Ok(Value::Nil) => return Ok(Answer::Unknown),
            Ok(v) => {
                return match redis::from_redis_value_ref::<(String, u16)>(v) {
                    Ok((host, port)) => Ok(Answer::Master(host, port)),
                    Err(_) => Err(BackendError::Refused(format!(
                        "Sentinel {addr} gave no address for master {:?}: is it a Sentinel?",
                        self.master
                    ))),
                }
            }
            Err(e) => e,
        };
        let is_auth = |e: &redis::RedisError| {
            e.kind() == redis::ErrorKind::AuthenticationFailed
                || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        };
        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
            let user = self.auth.as_ref().and_then(|a| a.user.as_deref());
            return Err(BackendError::Refused(format!(
                "Sentinel {addr} denied the question to user {}: grant it with \
                 ACL SETUSER {} +sentinel|get-master-addr-by-name",
                user.unwrap_or("default"),
                user.unwrap_or("default")
            )));
        }
        if !is_auth(e) {
            return Err(describe(e, &format!("Sentinel {addr}")));
        }
        Err(self.auth_refused(addr, auth, e))
    }

    /// The refusal of authentication by Sentinel `addr` (`e`, or AUTH's own error in
    /// `auth`), with what to set.
    fn auth_refused(
        &self,
        addr: &str,
        auth: Option<&RedisResult<Value>>,
        e: &redis::RedisError,
    ) -> BackendError {
        // Why it was refused: AUTH's own error if it had one, else the question's.
        let why = match auth {
            Some(Err(a)) => a,
            _ => e,
        };
        let why = format!(
            "{} {}",
            why.code().unwrap_or("error"),
            why.detail().unwrap_or("").trim()
        );
        let fix = match (&self.auth, self.own_auth) {
            (None, _) => format!(
                "it needs a password: give it in the URL (redis+sentinel://:PASSWORD@...), \
                 in LOCKRUN_PASSWORD, or in {PASSWORD_VAR} if it is not the master's"
            ),
            (Some(_), true) => format!("check {PASSWORD_VAR} (and {USER_VAR})"),
            (Some(_), false) => format!(
                "it was given the master's user and password; set {PASSWORD_VAR} (and \
                 {USER_VAR} for an ACL user) if the Sentinels' differ"
            ),
        };
        BackendError::Refused(format!(
            "Sentinel {addr} refused authentication ({}): {fix}",
            why.trim()
        ))
    }

    /// `AUTH` (if we have credentials) and the question, in one pipeline.
    fn question(&self) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        if let Some(auth) = &self.auth {
            let cmd = pipe.cmd("AUTH");
            if let Some(user) = &auth.user {
                cmd.arg(user);
            }
            cmd.arg(&auth.password);
        }
        pipe.cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .ignore_errors();
        pipe
    }
}

/// Connects to Sentinel `addr` (`info`), over a socket counted by `overrun`. Over TLS
/// (`tls`), a handshake that takes long has the port (`port`) looked at: one that
/// answers in plain text is refused.
async fn connect(
    info: &redis::ConnectionInfo,
    tls: Option<&TlsFiles>,
    addr: &str,
    port: &redis::ConnectionAddr,
    overrun: &Overrun,
) -> Result<RedisResult<redis::aio::MultiplexedConnection>, BackendError> {
    let config = redis::AsyncConnectionConfig::new();
    let connecting = super::socket::multiplexed(info, tls, config, overrun);
    let mut connecting = std::pin::pin!(connecting);
    if tls.is_none() {
        return Ok(connecting.await);
    }
    Ok(tokio::select! {
        made = &mut connecting => made,
        () = tokio::time::sleep(probe::SUSPECT_AFTER) => {
            if probe::speaks_plain_redis(port).await {
                return Err(wrong_scheme(addr, true));
            }
            connecting.await
        }
    })
}

/// TLS 1.3: the server checks our certificate after the handshake has ended on our
/// side, and its alert is lost when our write fails first. What to set, by whether a
/// client certificate was given.
fn closed_before_answering(addr: &str, tls: &TlsFiles) -> BackendError {
    BackendError::Unavailable(format!(
        "Sentinel {addr} closed the TLS connection before answering: {}",
        if tls.client.is_none() {
            "if it demands a client certificate (tls-auth-clients), set \
             LOCKRUN_TLS_CERT and LOCKRUN_TLS_KEY"
        } else {
            "if it does not trust the client certificate of LOCKRUN_TLS_CERT, \
             use one signed by a CA it trusts (its tls-ca-cert-file)"
        }
    ))
}

/// The line for a Sentinel port that speaks the other scheme: plain text although TLS
/// was asked for (`tls_asked`), or TLS although it was not.
fn wrong_scheme(addr: &str, tls_asked: bool) -> BackendError {
    BackendError::Refused(if tls_asked {
        format!(
            "Sentinel {addr} answers without TLS on that port: use redis+sentinel:// for it, \
             or rediss+sentinel:// with the Sentinels' tls-port"
        )
    } else {
        format!(
            "Sentinel {addr} speaks TLS on that port: use rediss+sentinel:// (and \
             LOCKRUN_TLS_CA for a private CA)"
        )
    })
}

/// `host:port`, with an IPv6 address in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests;
