//! Taking a slot once our lease is granted (the transactions of [`super::slots`], a few
//! tries while the name's keys change under us), the busy answer (with N > 1 we stay in
//! the queue), and breaking every slot (`release --force`), as methods of
//! [`EtcdBackend`]. Part of [`super`].

use futures_util::{StreamExt, TryStreamExt};

use super::slots::{self, Choice, Place, Read, SlotKeys};
use super::value::holder_value;
use super::wire::{Compare, KeyValue, RequestOp, Response, TxnRequest, TxnResponse};
use super::EtcdBackend;
use crate::backend::{slots_conflict, Acquire, AcquireRequest, BackendError, Holder};

/// How many transactions one acquire sends before giving up on keys that change under
/// every one of them (each failure is some other acquire, release or expiry applied in
/// between); the driver retries after its backoff.
const TRIES: usize = 16;

/// How many times `release --force` reads again the slots that changed while it broke
/// them.
const BREAK_ROUNDS: usize = 3;

/// How many slots `release --force` breaks at once.
const BREAKS_AT_ONCE: usize = 32;

impl EtcdBackend {
    /// Takes the lowest free slot on our lease `id` (granted), or says who holds them
    /// all, or refuses a holder taken with another N. `queued`: the revision our waiter
    /// key was created at, if we already wait in the queue (we read, then take); else
    /// we start with [`slots::first_try`], which queues us if it fails.
    pub(super) async fn take_slot(
        &self,
        keys: &SlotKeys,
        req: &AcquireRequest,
        id: i64,
        queued: Option<i64>,
    ) -> Result<Acquire, BackendError> {
        let n = self.slots;
        let (mut read, mut revision) = match queued {
            Some(_) => self.read(keys).await?,
            None => match self.first_try(keys, req, id).await? {
                Ok(taken) => return Ok(taken),
                Err(read) => read,
            },
        };
        let since = queued.or(keys.queued().then_some(revision));
        let waiter = keys.waiter_key(id).into_bytes();
        for _ in 0..TRIES {
            let place = since.map_or_else(Place::default, |since| {
                slots::place(&read.queue, &waiter, since)
            });
            let slot = match slots::choose(&read.held, n, place.ahead) {
                Choice::Take(slot) => slot,
                Choice::Conflict(theirs) => {
                    self.give_back(id).await;
                    return Err(slots_conflict(theirs, n));
                }
                Choice::Busy => {
                    let busy = Busy {
                        revision,
                        next_ahead: place.next_ahead,
                        queued: since.is_some(),
                    };
                    return self.busy(read.held, busy, id).await;
                }
            };
            let value = holder_value(req, slot, n);
            let txn = slots::take(keys, &read.held, revision, slot, &value, id);
            let reply = self.call(async |c| c.txn(txn.clone()).await).await?;
            revision = reply.header.as_ref().map_or(0, |h| h.revision);
            if reply.succeeded {
                return self.taken(slot, value, revision, id).await;
            }
            read = keys.read(range_read(reply));
        }
        self.give_back(id).await;
        Err(BackendError::Unavailable(format!(
            "the slot keys of {:?} at etcd {} changed under each of {TRIES} tries to take \
             one; try again",
            String::from_utf8_lossy(keys.start()),
            self.member()
        )))
    }

    /// Sends [`slots::first_try`]: slot 0 taken, or what it read and the revision. A
    /// failure also put our waiter key if waiters queue, in that revision: our place.
    async fn first_try(
        &self,
        keys: &SlotKeys,
        req: &AcquireRequest,
        id: i64,
    ) -> Result<Result<Acquire, (Read, i64)>, BackendError> {
        let value = holder_value(req, 0, self.slots);
        let txn = slots::first_try(keys, &value, id);
        let reply = self.call(async |c| c.txn(txn.clone()).await).await?;
        let revision = reply.header.as_ref().map_or(0, |h| h.revision);
        if reply.succeeded {
            return self.taken(0, value, revision, id).await.map(Ok);
        }
        if keys.queued() {
            self.set_queued(id, revision);
        }
        Ok(Err((keys.read(range_read(reply)), revision)))
    }

    /// `slot` is ours, put with `value` at `revision`: the fencing token. An answer
    /// without one cannot be handed to the command as a token: give the slot back and
    /// refuse.
    async fn taken(
        &self,
        slot: u32,
        value: String,
        revision: i64,
        id: i64,
    ) -> Result<Acquire, BackendError> {
        // The put's revision is the key's create_revision.
        if let Some(fencing_token) = u64::try_from(revision).ok().filter(|r| *r > 0) {
            if let Some(ours) = self.local().lease.as_mut().filter(|l| l.id == id) {
                // Our waiter key, if any, went in the same transaction.
                ours.slot = Some(slot);
                ours.value = value;
                ours.fence = fencing_token;
                ours.queued = None;
            }
            return Ok(Acquire::Acquired {
                fencing_token,
                slot,
            });
        }
        let _ = self.revoke(id).await;
        self.local().lease = None;
        Err(BackendError::Refused(format!(
            "etcd at {} took the lock without telling its revision (the fencing token)",
            self.member()
        )))
    }

    /// No slot for us at the read: remember where a watch starts and, unless we stay in
    /// the queue, give our lease `id` back (it would expire anyway); say whose lease
    /// ends first.
    async fn busy(&self, held: slots::Held, busy: Busy, id: i64) -> Result<Acquire, BackendError> {
        {
            let mut local = self.local();
            local.busy_revision = busy.revision;
            local.next_ahead = busy.next_ahead;
            if !busy.queued {
                local.lease = None;
            }
        }
        let give_back = async {
            if !busy.queued {
                let _ = self.revoke(id).await;
            }
        };
        let (_, holders) = tokio::join!(give_back, self.holders(held, true));
        let first = holders?.into_iter().min_by_key(|h| (h.ttl_left, h.slot));
        Ok(Acquire::Busy(first.unwrap_or_default()))
    }

    /// Breaks every slot of the name: deletes exactly the keys read (a slot that
    /// changed meanwhile is read again and broken as it is now), then revokes their
    /// leases so that their holders' next keep-alives fail too.
    pub(super) async fn break_all(&self, keys: &SlotKeys) -> Result<Vec<Holder>, BackendError> {
        let mut todo: Vec<(u32, KeyValue)> = self.read(keys).await?.0.held.into_iter().collect();
        let mut broken = Vec::new();
        for _ in 0..BREAK_ROUNDS {
            if todo.is_empty() {
                return Ok(broken);
            }
            let attempts = todo.into_iter().map(|(slot, kv)| async move {
                let holder = self.break_one(&kv).await?;
                Ok::<_, BackendError>((slot, holder))
            });
            let results: Vec<(u32, Option<Holder>)> = futures_util::stream::iter(attempts)
                .buffer_unordered(BREAKS_AT_ONCE)
                .try_collect()
                .await?;
            let mut changed = Vec::new();
            for (slot, holder) in results {
                match holder {
                    Some(h) => broken.push(Holder { slot, ..h }),
                    None => changed.push(slot),
                }
            }
            if changed.is_empty() {
                return Ok(broken);
            }
            let (now, _) = self.read(keys).await?;
            todo = now
                .held
                .into_iter()
                .filter(|(slot, _)| changed.contains(slot))
                .collect();
        }
        if todo.is_empty() {
            return Ok(broken);
        }
        Err(BackendError::Unavailable(format!(
            "the lock at etcd {} kept changing while it was being broken; try again",
            self.member()
        )))
    }

    /// Deletes `kv` if it is still the key that was read (same create revision) and
    /// revokes its lease; its holder, or `None` if it changed.
    async fn break_one(&self, kv: &KeyValue) -> Result<Option<Holder>, BackendError> {
        let holder = self.holder(kv).await?;
        let delete = TxnRequest {
            compare: vec![Compare::created_at(&kv.key, kv.create_revision)],
            success: vec![RequestOp::delete(&kv.key)],
            failure: vec![],
        };
        let deleted = self
            .call(async |c| c.txn(delete.clone()).await)
            .await?
            .succeeded;
        if !deleted {
            return Ok(None);
        }
        if kv.lease != 0 {
            let _ = self.revoke(kv.lease).await;
        }
        Ok(Some(holder))
    }
}

/// Where a busy read leaves us.
struct Busy {
    /// The revision of the read: a watch starts after it.
    revision: i64,
    /// The waiter just before us, if any.
    next_ahead: Option<Vec<u8>>,
    /// Whether we wait in the queue (our lease stays: our waiter key is on it).
    queued: bool,
}

/// The keys a failed transaction read (its one failure operation, a range).
fn range_read(reply: TxnResponse) -> Vec<KeyValue> {
    reply
        .responses
        .into_iter()
        .flat_map(|r| match r.response {
            Some(Response::Range(read)) => read.kvs,
            None => Vec::new(),
        })
        .collect()
}
