//! The Redis backend: one server (`redis://`, `rediss://`, or Valkey), or the master
//! behind Sentinel (`redis+sentinel://`); [`redlock`] builds a quorum of these.
//!
//! Keys of lock `NAME` under prefix `P` all carry the `{NAME}` hash tag (see
//! `scripts::Keys`): the lock hash with the lease as its PX expiry, the fencing
//! counter, and the queue of `--wait`ers with their heartbeats; a release wakes only
//! the longest-waiting live waiter, on its own pub/sub channel.
//!
//! Every key expires (SPEC property 8): the scripts check their lease arguments (1 ms
//! to [`MAX_LEASE`]) before writing anything, and each key gets its expiry in the
//! command that writes it or right after it; a lock found without an expiry is given
//! [`MAX_LEASE`]; the waiters' keys last two heartbeats; the fencing counter lasts
//! [`FENCE_KEEP`] after the last acquisition (why tokens still increase: see there).
//!
//! Every step is one Lua script (`scripts::Script`), atomic on the server, sent with
//! EVAL: one round trip, and nothing to reload after a server restart. Renew and
//! release compare the stored token with ours before touching the key.
//!
//! The connection lives in a [`crate::backend::conn::Slot`]: made lazily, dropped
//! after any error or abandoned call (the caller's timeout), made anew next time.
//!
//! Files: `target.rs` (the URL), `sentinel.rs` (Sentinel URLs and master lookup),
//! `conn.rs` (connecting), `errors.rs` (error lines), `scripts.rs` + `scripts/*.lua`,
//! `redlock.rs` (the quorum).

mod conn;
mod errors;
pub mod redlock;
mod scripts;
pub mod sentinel;
mod target;

use std::time::Duration;

use redis::{FromRedisValue, Value};

use crate::backend::conn::{self as slot, InUse};
use crate::backend::{wait_slice, Acquire, AcquireRequest, Backend, BackendError, Holder, Release};
use crate::config::BackendConfig;
use conn::{RedisConn, RedisSlot};
use scripts::{AcquireReply, Done, HolderReply, Keys, Script};
pub use scripts::{FENCE_KEEP, MAX_LEASE};
pub use target::{RedisTarget, KIND};

/// The Lua source lockrun sends for its script `name` (`acquire`, `renew`, `release`,
/// `fence_floor`, `leave`, `inspect`, `force`), helpers included: what an operator
/// or a test can EVAL by hand to see exactly what lockrun runs.
pub fn script_source(name: &str) -> Option<&'static str> {
    Script::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .map(Script::source)
}

/// How long a waiter's heartbeat lasts; a waiter re-checks (and so renews it) at least
/// every [`crate::backend::MAX_WAIT_SLICE`].
const WAITER_ALIVE: Duration = Duration::from_secs(6);

/// A lock backend on one Redis server.
pub struct RedisBackend {
    target: RedisTarget,
    display: String,
    key_prefix: String,
    slot: RedisSlot,
    notifications: bool,
    waiter_id: String,
}

impl RedisBackend {
    /// A backend for `target`; `notifications` asks for a connection that can receive
    /// wake-ups (needed for `--wait`, Redis 6 or later).
    pub fn new(target: RedisTarget, config: &BackendConfig, notifications: bool) -> RedisBackend {
        RedisBackend {
            target,
            display: config.display.clone(),
            key_prefix: config.key_prefix.clone(),
            slot: RedisSlot::default(),
            notifications,
            waiter_id: crate::token::random_hex(8),
        }
    }

    /// `host:port` of this server.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The connection for one call, made if needed.
    async fn conn(&self) -> Result<InUse<'_, RedisConn>, BackendError> {
        self.slot
            .get(|_| conn::connect(&self.target, self.notifications, &self.display))
            .await
    }

    /// Runs `script` on lock `name` with `args` and parses its reply. A failed call
    /// drops the connection (so does an abandoned one); a reply that does not parse is
    /// a refusal, never a made-up default.
    async fn eval<T: FromRedisValue>(
        &self,
        script: Script,
        name: &str,
        args: &[&str],
    ) -> Result<T, BackendError> {
        let keys = Keys::new(&self.key_prefix, name);
        let c = self.conn().await?;
        let mut conn = c.conn.clone();
        let reply = redis::cmd("EVAL")
            .arg(script.source())
            .arg(script.key_count())
            .arg(keys.for_script(script))
            .arg(args)
            .query_async::<Value>(&mut conn)
            .await;
        let value = c.settle(reply.map_err(|e| errors::describe(&e, &self.display)))?;
        scripts::parse(script, value).map_err(|bad| {
            BackendError::Refused(format!("Redis at {} gave {}", self.display, bad.0))
        })
    }

    /// One run of the acquire script; as a waiter, it also joins the queue (or
    /// refreshes this waiter's heartbeat) when the lock is busy.
    async fn try_acquire(
        &self,
        name: &str,
        req: &AcquireRequest,
        waiter: bool,
    ) -> Result<Acquire, BackendError> {
        let waiter_id = if waiter { self.waiter_id.as_str() } else { "" };
        let args = [
            req.token.as_str(),
            &ms(req.ttl),
            &req.host,
            &req.pid.to_string(),
            waiter_id,
            &ms(WAITER_ALIVE),
        ];
        Ok(match self.eval(Script::Acquire, name, &args).await? {
            AcquireReply::Acquired(fencing_token) => Acquire::Acquired {
                fencing_token,
                slot: 0,
            },
            AcquireReply::Busy(holder) => Acquire::Busy(holder),
        })
    }

    /// Subscribes the connection to this waiter's wake-up channel.
    async fn subscribe(&self, name: &str) -> Result<(), BackendError> {
        let c = self.conn().await?;
        if c.pushes.is_subscribed() {
            c.keep();
            return Ok(());
        }
        let channel = format!(
            "{}{}",
            Keys::new(&self.key_prefix, name).wake_prefix,
            self.waiter_id
        );
        let mut conn = c.conn.clone();
        let reply = conn.subscribe(&channel).await;
        if reply.is_ok() {
            c.pushes.set_subscribed();
        }
        c.settle(reply.map_err(|e| errors::describe(&e, &self.display)))
    }

    /// Raises this server's fencing counter for `name` to at least `fence`, and records
    /// `fence` on the lock entry if it holds `token` (Redlock's write-back).
    pub async fn raise_fence(
        &self,
        name: &str,
        fence: u64,
        token: &str,
    ) -> Result<(), BackendError> {
        let Done(_) = self
            .eval(Script::FenceFloor, name, &[&fence.to_string(), token])
            .await?;
        Ok(())
    }
}

fn ms(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

/// A renew or release answer: 1 done, 0 not ours.
fn owned(Done(done): Done) -> Result<(), BackendError> {
    if done {
        Ok(())
    } else {
        Err(BackendError::NotOwner)
    }
}

impl Backend for RedisBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let waiting = self.notifications;
        let first = self.try_acquire(name, req, waiting).await?;
        if !waiting
            || matches!(first, Acquire::Acquired { .. })
            || slot::subscribed(&self.slot, RedisConn::pushes)
        {
            return Ok(first);
        }
        // Busy, and about to wait: subscribe to this waiter's wake-up channel, then try
        // once more, so a release that came between the first try and the
        // subscription is not missed. An uncontended run never pays for this.
        self.subscribe(name).await?;
        self.try_acquire(name, req, waiting).await
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        owned(self.eval(Script::Renew, name, &[token, &ms(ttl)]).await?)
    }

    async fn release(&self, name: &str, token: &str, how: Release) -> Result<(), BackendError> {
        let keep = match how {
            Release::Now => "0".to_owned(),
            Release::KeepFor(d) => ms(d),
        };
        let wake_prefix = Keys::new(&self.key_prefix, name).wake_prefix;
        owned(
            self.eval(Script::Release, name, &[token, &keep, &wake_prefix])
                .await?,
        )
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let one: Result<Option<Holder>, BackendError> = async {
            let HolderReply(holder) = self.eval(Script::Inspect, name, &[]).await?;
            Ok(holder)
        }
        .await;
        Ok(one?.into_iter().collect())
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let one: Result<Option<Holder>, BackendError> = async {
            let wake_prefix = Keys::new(&self.key_prefix, name).wake_prefix;
            let HolderReply(holder) = self.eval(Script::Force, name, &[&wake_prefix]).await?;
            Ok(holder)
        }
        .await;
        Ok(one?.into_iter().collect())
    }

    async fn wait_for_release(
        &self,
        _name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        // The cap also keeps this waiter's heartbeat fresh (it is renewed by each try).
        let slice = wait_slice(busy.ttl_left, max);
        slot::wait_for_wakeup(&self.slot, RedisConn::pushes, slice, async |pushes| loop {
            match pushes.recv().await?.kind {
                redis::PushKind::Message => return Some(()),
                // The connection is gone; the next call reconnects and resubscribes.
                redis::PushKind::Disconnection => return None,
                _ => continue,
            }
        })
        .await;
        Ok(())
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        if !self.notifications {
            return Ok(());
        }
        let Done(_) = self.eval(Script::Leave, name, &[&self.waiter_id]).await?;
        Ok(())
    }
}
