//! Connections to a Redis server, as the backend's [`Slot`]s hold them: the multiplexed
//! client that every script goes through, and, for `--wait`, a second connection
//! subscribed to this waiter's wake-up channel; [`client`] builds the client, over TLS
//! for `rediss://` (and for a Sentinel of `rediss+sentinel://`). Part of [`super`].
//!
//! Both speak RESP2 and send nothing before the first command but what the URL asks
//! for (AUTH, SELECT): no `HELLO`, no `CLIENT SETINFO`. So a proxy that knows only the
//! plain commands (twemproxy, several managed proxies) and Redis 5 serve every run,
//! `--wait` included; wake-ups arrive as RESP2 pub/sub messages on the second
//! connection, made only once a lock was found busy. Where it cannot be made (a proxy
//! without pub/sub, `SUBSCRIBE` renamed away or denied), the backend polls instead.
//!
//! A wrong scheme for the port is told apart from a server that is down (see
//! `probe.rs`): a `rediss://` handshake still going after `probe::SUSPECT_AFTER`, and
//! a `redis://` connection closed before the server answered anything, make lockrun
//! look at the port, and a port that speaks the other scheme is a refusal naming it.

use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use redis::aio::{MultiplexedConnection, PubSubStream};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, RedisError, RedisResult, Value,
};

use super::errors::{self, describe_in, io_reason, Context};
use super::probe;
use super::socket;
use super::target::RedisTarget;
use crate::backend::budget::Overrun;
use crate::backend::conn::{Connection, Slot, Wakeups};
use crate::backend::tls::TlsFiles;
use crate::backend::BackendError;

/// A connection for scripts; replaced as a whole after any failure.
pub struct RedisConn {
    /// The client; cheap to clone (one socket, multiplexed).
    pub conn: MultiplexedConnection,
    /// Where it is connected (the master's address, behind Sentinel).
    addr: ConnectionAddr,
    /// Whether the server has answered anything on it yet (a connection set up with
    /// `AUTH` or `SELECT` has).
    answered: AtomicBool,
    /// Whether a reply went over its byte budget (the connection is then dead).
    overrun: Overrun,
}

impl Connection for RedisConn {}

impl RedisConn {
    /// The error line of a failed call on this connection (of `script`, if it is one):
    /// a `redis://` connection closed before the server ever answered is a TLS port
    /// if the port says so. Any answer, error or not, is [`RedisConn::answered`] first.
    pub async fn explain(
        &self,
        e: &RedisError,
        ctx: &Context<'_>,
        script: Option<super::scripts::Script>,
    ) -> BackendError {
        if self.overrun.happened() {
            return errors::too_large(ctx.at);
        }
        if ctx.tls.is_none()
            && e.is_connection_dropped()
            && !self.answered.load(Ordering::Relaxed)
            && probe::speaks_tls(&self.addr).await
        {
            return errors::tls_port(ctx.at);
        }
        if e.code().is_some() {
            self.answered();
        }
        describe_in(e, ctx, script)
    }

    /// Where it is connected, as a Cluster node (`None` for a Unix socket).
    pub fn node(&self) -> Option<(String, u16)> {
        match &self.addr {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Some((host.clone(), *port))
            }
            _ => None,
        }
    }

    /// Notes that the server answered on this connection.
    pub fn answered(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }
}

/// The connection slot of one Redis server.
pub type RedisSlot = Slot<RedisConn>;

/// A connection subscribed to one waiter's wake-up channel: every message on it is a
/// wake-up. Its end (the server or the network closed it, or a message over the byte
/// budget) ends the stream.
pub struct Subscriber {
    messages: Wakeups<Messages>,
}

/// The messages of a subscription, and its byte budget (each message taken starts it
/// afresh: nothing is written on a subscribed connection).
pub struct Messages {
    stream: PubSubStream,
    overrun: Overrun,
}

impl Connection for Subscriber {}

impl Subscriber {
    /// The wake-ups of this connection (subscribed from the start).
    pub fn messages(&self) -> &Wakeups<Messages> {
        &self.messages
    }
}

/// Waits for the next wake-up on `messages` and gives its payload (`released`, or a
/// grant: `grants.rs`): `None` when the connection is gone.
pub async fn next_wakeup(messages: &mut Messages) -> Option<Vec<u8>> {
    let message = messages.stream.next().await;
    messages.overrun.reset();
    message.map(|m| m.get_payload_bytes().to_vec())
}

/// The subscriber slot of one Redis server.
pub type SubscriberSlot = Slot<Subscriber>;

/// Where `target` leads (asking the Sentinels first if it is behind Sentinel): its
/// connection info, RESP2 (whatever the URL's `protocol`) without `CLIENT SETINFO`,
/// and the master's address as the Sentinels gave it.
async fn resolve(target: &RedisTarget) -> Result<(ConnectionInfo, Option<String>), BackendError> {
    let settings = target
        .info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP2)
        .set_skip_set_lib_name();
    let (info, master) = match &target.sentinel {
        None => (target.info.clone(), None),
        Some(sentinels) => {
            let (addr, master) = sentinels.master_address(target.tls.as_ref()).await?;
            (target.info.clone().set_addr(addr), Some(master))
        }
    };
    Ok((info.set_redis_settings(settings), master))
}

/// Connects to `target` (asking the Sentinels first if it is behind Sentinel).
/// `at` is the server as `host:port`, for messages; behind Sentinel, messages name the
/// master's address instead, as the Sentinels gave it (so that its refusals are told
/// apart from a Sentinel's).
pub async fn connect(target: &RedisTarget, at: &str) -> Result<RedisConn, BackendError> {
    let conn_config = AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(None);
    let (info, master) = resolve(target).await?;
    let at = master.as_deref().unwrap_or(at);
    let ctx = Context::new(target, at, "");
    let addr = info.addr().clone();
    // Something is exchanged while connecting: AUTH or SELECT.
    let exchanged = info.redis_settings().password().is_some() || info.redis_settings().db() != 0;
    // The client checks the TLS files as the library reads them; the socket is ours.
    client(info.clone(), target.tls.as_ref()).map_err(|e| describe_in(&e, &ctx, None))?;
    let overrun = Overrun::default();
    let connecting = socket::multiplexed(&info, target.tls.as_ref(), conn_config, &overrun);
    let mut connecting = std::pin::pin!(connecting);
    let made = if target.tls.is_some() {
        tokio::select! {
            made = &mut connecting => made,
            () = tokio::time::sleep(probe::SUSPECT_AFTER) => {
                if probe::speaks_plain_redis(&addr).await {
                    return Err(errors::plain_port(at));
                }
                connecting.await
            }
        }
    } else {
        connecting.await
    };
    let mut conn = match made {
        Ok(conn) => conn,
        Err(e) if target.tls.is_none() && e.is_connection_dropped() => {
            if probe::speaks_tls(&addr).await {
                return Err(errors::tls_port(at));
            }
            return Err(describe_in(&e, &ctx, None));
        }
        Err(_) if overrun.happened() => return Err(errors::too_large(at)),
        Err(e) => return Err(describe_in(&e, &ctx, None)),
    };
    if target.sentinel.is_some() {
        insist_on_master(&mut conn, &ctx).await.map_err(|e| {
            if overrun.happened() {
                errors::too_large(at)
            } else {
                e
            }
        })?;
    }
    Ok(RedisConn {
        conn,
        addr,
        answered: AtomicBool::new(exchanged || target.sentinel.is_some()),
        overrun: overrun.clone(),
    })
}

/// Connects to `target` (the connection `ctx` describes) and subscribes to `channel`.
/// The error says why not, for the line that tells that waiting polls instead.
pub async fn subscribe(
    target: &RedisTarget,
    channel: &str,
    ctx: &Context<'_>,
) -> Result<Subscriber, String> {
    let (info, _) = resolve(target).await.map_err(|e| e.to_string())?;
    client(info.clone(), target.tls.as_ref()).map_err(|e| reason(&e, ctx))?;
    let overrun = Overrun::default();
    let mut pubsub = socket::pubsub(&info, target.tls.as_ref(), &overrun)
        .await
        .map_err(|e| format!("connecting: {}", reason(&e, ctx)))?;
    pubsub
        .subscribe(channel)
        .await
        .map_err(|e| format!("SUBSCRIBE: {}", reason(&e, ctx)))?;
    let (_, stream) = pubsub.split();
    let messages = Wakeups::new(Some(Messages { stream, overrun }));
    messages.set_subscribed();
    Ok(Subscriber { messages })
}

/// Why a subscription failed: a missing permission as the error lines name it (with
/// its `ACL SETUSER` grant), anything else in the server's or the system's words.
fn reason(e: &RedisError, ctx: &Context<'_>) -> String {
    let line = describe_in(e, ctx, None).to_string();
    if line.contains("ACL SETUSER") {
        let at = format!("Redis at {} ", ctx.at);
        return line.strip_prefix(&at).unwrap_or(&line).to_owned();
    }
    short_reason(e)
}

/// What a server's refusal or a failed connection says, without addresses.
fn short_reason(e: &RedisError) -> String {
    match e.code() {
        Some(code) => format!("{code} {}", e.detail().unwrap_or("").trim())
            .trim()
            .to_owned(),
        None => io_reason(e),
    }
}

/// A client for `info`, over TLS with `tls`'s files when given (`info` is then a
/// `rediss` address); shared with the Sentinels' (see `sentinel.rs`).
pub fn client(info: ConnectionInfo, tls: Option<&TlsFiles>) -> RedisResult<Client> {
    match tls {
        None => Client::open(info),
        Some(tls) => {
            // rustls needs a process-wide crypto provider; ring is the one built in.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let certs = redis::TlsCertificates {
                client_tls: tls
                    .client
                    .as_ref()
                    .map(|(cert, key)| redis::ClientTlsConfig {
                        client_cert: cert.clone(),
                        client_key: key.clone(),
                    }),
                root_cert: tls.ca.clone(),
            };
            Client::build_with_tls(info, certs)
        }
    }
}

/// During a failover the Sentinels may still name the old master, now a replica:
/// writing the lock there would be lost. Insist on a master.
async fn insist_on_master(
    conn: &mut MultiplexedConnection,
    ctx: &Context<'_>,
) -> Result<(), BackendError> {
    let at = ctx.at;
    let role: Value = redis::cmd("ROLE")
        .query_async(conn)
        .await
        .map_err(|e| describe_in(&e, ctx, None))?;
    let is_master = matches!(&role, Value::Array(a) if matches!(
        a.first(),
        Some(Value::BulkString(b)) if b == b"master"
    ) || matches!(a.first(), Some(Value::SimpleString(s)) if s == "master"));
    if is_master {
        Ok(())
    } else {
        Err(BackendError::Unavailable(format!(
            "Redis at {at} is not a master (failover in progress)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{ErrorKind, ServerErrorKind};

    #[test]
    fn why_no_subscription_names_the_refusal_or_the_cut() {
        let refused = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "refused",
            "unknown command 'SUBSCRIBE'".to_owned(),
        ));
        assert_eq!(short_reason(&refused), "ERR unknown command 'SUBSCRIBE'");
        let cut = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(short_reason(&cut), "connection closed");
    }
}
