//! One connection to a Redis server, as the backend's [`Slot`] holds it: the
//! multiplexed client, and, for `--wait`, the RESP3 push channel that wake-ups arrive
//! on; [`client`] builds the client, over TLS for `rediss://` (and for a Sentinel of
//! `rediss+sentinel://`). Part of [`super`].
//!
//! A wrong scheme for the port is told apart from a server that is down (see
//! `probe.rs`): a `rediss://` handshake still going after `probe::SUSPECT_AFTER`, and
//! a `redis://` connection closed before the server answered anything, make lockrun
//! look at the port, and a port that speaks the other scheme is a refusal naming it.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, PushInfo, RedisError,
    RedisResult, Value,
};
use tokio::sync::mpsc;

use super::errors::{self, describe_in, Context};
use super::probe;
use super::target::RedisTarget;
use crate::backend::conn::{Connection, Slot, Wakeups};
use crate::backend::tls::TlsFiles;
use crate::backend::BackendError;

/// A connection and what rides on it; replaced as a whole after any failure.
pub struct RedisConn {
    /// The client; cheap to clone (one socket, multiplexed).
    pub conn: MultiplexedConnection,
    /// Set when waiting: wake-ups (RESP3 pushes) arrive here once subscribed to the
    /// waiter's channel.
    pub pushes: Wakeups<mpsc::UnboundedReceiver<PushInfo>>,
    /// Where it is connected (the master's address, behind Sentinel).
    addr: ConnectionAddr,
    /// Whether the server has answered anything on it yet (a connection set up with
    /// `HELLO`, `AUTH` or `SELECT` has).
    answered: AtomicBool,
}

impl Connection for RedisConn {}

impl RedisConn {
    /// The wake-ups of this connection.
    pub fn pushes(&self) -> &Wakeups<mpsc::UnboundedReceiver<PushInfo>> {
        &self.pushes
    }

    /// The error line of a failed call on this connection (of `script`, if it is one):
    /// a `redis://` connection closed before the server ever answered is a TLS port
    /// if the port says so. Any answer, error or not, is [`RedisConn::answered`] first.
    pub async fn explain(
        &self,
        e: &RedisError,
        ctx: &Context<'_>,
        script: Option<super::scripts::Script>,
    ) -> BackendError {
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

    /// Notes that the server answered on this connection.
    pub fn answered(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }
}

/// The connection slot of one Redis server.
pub type RedisSlot = Slot<RedisConn>;

/// Connects to `target` (asking the Sentinels first if it is behind Sentinel).
/// `notifications` asks for RESP3 with a push channel (`--wait`, Redis 6 or later).
/// `at` is the server as `host:port`, for messages; behind Sentinel, messages name the
/// master's address instead, as the Sentinels gave it (so that its refusals are told
/// apart from a Sentinel's).
pub async fn connect(
    target: &RedisTarget,
    notifications: bool,
    at: &str,
) -> Result<RedisConn, BackendError> {
    let mut settings = target.info.redis_settings().clone().set_skip_set_lib_name();
    let mut conn_config = AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(None);
    let mut pushes = None;
    if notifications {
        settings = settings.set_protocol(redis::ProtocolVersion::RESP3);
        let (tx, rx) = mpsc::unbounded_channel();
        conn_config = conn_config.set_push_sender(tx);
        pushes = Some(rx);
    }
    let (info, master) = match &target.sentinel {
        None => (target.info.clone(), None),
        Some(sentinels) => {
            let (addr, master) = sentinels.master_address(target.tls.as_ref()).await?;
            (target.info.clone().set_addr(addr), Some(master))
        }
    };
    let at = master.as_deref().unwrap_or(at);
    let ctx = Context::new(target, at, "");
    let info = info.set_redis_settings(settings);
    let addr = info.addr().clone();
    // Something is exchanged while connecting: HELLO, AUTH or SELECT.
    let exchanged = notifications
        || info.redis_settings().password().is_some()
        || info.redis_settings().db() != 0;
    let client = client(info, target.tls.as_ref()).map_err(|e| describe_in(&e, &ctx, None))?;
    let connecting = client.get_multiplexed_async_connection_with_config(&conn_config);
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
        Err(e) => return Err(describe_in(&e, &ctx, None)),
    };
    if target.sentinel.is_some() {
        insist_on_master(&mut conn, &ctx).await?;
    }
    Ok(RedisConn {
        conn,
        pushes: Wakeups::new(pushes),
        addr,
        answered: AtomicBool::new(exchanged || target.sentinel.is_some()),
    })
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
