//! The Redis backend: one server (`redis://`, `rediss://`, or Valkey), the master
//! behind Sentinel (`redis+sentinel://`, `rediss+sentinel://`; with the Sentinels' own
//! password and TLS, see [`sentinel`]), or a Redis Cluster (any node's `redis://` URL,
//! or `redis+cluster://` with several seeds; redirections and failovers followed in
//! `cluster.rs`); [`redlock`] builds a quorum of single servers.
//!
//! Keys of lock `NAME` under prefix `P` all carry the `{NAME}` hash tag (see
//! `scripts::Keys`): the lock hash with the lease as its PX expiry, the fencing
//! counter, and the queue of `--wait`ers with their heartbeats; a release wakes only
//! the longest-waiting live waiter, on its own pub/sub channel, and keeps the slot for
//! it for [`WAKE_GRACE`]: meanwhile anyone else who asks (a waiter whose poll timer
//! fired, a run without `--wait`) is told busy, so the woken waiter, not a later one,
//! gets the slot freed for it (`scripts/acquire.lua` says why a grace and not strict
//! order: Redlock).
//!
//! Semaphores (`--slots N`): slot 0 is the plain lock's hash, slot `i` the hash
//! `P{NAME}#i`, each with its own lease; every script that takes a slot is given all N
//! slot keys and takes the lowest free one in one atomic step, after checking that
//! every live holder was taken with the same N (a `slots` field on each hash, none
//! meaning 1; and the limit key `P{NAME}:slots`, which holds the N of the live
//! holders for as long as their longest lease, so that an acquirer with a smaller N,
//! which does not see the higher slots, is refused too). One fencing counter serves
//! every slot. A freed slot wakes one waiter; a woken waiter is marked (with the time)
//! until it tries again, so two slots freed at once wake two waiters, and as many free
//! slots as there are recently woken waiters are kept for them. Renewal goes to the slot taken
//! (remembered from the acquire); a release looks in every slot, so it also works for
//! a token whose acquire answer was lost. With N = 1 the keys, fields and round trips
//! are those of the plain lock before semaphores.
//!
//! Every key expires (docs/guarantees.md, property 8): the scripts check their lease
//! arguments (1 ms to [`MAX_LEASE`]) before writing anything, and each key gets its
//! expiry in the command that writes it or right after it; a lock found without an expiry
//! is given [`MAX_LEASE`]; the waiters' keys last two heartbeats; the fencing counter
//! lasts [`FENCE_KEEP`] after the last acquisition (why tokens still increase: see
//! there).
//!
//! Every step is one Lua script (`scripts::Script`), atomic on the server, sent with
//! EVAL: one round trip, and nothing to load beforehand or after a server restart. The
//! acquire and release scripts go by their digest (EVALSHA, the digest written in the
//! code and checked by a unit test) first: the server neither reads nor hashes their
//! 12–13 KB again.
//! A server that lacks it (restarted, or never asked before) answers `NOSCRIPT`, and
//! it goes again with EVAL, which keeps it there. Renew and release compare the stored
//! token with ours before touching the key.
//!
//! Eviction (issue 12): a server with `maxmemory` set and a `maxmemory-policy` other
//! than `noeviction` may evict a held lock (the `volatile-*` policies too: it has an
//! expiry), and a second holder would get in. The acquire script reads `INFO memory`
//! itself, so every acquisition (on a single server, a Sentinel master, each Redlock
//! node) checks the server as it is now at no extra round trip, and refuses before
//! writing anything unless `--allow-eviction` (the line: `evicting`). Where the server
//! will not let the script read INFO (an ACL without it), the lock is taken and `-v`
//! says so, once a run and server.
//!
//! The connection lives in a [`crate::backend::conn::Slot`]: made lazily, dropped
//! after any error or abandoned call (the caller's timeout), made anew next time.
//!
//! Waiting (`--wait`) without RESP3: the connection speaks RESP2 and never sends
//! `HELLO`, so an uncontended run works through any proxy. Only once the lock is
//! found busy does a waiter open a second connection, subscribed (RESP2 pub/sub) to
//! its own wake-up channel, and then ask once more, so that a release in between is
//! not missed; both happen within that acquire attempt, before the waiter sleeps (as
//! the first-come-first-served order needs: a waiter that says it waits is settled).
//! The subscription gets a twentieth of the TTL ([`subscribe_within`]), half of what
//! Redlock gives one server for the attempt. Where that connection is refused (twemproxy
//! has no pub/sub; `SUBSCRIBE` may be renamed away or denied by an ACL), or times out
//! [`TIMEOUTS_BEFORE_POLLING`] times, before any subscription worked, the waiter says
//! so once at `-v`, leaves the queue of waiters (wake-ups go to those that can hear
//! them) and polls for the rest of the run: it asks again at the busy lease's expiry,
//! at least every [`crate::backend::MAX_WAIT_SLICE`] (with jitter: [`crate::backend::wait_slice`]). A
//! subscription lost later (the connection cut) is made again at the next busy answer,
//! polling meanwhile.
//!
//! Files: `target.rs` (the URL), `sentinel.rs` (Sentinel URLs and master lookup),
//! `cluster.rs` (a Cluster's redirections, slot owner and failover),
//! `conn.rs` (connecting), `probe.rs` (which scheme a port speaks, when connecting
//! fails), `errors.rs` (error lines), `acl.rs` (the least-privilege ACL rule, which a
//! denied command's error line quotes), `scripts.rs` + `scripts/*.lua`, `replies.rs`
//! (their answers), `redlock.rs` + `redlock/votes.rs` (the quorum).

pub mod acl;
mod cluster;
mod conn;
mod errors;
mod grants;
mod names;
mod probe;
pub(crate) mod redlock;
mod replies;
mod requests;
mod scripts;
pub(crate) mod sentinel;
mod socket;
mod target;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::FromRedisValue;

use crate::backend::conn::InUse;
use crate::backend::url::BackendConfig;
use crate::backend::{slots_conflict, AcquireRequest, Backend, BackendError};
use crate::clock::BootInstant;
use crate::log::{emit, Event, Level};
use conn::{RedisConn, RedisSlot, SubscriberSlot};
use replies::{AcquireReply, Checked, Done, HoldersReply};
pub use scripts::{script_sha1, script_source, FENCE_KEEP, MAX_LEASE, WAKE_GRACE};
use scripts::{Keys, Script};
pub use target::{RedisTarget, KIND};

/// How long a waiter's heartbeat lasts; a waiter re-checks (and so renews it) at least
/// every [`crate::backend::MAX_WAIT_SLICE`].
const WAITER_ALIVE: Duration = Duration::from_secs(6);

/// How long a waiter gives its wake-up connection to connect and subscribe, within the
/// acquire attempt that found the lock busy: a twentieth of the TTL (half of Redlock's
/// per-server timeout), between 25 ms and 500 ms.
pub fn subscribe_within(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(25), Duration::from_millis(500))
}

/// A waiter whose subscriptions timed out this many times, and never worked, polls.
pub const TIMEOUTS_BEFORE_POLLING: u32 = 3;

/// A lock backend on one Redis server.
pub struct RedisBackend {
    target: RedisTarget,
    display: String,
    key_prefix: String,
    /// The N of `--slots` (1: a plain lock).
    slots: u32,
    connection: RedisSlot,
    /// Where the name's Cluster slot lives (follows nothing for a single server).
    router: cluster::Router,
    /// Waiting for wake-ups (`--wait`): join the queue of waiters, subscribe when busy.
    notifications: bool,
    /// The connection subscribed to this waiter's wake-up channel, once the lock was
    /// found busy.
    subscriber: SubscriberSlot,
    /// Set once a subscription succeeded: a later failure is a lost connection, not a
    /// server without pub/sub.
    subscribed_once: AtomicBool,
    /// Subscriptions that timed out so far.
    timeouts: AtomicU32,
    /// Set when no subscription could be made: this waiter polls for the rest of the
    /// run, out of the queue.
    polling: AtomicBool,
    waiter_id: String,
    /// This waiter's place in the queue (µs), given by Redlock, the same on every
    /// server; `None`: the server's time when it first joins.
    place: Option<u64>,
    /// The token and slot of our last acquisition, for renewals to go to that slot
    /// only. Held for no await.
    taken: Mutex<Option<(String, u32)>>,
    /// Set once `-v` was told that this server would not let the eviction check run.
    told_unchecked: AtomicBool,
    /// A waiter's grants (`grants.rs`); `None` where they are not asked for (no
    /// `--wait`, or a Redlock member: a grant is one server's, not the quorum's).
    grants: Option<grants::Grants>,
}

impl RedisBackend {
    /// A backend for `target`; `notifications` (`--wait`) asks for wake-ups when the
    /// lock is busy (polling where the server cannot give them).
    pub fn new(target: RedisTarget, config: &BackendConfig, notifications: bool) -> RedisBackend {
        RedisBackend {
            router: cluster::Router::new(target.cluster.as_ref()),
            target,
            display: config.display.clone(),
            key_prefix: config.key_prefix.clone(),
            slots: config.slots.max(1),
            connection: RedisSlot::default(),
            notifications,
            subscriber: SubscriberSlot::default(),
            subscribed_once: AtomicBool::new(false),
            timeouts: AtomicU32::new(0),
            polling: AtomicBool::new(false),
            waiter_id: crate::token::random_hex(8),
            place: None,
            taken: Mutex::new(None),
            told_unchecked: AtomicBool::new(false),
            grants: notifications.then(grants::Grants::default),
        }
    }

    /// Queues this waiter at `place` (µs) instead of at the server's time: Redlock
    /// gives each of its servers the same place, so that their queues agree.
    pub fn queued_at(self, place: u64) -> RedisBackend {
        RedisBackend {
            place: Some(place),
            grants: None,
            ..self
        }
    }

    /// `host:port` of this server.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The server that answered last, as `host:port`: in a Cluster, the node of the
    /// name's slot.
    fn server(&self) -> String {
        self.router.at(&self.display)
    }

    /// What error lines need to know about this backend's connection.
    fn context(&self) -> errors::Context<'_> {
        errors::Context::new(&self.target, &self.display, &self.key_prefix)
    }

    /// The connection for one call on lock `name`, made if needed (in a Cluster, to
    /// the node of the name's slot).
    async fn conn(&self, name: &str) -> Result<InUse<'_, RedisConn>, BackendError> {
        self.connection.get(|_| self.connect(name)).await
    }

    /// Runs `script` on lock `name` (its slot `taken` only, where the script can do
    /// with one; every slot otherwise) with `args` and parses its reply. A failed call
    /// drops the connection (so does an abandoned one); a reply that does not parse is
    /// a refusal, never a made-up default.
    async fn eval<T: FromRedisValue>(
        &self,
        script: Script,
        name: &str,
        taken: Option<u32>,
        args: &[&str],
    ) -> Result<T, BackendError> {
        let keys = Keys::new(&self.key_prefix, name).for_script(script, self.slots, taken);
        // By its digest where the script says so: the server need not read and hash
        // the source again. The source itself when the server does not have the
        // script yet (then it keeps it) or will not run EVALSHA (an ACL of an earlier
        // release: asked no more).
        let call = |by_source: bool| {
            let mut cmd = redis::cmd(if by_source { "EVAL" } else { "EVALSHA" });
            let body = if by_source {
                script.source()
            } else {
                script.sha1()
            };
            cmd.arg(body).arg(keys.len()).arg(&keys).arg(args);
            cmd
        };
        let by_digest = script.by_digest() && !scripts::NO_EVALSHA.load(Ordering::Relaxed);
        let source = || call(true);
        let fallback = by_digest.then_some(&source as &dyn Fn() -> redis::Cmd);
        let value = self
            .query(name, &call(!by_digest), script, fallback)
            .await?;
        replies::parse(script, value).map_err(|bad| {
            BackendError::Refused(format!("Redis at {} gave {}", self.server(), bad.0))
        })
    }

    /// One run of the acquire script, for the lowest free slot or slot `wanted`; as a
    /// waiter, it also joins the queue (or refreshes this waiter's heartbeat) when the
    /// slots are busy.
    async fn try_acquire(
        &self,
        name: &str,
        req: &AcquireRequest,
        waiter: bool,
        wanted: Option<u32>,
    ) -> Result<AcquireReply, BackendError> {
        let waiter_id = if waiter { self.waiter_id.as_str() } else { "" };
        let wanted = wanted.map(|s| s.to_string()).unwrap_or_default();
        let place = self.place.map(|p| p.to_string()).unwrap_or_default();
        let grants = self.grants.as_ref().filter(|_| waiter);
        let args = [
            req.token.as_str(),
            &ms(req.ttl),
            &req.host,
            &req.pid.to_string(),
            waiter_id,
            &ms(WAITER_ALIVE),
            &wanted,
            if self.target.allow_eviction { "1" } else { "" },
            &place,
            if grants.is_some() { "1" } else { "" },
        ];
        let sent_at = grants.map(|g| (g, BootInstant::now()));
        let Checked { reply, unchecked } = self.eval(Script::Acquire, name, None, &args).await?;
        if let (Some((g, at)), AcquireReply::Busy(_)) = (sent_at, &reply) {
            g.asked(&req.token, at);
        }
        if let Some(why) = unchecked {
            if !self.told_unchecked.swap(true, Ordering::Relaxed) {
                crate::log::emit(
                    crate::log::Level::Info,
                    crate::log::Event::EvictionUnchecked,
                    &unchecked_line(
                        &self.server(),
                        self.target.info.redis_settings().username(),
                        &why,
                    ),
                    &[],
                );
            }
        }
        Ok(reply)
    }

    /// Tries once to take the lowest free slot of `name` (or slot `wanted`: Redlock's
    /// second round), answering as the script does: Redlock counts these answers.
    pub async fn acquire_slot(
        &self,
        name: &str,
        req: &AcquireRequest,
        wanted: Option<u32>,
    ) -> Result<AcquireReply, BackendError> {
        let queued = || self.notifications && !self.polling.load(Ordering::Relaxed);
        let mut reply = self.try_acquire(name, req, queued(), wanted).await?;
        if matches!(reply, AcquireReply::Busy(_))
            && self.listen(name, subscribe_within(req.ttl)).await
        {
            // Just subscribed, about to wait: ask once more, so that a release that
            // came before the subscription is not missed.
            reply = self.try_acquire(name, req, queued(), wanted).await?;
        }
        if matches!(reply, AcquireReply::Acquired { .. }) {
            // Wake-ups are of no use to a holder: close their connection.
            drop(self.subscriber.take());
        }
        Ok(reply)
    }

    /// Makes sure a waiter hears its wake-ups: subscribes to its channel on a
    /// connection of its own, within `within`, unless subscribed already or polling.
    /// True when it just subscribed: the caller must ask for the lock again before it
    /// sleeps, since a release may have come before the subscription. A subscription
    /// refused (or timed out [`TIMEOUTS_BEFORE_POLLING`] times) before any worked turns
    /// this waiter to polling (said once at `-v`); otherwise the next busy answer
    /// tries again.
    async fn listen(&self, name: &str, within: Duration) -> bool {
        if !self.notifications
            || self.polling.load(Ordering::Relaxed)
            || self.subscriber.current().is_some()
        {
            return false;
        }
        let channel = format!(
            "{}{}",
            Keys::new(&self.key_prefix, name).wake_prefix,
            self.waiter_id
        );
        let ctx = self.context();
        let target = self.subscriber_target();
        let subscribe = self
            .subscriber
            .get(|_| conn::subscribe(&target, &channel, &ctx));
        let why = match tokio::time::timeout(within, subscribe).await {
            Ok(Ok(subscribed)) => {
                subscribed.keep();
                self.subscribed_once.store(true, Ordering::Relaxed);
                return true;
            }
            Ok(Err(why)) => why,
            Err(_) => {
                let timeouts = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                if timeouts < TIMEOUTS_BEFORE_POLLING {
                    return false;
                }
                format!(
                    "SUBSCRIBE: no answer within {} ms, {timeouts} times",
                    within.as_millis()
                )
            }
        };
        if !self.subscribed_once.load(Ordering::Relaxed)
            && !self.polling.swap(true, Ordering::Relaxed)
        {
            self.start_polling(name, &why).await;
        }
        false
    }

    /// Says once that this waiter polls, and why, and leaves the queue of waiters so
    /// that releases wake those that can hear it.
    async fn start_polling(&self, name: &str, why: &str) {
        let msg = format!(
            "no release notifications from Redis at {} ({why}); waiting polls instead, \
             at the holder's lease expiry and at least every {}s, so the hand-off is slower",
            self.display,
            crate::backend::MAX_WAIT_SLICE.as_secs()
        );
        emit(Level::Info, Event::Waiting, &msg, &[]);
        let _ = self.stop_waiting(name).await;
    }

    /// Gives back what an acquisition of `token` took here without a majority on the
    /// quorum (Redlock): frees it like a release, except that a slot a woken waiter took
    /// goes back to that waiter (the head of the queue, its wake mark as it was) rather
    /// than waking the next one, while its priority lasts.
    pub async fn give_back(&self, name: &str, token: &str) -> Result<(), BackendError> {
        let wake_prefix = Keys::new(&self.key_prefix, name).wake_prefix;
        let args = [token, "0", &wake_prefix, "1", &ms(WAITER_ALIVE)];
        owned(self.eval(Script::Release, name, None, &args).await?)
    }

    /// Extends the lease of `token` in slot `taken` (every slot looked in if unknown).
    pub async fn renew_slot(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
        taken: Option<u32>,
    ) -> Result<(), BackendError> {
        owned(
            self.eval(Script::Renew, name, taken, &[token, &ms(ttl)])
                .await?,
        )
    }

    /// Every holder of `name`'s slots, with their tokens (Redlock compares them).
    pub async fn holders(&self, name: &str) -> Result<HoldersReply, BackendError> {
        self.eval(Script::Inspect, name, None, &[]).await
    }

    /// Deletes every slot of `name` and answers who held them, with their tokens;
    /// nothing is deleted when a holder was taken with another N (`theirs`).
    pub async fn force_holders(&self, name: &str) -> Result<HoldersReply, BackendError> {
        let wake_prefix = Keys::new(&self.key_prefix, name).wake_prefix;
        self.eval(Script::Force, name, None, &[&wake_prefix]).await
    }

    /// The refusal for holders taken with `theirs` slots, this backend's N being ours.
    pub fn conflict(&self, theirs: u32) -> BackendError {
        slots_conflict(theirs, self.slots)
    }

    /// The refusal of this server, which may evict the lock.
    pub fn evicting(&self, policy: &str, maxmemory: u64) -> BackendError {
        evicting(&self.server(), policy, maxmemory)
    }

    /// Raises this server's fencing counter for `name` to at least `fence`, and records
    /// `fence` on slot `slot` if `token` holds it (Redlock's write-back).
    pub async fn raise_fence(
        &self,
        name: &str,
        fence: u64,
        token: &str,
        slot: u32,
    ) -> Result<(), BackendError> {
        let Done(_) = self
            .eval(
                Script::FenceFloor,
                name,
                Some(slot),
                &[&fence.to_string(), token],
            )
            .await?;
        Ok(())
    }
}

/// The refusal of the server at `at`, whose `maxmemory` is set and whose `policy`
/// may evict the lock: one line with the two ways out.
fn evicting(at: &str, policy: &str, maxmemory: u64) -> BackendError {
    BackendError::Refused(format!(
        "Redis at {at} may evict the lock (maxmemory-policy {policy}, maxmemory {maxmemory} \
         bytes), letting a second holder in: set maxmemory-policy noeviction on it, or \
         accept the risk, which fencing tokens still bound, with --allow-eviction \
         (LOCKRUN_ALLOW_EVICTION=1)"
    ))
}

/// The `-v` line when the server at `at` would not let the acquire script read INFO
/// (`why`, the server's error) as `user` (`None`: the default user).
fn unchecked_line(at: &str, user: Option<&str>, why: &str) -> String {
    let user = user.unwrap_or("default");
    format!(
        "Redis at {at} did not let user {user:?} run INFO in lockrun's acquire script ({}), \
         so whether the server may evict the lock was not checked: grant it with ACL \
         SETUSER {user} +info (docs/backends.md, \"Redis keys\", gives the whole rule)",
        why.trim()
    )
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

#[cfg(test)]
mod tests;
