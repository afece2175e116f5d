//! One connection to a Redis server, as the backend's [`Slot`] holds it: the
//! multiplexed client, and, for `--wait`, the RESP3 push channel that wake-ups arrive
//! on; [`client`] builds the client, over TLS for `rediss://` (and for a Sentinel of
//! `rediss+sentinel://`). Part of [`super`].

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionInfo, PushInfo, RedisResult, Value};
use tokio::sync::mpsc;

use super::errors::describe;
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
}

impl Connection for RedisConn {}

impl RedisConn {
    /// The wake-ups of this connection.
    pub fn pushes(&self) -> &Wakeups<mpsc::UnboundedReceiver<PushInfo>> {
        &self.pushes
    }
}

/// The connection slot of one Redis server.
pub type RedisSlot = Slot<RedisConn>;

/// Connects to `target` (asking the Sentinels first if it is behind Sentinel).
/// `notifications` asks for RESP3 with a push channel (`--wait`, Redis 6 or later).
/// `at` is the server as `host:port`, for messages; behind Sentinel, messages name the
/// master's address instead, as the Sentinels gave it.
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
    // Behind Sentinel, the master's address, and how to name it in messages (so that
    // its refusals are told apart from a Sentinel's).
    let (info, at) = match &target.sentinel {
        None => (target.info.clone(), at.to_owned()),
        Some(sentinels) => {
            let (addr, master) = sentinels.master_address(target.tls.as_ref()).await?;
            (target.info.clone().set_addr(addr), master)
        }
    };
    let client = client(info.set_redis_settings(settings), target.tls.as_ref())
        .map_err(|e| describe(&e, &at))?;
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&conn_config)
        .await
        .map_err(|e| describe(&e, &at))?;
    if target.sentinel.is_some() {
        insist_on_master(&mut conn, &at).await?;
    }
    Ok(RedisConn {
        conn,
        pushes: Wakeups::new(pushes),
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
async fn insist_on_master(conn: &mut MultiplexedConnection, at: &str) -> Result<(), BackendError> {
    let role: Value = redis::cmd("ROLE")
        .query_async(conn)
        .await
        .map_err(|e| describe(&e, at))?;
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
