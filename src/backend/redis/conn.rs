//! Connections to a Redis server, as the backend's [`Slot`]s hold them: the multiplexed
//! client that every script goes through, and, for `--wait`, a second connection
//! subscribed to this waiter's wake-up channel. Part of [`super`].
//!
//! Both speak RESP2 and send nothing before the first command but what the URL asks
//! for (AUTH, SELECT): no `HELLO`, no `CLIENT SETINFO`. So a proxy that knows only the
//! plain commands (twemproxy, several managed proxies) and Redis 5 serve every run,
//! `--wait` included; wake-ups arrive as RESP2 pub/sub messages on the second
//! connection, made only once a lock was found busy. Where it cannot be made (a proxy
//! without pub/sub, `SUBSCRIBE` renamed away or denied), the backend polls instead.

use futures_util::StreamExt;
use redis::aio::{MultiplexedConnection, PubSubStream};
use redis::{AsyncConnectionConfig, RedisError, Value};

use super::errors::{describe, io_reason};
use super::target::RedisTarget;
use crate::backend::conn::{Connection, Slot, Wakeups};
use crate::backend::BackendError;

/// A connection for scripts; replaced as a whole after any failure.
pub struct RedisConn {
    /// The client; cheap to clone (one socket, multiplexed).
    pub conn: MultiplexedConnection,
}

impl Connection for RedisConn {}

/// The connection slot of one Redis server.
pub type RedisSlot = Slot<RedisConn>;

/// A connection subscribed to one waiter's wake-up channel: every message on it is a
/// wake-up. Its end (the server or the network closed it) ends the stream.
pub struct Subscriber {
    messages: Wakeups<PubSubStream>,
}

impl Connection for Subscriber {}

impl Subscriber {
    /// The wake-ups of this connection (subscribed from the start).
    pub fn messages(&self) -> &Wakeups<PubSubStream> {
        &self.messages
    }
}

/// Waits for the next wake-up on `messages`: `None` when the connection is gone.
pub async fn next_wakeup(messages: &mut PubSubStream) -> Option<()> {
    messages.next().await.map(|_| ())
}

/// The subscriber slot of one Redis server.
pub type SubscriberSlot = Slot<Subscriber>;

/// The client for `target`'s server (asking the Sentinels first if it is behind
/// Sentinel), RESP2 (whatever the URL's `protocol`) without `CLIENT SETINFO`.
async fn client(target: &RedisTarget, at: &str) -> Result<redis::Client, BackendError> {
    let settings = target
        .info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP2)
        .set_skip_set_lib_name();
    let info = match &target.sentinel {
        None => target.info.clone(),
        Some(sentinels) => sentinels.master_address().await?,
    }
    .set_redis_settings(settings);
    match &target.tls {
        None => redis::Client::open(info),
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
            redis::Client::build_with_tls(info, certs)
        }
    }
    .map_err(|e| describe(&e, at))
}

/// Connects to `target` for scripts. `at` is the server as `host:port`, for messages.
pub async fn connect(target: &RedisTarget, at: &str) -> Result<RedisConn, BackendError> {
    let conn_config = AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(None);
    let mut conn = client(target, at)
        .await?
        .get_multiplexed_async_connection_with_config(&conn_config)
        .await
        .map_err(|e| describe(&e, at))?;
    if target.sentinel.is_some() {
        insist_on_master(&mut conn, at).await?;
    }
    Ok(RedisConn { conn })
}

/// Connects to `target` and subscribes to `channel`. The error says why not, in a
/// few words for the line that tells that waiting polls instead.
pub async fn subscribe(
    target: &RedisTarget,
    channel: &str,
    at: &str,
) -> Result<Subscriber, String> {
    let client = client(target, at).await.map_err(|e| e.to_string())?;
    let mut pubsub = client
        .get_async_pubsub()
        .await
        .map_err(|e| format!("connecting: {}", reason(&e)))?;
    pubsub
        .subscribe(channel)
        .await
        .map_err(|e| format!("SUBSCRIBE: {}", reason(&e)))?;
    let (_, stream) = pubsub.split();
    let messages = Wakeups::new(Some(stream));
    messages.set_subscribed();
    Ok(Subscriber { messages })
}

/// What a server's refusal or a failed connection says, without addresses.
fn reason(e: &RedisError) -> String {
    match e.code() {
        Some(code) => format!("{code} {}", e.detail().unwrap_or("").trim())
            .trim()
            .to_owned(),
        None => io_reason(e),
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
            "the server {at} names is not a master (failover in progress)"
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
        assert_eq!(reason(&refused), "ERR unknown command 'SUBSCRIBE'");
        let cut = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(reason(&cut), "connection closed");
    }
}
