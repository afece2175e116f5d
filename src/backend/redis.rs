//! The Redis backend (`redis://`, `rediss://`): one server, or Valkey.
//!
//! Keys of lock `NAME` under prefix `P` (all in one Cluster slot thanks to the
//! `{NAME}` hash tag):
//! - `P{NAME}`: a hash `token`, `fence`, `host`, `pid`, `since_ms`, with the lease as
//!   its PX expiry;
//! - `P{NAME}:fence`: the fencing counter (see the `acquire` script);
//! - `P{NAME}:waiters` and `P{NAME}:alive`: the queue of `--wait`ers and their
//!   heartbeats; a release wakes only the longest-waiting live one, on its own pub/sub
//!   channel `P{NAME}:wake:ID`.
//!
//! Every step is one Lua script (`redis_scripts.lua`), atomic on the server, sent
//! with EVAL: one round trip, and nothing to reload after a server restart. Renew and
//! release compare the stored token with ours before touching the key.
//!
//! The connection is made lazily and dropped after any error or abandoned call
//! (the caller's timeout), so a hung or cut connection is replaced on the next call.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ErrorKind, IntoConnectionInfo, PushInfo, RedisError, ServerErrorKind,
    Value,
};
use tokio::sync::mpsc;

use super::{wait_slice, Acquire, AcquireRequest, Backend, BackendError, Holder, Release};
use crate::config::{BackendConfig, RedisTarget, Sentinels};

const SCRIPTS: &str = include_str!("redis_scripts.lua");

/// How long a waiter's heartbeat lasts; a waiter re-checks (and so renews it) at least
/// every [`super::MAX_WAIT_SLICE`].
const WAITER_ALIVE: Duration = Duration::from_secs(6);

/// The text of script `name` (the wake helper prepended where needed).
fn script(name: &str) -> &'static str {
    static PARSED: OnceLock<Vec<(String, String)>> = OnceLock::new();
    let parsed = PARSED.get_or_init(|| {
        let sections: Vec<(&str, &str)> = SCRIPTS
            .split("\n--@")
            .skip(1)
            .filter_map(|s| s.split_once('\n'))
            .collect();
        let wake = sections
            .iter()
            .find(|(n, _)| *n == "wake_fn")
            .map_or("", |(_, b)| *b);
        sections
            .iter()
            .map(|(n, body)| {
                let body = if body.contains("wake_one(") && *n != "wake_fn" {
                    format!("{wake}\n{body}")
                } else {
                    (*body).to_owned()
                };
                ((*n).to_owned(), body)
            })
            .collect()
    });
    parsed
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| b.as_str())
        .unwrap_or("return redis.error_reply('lockrun: missing script')")
}

/// The keys of one lock.
struct Keys {
    lock: String,
    fence: String,
    queue: String,
    alive: String,
    wake_prefix: String,
}

impl Keys {
    fn new(prefix: &str, name: &str) -> Keys {
        let base = format!("{prefix}{{{name}}}");
        Keys {
            fence: format!("{base}:fence"),
            queue: format!("{base}:waiters"),
            alive: format!("{base}:alive"),
            wake_prefix: format!("{base}:wake:"),
            lock: base,
        }
    }
}

/// A lock backend on one Redis server.
pub struct RedisBackend {
    target: RedisTarget,
    display: String,
    key_prefix: String,
    state: Mutex<ConnState>,
    notifications: bool,
    waiter_id: String,
}

/// The connection and what rides on it; replaced as a whole after any failure.
#[derive(Default)]
struct ConnState {
    conn: Option<MultiplexedConnection>,
    /// Set when waiting: the connection speaks RESP3 so that wake-ups arrive on it.
    pushes: Option<mpsc::UnboundedReceiver<PushInfo>>,
    subscribed: bool,
}

impl RedisBackend {
    /// A backend for `config`; `notifications` asks for a connection that can receive
    /// wake-ups (needed for `--wait`, Redis 6 or later).
    pub fn new(target: RedisTarget, config: &BackendConfig, notifications: bool) -> RedisBackend {
        RedisBackend {
            target,
            display: config.display.clone(),
            key_prefix: config.key_prefix.clone(),
            state: Mutex::new(ConnState::default()),
            notifications,
            waiter_id: crate::token::random_hex(8),
        }
    }

    /// The connection state; the lock is never held across an await.
    fn state(&self) -> std::sync::MutexGuard<'_, ConnState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets the connection: the next call makes a new one.
    fn reset(&self) {
        *self.state() = ConnState::default();
    }

    /// The connection, made if needed.
    async fn connection(&self) -> Result<MultiplexedConnection, BackendError> {
        if let Some(c) = &self.state().conn {
            return Ok(c.clone());
        }
        let mut pushes = None;
        let mut settings = self
            .target
            .info
            .redis_settings()
            .clone()
            .set_skip_set_lib_name();
        let mut conn_config = AsyncConnectionConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(None);
        if self.notifications {
            settings = settings.set_protocol(redis::ProtocolVersion::RESP3);
            let (tx, rx) = mpsc::unbounded_channel();
            conn_config = conn_config.set_push_sender(tx);
            pushes = Some(rx);
        }
        let info = match &self.target.sentinel {
            None => self.target.info.clone(),
            Some(sentinels) => self.master_address(sentinels).await?,
        }
        .set_redis_settings(settings);
        let client = match &self.target.tls {
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
        .map_err(|e| self.error(&e))?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&conn_config)
            .await
            .map_err(|e| self.error(&e))?;
        if self.target.sentinel.is_some() {
            // During a failover the Sentinels may still name the old master, now a
            // replica: writing the lock there would be lost. Insist on a master.
            let role: Value = redis::cmd("ROLE")
                .query_async(&mut conn)
                .await
                .map_err(|e| self.error(&e))?;
            let is_master =
                matches!(&role, Value::Array(a) if a.first().is_some_and(|r| text(r) == "master"));
            if !is_master {
                return Err(BackendError::Unavailable(format!(
                    "the server {} names is not a master (failover in progress)",
                    self.display
                )));
            }
        }
        *self.state() = ConnState {
            conn: Some(conn.clone()),
            pushes,
            subscribed: false,
        };
        Ok(conn)
    }

    /// Asks the Sentinels, in turn, for the master's address.
    async fn master_address(
        &self,
        sentinels: &Sentinels,
    ) -> Result<redis::ConnectionInfo, BackendError> {
        let mut last_error = String::from("no Sentinel answered");
        for addr in &sentinels.addrs {
            let ask = async {
                let client = redis::Client::open(format!("redis://{addr}"))?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&sentinels.master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            match tokio::time::timeout(Duration::from_secs(1), ask).await {
                Ok(Ok(Some((host, port)))) => {
                    return format!("redis://{host}:{port}")
                        .into_connection_info()
                        .map_err(|e| self.error(&e));
                }
                Ok(Ok(None)) => {
                    last_error = format!(
                        "Sentinel {addr} does not know a master named {:?}",
                        sentinels.master
                    )
                }
                Ok(Err(e)) => last_error = format!("Sentinel {addr}: {}", io_reason(&e)),
                Err(_) => last_error = format!("Sentinel {addr} did not answer within 1s"),
            }
        }
        Err(BackendError::Unavailable(last_error))
    }

    /// Runs script `name`; any failure drops the connection so the next call starts
    /// afresh. If the caller abandons the call (timeout), the connection is dropped too.
    async fn eval(&self, name: &str, keys: &[&str], args: &[&str]) -> Result<Value, BackendError> {
        let mut conn = self.connection().await?;
        // An abandoned call (the caller's timeout) leaves the connection in an unknown
        // state: it is forgotten unless the call completes.
        let guard = ResetOnDrop(self);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script(name)).arg(keys.len()).arg(keys).arg(args);
        let reply = cmd.query_async::<Value>(&mut conn).await;
        std::mem::forget(guard);
        reply.map_err(|e| {
            self.reset();
            self.error(&e)
        })
    }

    /// Translates a client error into a message that names the server as `host:port`
    /// only (never the URL, which may hold a password).
    fn error(&self, e: &RedisError) -> BackendError {
        let at = &self.display;
        let detail = e.detail().unwrap_or("").trim();
        let refused = |what: &str| BackendError::Refused(format!("Redis at {at} {what}"));
        match e.kind() {
            ErrorKind::AuthenticationFailed => refused(&format!(
                "refused authentication: check the password or user ({detail})"
            )),
            ErrorKind::Server(ServerErrorKind::NoPerm) => refused(&format!(
                "denied a command to this user: grant it EVAL, PUBLISH and SUBSCRIBE ({detail})"
            )),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::ClusterDown,
            ) => BackendError::Unavailable(format!(
                "Redis at {at} is not ready: {}",
                e.code().unwrap_or("error")
            )),
            ErrorKind::Server(_) if e.code() == Some("NOAUTH") || e.code() == Some("WRONGPASS") => {
                refused(&format!(
                    "refused authentication: check the password or user ({detail})"
                ))
            }
            ErrorKind::Server(_)
            | ErrorKind::Extension
            | ErrorKind::UnexpectedReturnType
            | ErrorKind::Parse => refused(&format!(
                "answered with an error: {} {detail}",
                e.code().unwrap_or("")
            )),
            ErrorKind::InvalidClientConfig | ErrorKind::RESP3NotSupported => refused(&format!(
                "cannot be used: {}",
                if e.kind() == ErrorKind::RESP3NotSupported {
                    "--wait needs Redis 6 or later"
                } else {
                    "bad client configuration"
                }
            )),
            _ if is_tls_trust_error(e) => refused(&format!(
                "presented a certificate that is not trusted ({}): set LOCKRUN_TLS_CA to the CA that signed it",
                io_reason(e)
            )),
            _ => BackendError::Unavailable(format!("cannot reach Redis at {at}: {}", io_reason(e))),
        }
    }

    /// One run of the acquire script; as a waiter, it also joins the queue (or
    /// refreshes this waiter's heartbeat) when the lock is busy.
    async fn try_acquire(
        &self,
        name: &str,
        req: &AcquireRequest,
        waiter: bool,
    ) -> Result<Acquire, BackendError> {
        let k = Keys::new(&self.key_prefix, name);
        let waiter_id = if waiter { self.waiter_id.as_str() } else { "" };
        let reply = self
            .eval(
                "acquire",
                &[&k.lock, &k.fence, &k.queue, &k.alive],
                &[
                    &req.token,
                    &ms(req.ttl),
                    &req.host,
                    &req.pid.to_string(),
                    waiter_id,
                    &ms(WAITER_ALIVE),
                ],
            )
            .await?;
        let fields = array(reply);
        match fields.split_first() {
            Some((Value::Int(1), [fence])) => Ok(Acquire::Acquired {
                fencing_token: number(fence),
            }),
            Some((Value::Int(0), rest)) => Ok(Acquire::Busy(holder(rest).unwrap_or_default())),
            _ => Err(BackendError::Refused(format!(
                "Redis at {} gave an unexpected answer to the acquire script",
                self.display
            ))),
        }
    }

    async fn subscribe(&self, name: &str) -> Result<(), BackendError> {
        let mut conn = self.connection().await?;
        if self.state().subscribed {
            return Ok(());
        }
        let channel = format!(
            "{}{}",
            Keys::new(&self.key_prefix, name).wake_prefix,
            self.waiter_id
        );
        let guard = ResetOnDrop(self);
        let reply = conn.subscribe(&channel).await;
        std::mem::forget(guard);
        match reply {
            Ok(()) => {
                self.state().subscribed = true;
                Ok(())
            }
            Err(e) => {
                self.reset();
                Err(self.error(&e))
            }
        }
    }
}

/// Forgets the backend's connection if dropped: armed around each request and
/// defused (forgotten) when the request completes.
struct ResetOnDrop<'a>(&'a RedisBackend);

impl Drop for ResetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.reset();
    }
}

/// The operating-system reason of an I/O error, without addresses.
fn io_reason(e: &RedisError) -> String {
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

/// True for a TLS handshake that failed on the server's certificate: retrying will
/// not help, and never falls back to plain text.
fn is_tls_trust_error(e: &RedisError) -> bool {
    let text = format!("{e}").to_ascii_lowercase();
    text.contains("certificate") || text.contains("unknownissuer")
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

fn number(v: &Value) -> u64 {
    match v {
        Value::Int(i) => u64::try_from(*i).unwrap_or(0),
        other => text(other).parse().unwrap_or(0),
    }
}

fn array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => Vec::new(),
    }
}

/// Parses `{host, pid, since_ms, fence, pttl}`.
fn holder(f: &[Value]) -> Option<Holder> {
    let [host, pid, since, fence, pttl] = f else {
        return None;
    };
    Some(Holder {
        host: text(host),
        pid: u32::try_from(number(pid)).unwrap_or(0),
        since_ms: number(since),
        fencing_token: number(fence),
        // -1: a key without expiry, which lockrun never writes; show it as zero left.
        ttl_left: Duration::from_millis(number(pttl)),
    })
}

fn ms(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

impl RedisBackend {
    /// Raises this server's fencing counter for `name` to at least `fence`, and records
    /// `fence` on the lock entry if it holds `token` (Redlock's write-back).
    pub async fn raise_fence(
        &self,
        name: &str,
        fence: u64,
        token: &str,
    ) -> Result<(), BackendError> {
        let k = Keys::new(&self.key_prefix, name);
        self.eval(
            "fence_floor",
            &[&k.fence, &k.lock],
            &[&fence.to_string(), token],
        )
        .await?;
        Ok(())
    }

    /// `host:port` of this server.
    pub fn display(&self) -> &str {
        &self.display
    }
}

impl Backend for RedisBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let waiting = self.notifications;
        let first = self.try_acquire(name, req, waiting).await?;
        if !waiting || matches!(first, Acquire::Acquired { .. }) || self.state().subscribed {
            return Ok(first);
        }
        // Busy, and about to wait: subscribe to this waiter's wake-up channel, then try
        // once more, so a release that came between the first try and the
        // subscription is not missed. An uncontended run never pays for this.
        self.subscribe(name).await?;
        self.try_acquire(name, req, waiting).await
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        let k = Keys::new(&self.key_prefix, name);
        match self.eval("renew", &[&k.lock], &[token, &ms(ttl)]).await? {
            Value::Int(1) => Ok(()),
            _ => Err(BackendError::NotOwner),
        }
    }

    async fn release(&self, name: &str, token: &str, how: Release) -> Result<(), BackendError> {
        let k = Keys::new(&self.key_prefix, name);
        let keep = match how {
            Release::Now => "0".to_owned(),
            Release::KeepFor(d) => ms(d),
        };
        match self
            .eval(
                "release",
                &[&k.lock, &k.queue, &k.alive],
                &[token, &keep, &k.wake_prefix],
            )
            .await?
        {
            Value::Int(1) => Ok(()),
            _ => Err(BackendError::NotOwner),
        }
    }

    async fn inspect(&self, name: &str) -> Result<Option<Holder>, BackendError> {
        let k = Keys::new(&self.key_prefix, name);
        let reply = self.eval("inspect", &[&k.lock], &[]).await?;
        Ok(holder(&array(reply)))
    }

    async fn force_release(&self, name: &str) -> Result<Option<Holder>, BackendError> {
        let k = Keys::new(&self.key_prefix, name);
        let reply = self
            .eval("force", &[&k.lock, &k.queue, &k.alive], &[&k.wake_prefix])
            .await?;
        Ok(holder(&array(reply)))
    }

    async fn wait_for_release(
        &self,
        _name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        // The cap also keeps this waiter's heartbeat fresh (it is renewed by each try).
        let slice = wait_slice(busy.ttl_left, max);
        let taken = self.state().pushes.take();
        let Some(mut pushes) = taken else {
            tokio::time::sleep(slice).await;
            return Ok(());
        };
        let deadline = tokio::time::Instant::now() + slice;
        loop {
            match tokio::time::timeout_at(deadline, pushes.recv()).await {
                Err(_elapsed) => break,
                // The connection is gone; the next call reconnects and resubscribes.
                Ok(None) => {
                    self.reset();
                    return Ok(());
                }
                Ok(Some(push)) => match push.kind {
                    redis::PushKind::Message => break,
                    redis::PushKind::Disconnection => {
                        self.reset();
                        return Ok(());
                    }
                    _ => continue,
                },
            }
        }
        let mut state = self.state();
        if state.conn.is_some() {
            state.pushes = Some(pushes);
        }
        Ok(())
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        if !self.notifications {
            return Ok(());
        }
        let k = Keys::new(&self.key_prefix, name);
        self.eval("leave", &[&k.queue, &k.alive], &[&self.waiter_id])
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = Keys::new("lockrun:", "nightly/backup");
        assert_eq!(k.lock, "lockrun:{nightly/backup}");
        assert_eq!(k.fence, "lockrun:{nightly/backup}:fence");
        assert!(k.queue.starts_with("lockrun:{nightly/backup}:"));
        assert!(k.alive.starts_with("lockrun:{nightly/backup}:"));
        assert_eq!(k.wake_prefix, "lockrun:{nightly/backup}:wake:");
    }

    #[test]
    fn every_script_is_found_and_wake_helper_is_prepended() {
        for name in [
            "acquire",
            "renew",
            "release",
            "leave",
            "inspect",
            "force",
            "fence_floor",
        ] {
            assert!(!script(name).contains("missing script"), "{name}");
        }
        assert!(script("release").contains("local function wake_one"));
        assert!(script("force").contains("local function wake_one"));
        assert!(!script("renew").contains("wake_one"));
        assert!(script("missing").contains("missing script"));
    }

    #[test]
    fn holder_fields_parse() {
        let f = [
            Value::BulkString(b"host1".to_vec()),
            Value::BulkString(b"42".to_vec()),
            Value::BulkString(b"1700000000000".to_vec()),
            Value::BulkString(b"1700000000000123".to_vec()),
            Value::Int(2500),
        ];
        let h = holder(&f).unwrap();
        assert_eq!(h.host, "host1");
        assert_eq!(h.pid, 42);
        assert_eq!(h.fencing_token, 1_700_000_000_000_123);
        assert_eq!(h.ttl_left, Duration::from_millis(2500));
        assert!(holder(&f[..4]).is_none());
    }
}
