//! The etcd backend (`etcd://host:port[,host:port...]`, `etcds://` over TLS): the lock
//! is a key attached to the holder's lease, kept alive while the command runs.
//!
//! Lock `NAME` under prefix `P` is the key `P{NAME}` (no two (prefix, name) pairs share
//! a key: names hold no brace, see [`slots`]). Its value is JSON
//! `{"token", "host", "pid", "since_ms"}` for `status` (`since_ms` by the holder's clock:
//! etcd tells no time). The fencing token is the revision at which the key was created
//! (its `create_revision`): etcd's revision counter is cluster-wide and only grows, so
//! every later acquisition of `NAME` gets a larger one (while etcd keeps its data).
//!
//! **Semaphores** (`--slots N`): slot 0 is the key `P{NAME}` above, slot `i` ≥ 1 the key
//! `P{NAME}#i`, each holder's key on its own lease; the
//! value also records `"slot"` and `"slots"` (N). The fencing token is still the key's
//! create revision: cluster-wide, so it grows over every slot. How a slot is taken (the
//! lowest free one, a holder with another N refused, in the same transaction that puts
//! the key) is in [`slots`]; with N = 1 it is one transaction, as for the plain lock.
//! With N > 1 waiters queue, first come first served: an acquirer that finds the
//! semaphore in use puts a waiter key `P{NAME}%ID` on its lease, and takes a free slot
//! only when no earlier waiter is left without one.
//!
//! **Ownership** is "the key is attached to our lease". We choose the lease ID ourselves
//! (63 random bits) before asking for the lease, so even an abandoned request (the
//! driver's timeout) leaves nothing we could not revoke; an ID is unique while its lease
//! lives. Every step:
//! - acquire: grant the lease, then one transaction: if no key of the name exists, put
//!   slot 0 on the lease; else read them all (and with N > 1 queue), and take the
//!   lowest free slot with a second transaction (a few tries while they change), or
//!   answer busy (the lease is revoked again, unless it holds our waiter key: a waiter
//!   tries again on it, after a keep-alive, so the server's lease still ends after the
//!   TTL counted from before the call) or refuse a holder taken with another N;
//! - renew: a keep-alive of the lease (one request, one reply; a reply with TTL ≤ 0 means
//!   the lease is gone) side by side with a read-only transaction checking our slot's key
//!   is still on the lease (`release --force`, `etcdctl del`): either failing is a
//!   definite loss;
//! - release of a run: one transaction deletes our slot's key if it is still on our
//!   lease (never another holder's) and puts the run's record `P{NAME}:last`
//!   ([`record`]), or does nothing (NotOwner). One request, as the revoke it replaced;
//!   our lease, holding nothing now, ends with its TTL;
//! - release of an attempt that ran nothing: revoking the lease deletes the key
//!   atomically if, and only if, it is still attached to it, whatever slot an attempt
//!   whose answer was lost took (a lease already gone answers NotOwner);
//!   `--hold-at-least` instead moves our slot's key, if still on our lease, to a new
//!   lease of the time left (rounded up, so at least that long), writing the record in
//!   that transaction, and revokes ours;
//! - `--wait`: a watch for a deletion from the revision of the busy read, so a release
//!   (or expiry) between the read and the watch is not missed. A plain lock's waiters
//!   watch its key: a release wakes them all and the first transaction wins, no queue.
//!   A semaphore's waiter watches the waiter key just before its own (one waiter woken
//!   per change of the queue), the first one every slot key (any slot freed), and each
//!   keeps its lease alive meanwhile (a third of `--ttl`); a waiter that crashes leaves
//!   the queue when its lease ends, one that gives up revokes it.
//!
//! **TTLs** are whole seconds in etcd and the server's lease starts at the grant, after
//! lockrun sent the request and started counting: rounding the TTL up keeps the
//! server's lease at least as long as the one lockrun enforces. etcd only lengthens it:
//! TTLs under its minimum (about 2 s with default settings) are raised, and a new
//! leader extends every lease. So a crashed holder's lock can outlive `--ttl` a little;
//! it never expires earlier than lockrun assumes.
//!
//! **Every key expires**: a lease longer than a day (`value::MAX_LEASE`, lockrun's
//! longest `--ttl`) is refused before it is granted, and a lock key found on no lease
//! (lockrun never writes one: it was written by hand) is put on a new lease of a day by
//! the busy answer or `status` that finds it. Release deletes the key; a waiter's key
//! is on its lease too; besides, a name keeps only the record of its last run, on the
//! lease of 15 days that every record of the prefix written in the same week shares
//! ([`record`]: not one lease per run, and revoked by a later week's grant should
//! leader changes keep it alive); the fencing token is etcd's revision.
//!
//! The client talks to one member at a time, made lazily. After any error or abandoned
//! call it is dropped and the next call uses the next member; a call whose connection
//! could not even be made is tried on the next member at once. The gRPC client is
//! lockrun's own ([`rpc`] over `tonic`, with the messages of [`wire`] written by hand),
//! so building lockrun needs no `protoc`.

mod errors;
mod names;
mod period;
mod record;
mod recorded;
mod requests;
mod rpc;
mod slots;
mod take;
mod target;
mod transport;
mod value;
mod wire;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::backend::conn::{Connection, Slot};
use crate::backend::url::BackendConfig;
use crate::backend::{
    wait_slice, Acquire, AcquireRequest, Backend, BackendError, Holder, Period, Release, RunEnd,
    RunRecord,
};
use errors::never_sent;
use rpc::{Client, RpcError};
use slots::SlotKeys;
pub use target::{EtcdTarget, KIND};
use wire::{Compare, TxnRequest};

/// A lock backend on an etcd cluster.
pub struct EtcdBackend {
    target: EtcdTarget,
    key_prefix: String,
    /// `--slots`: how many may hold a name at once (1: a plain lock).
    slots: u32,
    /// The client of one member. The slot's generation, modulo the number of members,
    /// is the member in use: each forgotten connection moves on to the next one.
    slot: Slot<EtcdConn>,
    local: Mutex<Local>,
}

/// A client connected to one member.
struct EtcdConn(Client);

impl Connection for EtcdConn {}

/// What this lockrun remembers between calls; never locked across an await.
#[derive(Default)]
struct Local {
    /// Our lease from the moment we ask for it until it is revoked or given up.
    lease: Option<OurLease>,
    /// The revision of the last read that found the lock busy (a watch starts after it).
    busy_revision: i64,
    /// With `--slots` above 1, the key of the waiter just before us at that read: we
    /// wait for its deletion (none: we come first, and wait for a slot to free).
    next_ahead: Option<Vec<u8>>,
}

#[derive(Clone)]
struct OurLease {
    token: String,
    id: i64,
    /// `--ttl`: while we wait in the queue, the lease is kept alive this often (a third).
    ttl: Duration,
    /// The slot our key is, once taken (an attempt whose answer was lost never knows:
    /// revoking the lease frees whatever it took).
    slot: Option<u32>,
    /// The value we stored in the key (written again by `Release::KeepFor`).
    value: String,
    /// The fencing token of the slot taken (0 before): for the run's record.
    fence: u64,
    /// With `--slots` above 1, while we wait: the revision our waiter key was created
    /// at, our place in the queue.
    queued: Option<i64>,
    /// With `--once-per`, once judged: our period lease (`period.rs`).
    period: Option<OncePerLease>,
}

/// A run's period lease (`period.rs`), and the one of the success it would supersede.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OncePerLease {
    id: i64,
    superseded: Option<i64>,
}

impl EtcdBackend {
    /// A backend for `target`.
    pub fn new(target: EtcdTarget, config: &BackendConfig) -> EtcdBackend {
        EtcdBackend {
            target,
            key_prefix: config.key_prefix.clone(),
            slots: config.slots.max(1),
            slot: Slot::default(),
            local: Mutex::new(Local::default()),
        }
    }

    fn local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn keys(&self, name: &str) -> SlotKeys {
        SlotKeys::new(&self.key_prefix, name, self.slots)
    }

    /// Member number `member` (modulo their number) as `host:port`.
    fn member_name(&self, member: u64) -> &str {
        let members = &self.target.members;
        let n = members.len().max(1) as u64;
        members
            .get((member % n) as usize)
            .map_or("", String::as_str)
    }

    /// The member in use, as `host:port`.
    fn member(&self) -> &str {
        self.member_name(self.slot.generation())
    }

    /// Connects to member `member` (with credentials, this authenticates).
    async fn connect(&self, member: u64) -> Result<EtcdConn, (RpcError, u64, bool)> {
        Client::connect(&self.target, self.member_name(member))
            .await
            .map(EtcdConn)
            .map_err(|e| (e, member, false))
    }

    /// Runs `op` on the client. Any failure drops the client; so does abandoning the
    /// call (the caller's timeout), since the connection may be hung. A call that never
    /// reached a member is tried once on each of the others.
    async fn call<T>(
        &self,
        op: impl AsyncFn(&Client) -> Result<T, RpcError>,
    ) -> Result<T, BackendError> {
        let mut tries = self.target.members.len().max(1);
        loop {
            let attempt = async {
                let c = self.slot.get(|member| self.connect(member)).await?;
                let member = c.generation();
                let reply = op(&c.0).await;
                let answered = c.0.answered();
                c.settle(reply).map_err(|e| (e, member, answered))
            };
            match attempt.await {
                Ok(v) => return Ok(v),
                Err((e, member, answered)) => {
                    tries -= 1;
                    if tries == 0 || !never_sent(&e) {
                        return Err(self.describe(&e, member, !answered).await);
                    }
                }
            }
        }
    }
}

impl Backend for EtcdBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let keys = self.keys(name);
        // A waiter in the queue tries again on its lease, renewed first: the server's
        // lease then ends after the TTL counted from before this call.
        if let Some((id, since)) = self.waiting(&req.token) {
            if self.keep_alive(id).await? {
                return self.take_slot(&keys, req, id, Some(since)).await;
            }
            // Our lease ended while we waited (a stall longer than the TTL): queue again.
            self.local().lease = None;
        }
        self.drop_stale_lease().await?;
        let id = value::new_lease_id();
        // Recorded before asking: an abandoned acquire is cleaned up by `release`.
        self.local().lease = Some(OurLease {
            token: req.token.clone(),
            id,
            ttl: req.ttl,
            slot: None,
            value: String::new(),
            fence: 0,
            queued: None,
            period: None,
        });
        self.grant(id, req.ttl).await?;
        self.take_slot(&keys, req, id, None).await
    }

    async fn renew(&self, name: &str, token: &str, _ttl: Duration) -> Result<(), BackendError> {
        // A keep-alive restores the TTL granted at acquire (the same `--ttl`).
        let Some((ours, slot)) = self.our_slot(token) else {
            return Err(BackendError::NotOwner);
        };
        let key = self.keys(name).key(slot);
        let id = ours.id;
        let alive = self.keep_alive(id);
        let check = TxnRequest {
            compare: vec![Compare::on_lease(&key, id)],
            ..TxnRequest::default()
        };
        let on_lease = self.call(async |c| c.txn(check.clone()).await.map(|r| r.succeeded));
        // A definite loss from either answer wins over an error from the other.
        match tokio::join!(alive, on_lease) {
            (Ok(false), _) | (_, Ok(false)) => Err(BackendError::NotOwner),
            (Ok(true), Ok(true)) => Ok(()),
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError> {
        let Some(ours) = self.our_lease(token) else {
            return Err(BackendError::NotOwner);
        };
        self.local().lease = None;
        let keys = self.keys(name);
        // A run that held a slot leaves its record (see `record.rs`).
        let record = ours
            .slot
            .zip(end)
            .map(|(slot, end)| self.record(&keys, &ours, slot, end));
        let succeeded = end.is_some_and(|e| e.exit_status == 0);
        let released = self.release_slot(&keys, &ours, how, record).await;
        self.after_period(ours.period, succeeded && released.is_ok())
            .await;
        released
    }

    async fn once_per(
        &self,
        name: &str,
        token: &str,
        period: Duration,
    ) -> Result<Period, BackendError> {
        self.judge_once_per(name, token, period).await
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let (read, _) = self.read(&self.keys(name)).await?;
        self.holders(read.held, true).await
    }

    async fn names(&self) -> Result<Vec<String>, BackendError> {
        self.names_under_prefix().await
    }

    async fn last_run(&self, name: &str) -> Result<Option<RunRecord>, BackendError> {
        self.read_record(&self.keys(name)).await
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        self.break_all(&self.keys(name)).await
    }

    async fn wait_for_release(
        &self,
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        // The lease expires in under ttl_left + 1s (etcd rounds down); the expiry is a
        // deletion too, so the watch sees it.
        let slice = wait_slice(busy.ttl_left + Duration::from_secs(1), max);
        let deadline = tokio::time::Instant::now() + slice;
        let watched = self.wait_turn(&self.keys(name), deadline).await;
        if watched.is_err() {
            // Not a busy loop against a failing server: sit out the slice.
            tokio::time::sleep_until(deadline).await;
        }
        watched
    }

    async fn stop_waiting(&self, _name: &str) -> Result<(), BackendError> {
        // Leave the queue: revoking our lease deletes our waiter key. A plain lock's
        // waiter is only a watch, gone with the call that made it.
        let waiting = self
            .local()
            .lease
            .as_ref()
            .filter(|l| l.slot.is_none() && l.queued.is_some())
            .map(|l| l.id);
        if let Some(id) = waiting {
            self.give_back(id).await;
        }
        Ok(())
    }
}
