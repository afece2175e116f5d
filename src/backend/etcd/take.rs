//! Taking a slot once our lease is granted (the transactions of [`super::slots`], a few
//! tries while the name's keys change under us), the busy answer, and breaking every
//! slot (`release --force`), as methods of [`EtcdBackend`]. Part of [`super`].

use futures_util::{StreamExt, TryStreamExt};

use super::slots::{self, Choice, SlotKeys};
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
    /// Takes the lowest free slot of `name` on our lease `id` (granted), or says who
    /// holds them all, or refuses a holder taken with another N.
    pub(super) async fn take_slot(
        &self,
        name: &str,
        req: &AcquireRequest,
        id: i64,
    ) -> Result<Acquire, BackendError> {
        let keys = self.keys(name);
        let n = self.slots;
        let mut slot = 0;
        let mut value = holder_value(req, slot, n);
        let mut txn = slots::first_try(&keys, &value, id);
        for _ in 0..TRIES {
            let reply = self.call(async |c| c.txn(txn.clone()).await).await?;
            let revision = reply.header.as_ref().map_or(0, |h| h.revision);
            if reply.succeeded {
                return self.taken(slot, value, revision, id).await;
            }
            let held = keys.held(range_read(reply));
            match slots::choose(&held, n) {
                Choice::Take(free) => {
                    slot = free;
                    value = holder_value(req, slot, n);
                    txn = slots::take(&keys, &held, revision, slot, &value, id);
                }
                Choice::Conflict(theirs) => {
                    self.give_back(id).await;
                    return Err(slots_conflict(theirs, n));
                }
                Choice::Full => return self.busy(held, revision, id).await,
            }
        }
        self.give_back(id).await;
        Err(BackendError::Unavailable(format!(
            "the slots of lock {name:?} at etcd {} changed under each of {TRIES} tries to \
             take one; try again",
            self.member()
        )))
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
                ours.slot = Some(slot);
                ours.value = value;
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

    /// Every slot was held at `revision`: remember where a watch starts, give our
    /// lease `id` back (it would expire anyway) and say whose lease ends first.
    async fn busy(
        &self,
        held: slots::Held,
        revision: i64,
        id: i64,
    ) -> Result<Acquire, BackendError> {
        {
            let mut local = self.local();
            local.busy_revision = revision;
            local.lease = None;
        }
        let (_, holders) = tokio::join!(self.revoke(id), self.holders(held, true));
        let first = holders?.into_iter().min_by_key(|h| (h.ttl_left, h.slot));
        Ok(Acquire::Busy(first.unwrap_or_default()))
    }

    /// Breaks every slot of the name: deletes exactly the keys read (a slot that
    /// changed meanwhile is read again and broken as it is now), then revokes their
    /// leases so that their holders' next keep-alives fail too.
    pub(super) async fn break_all(&self, keys: &SlotKeys) -> Result<Vec<Holder>, BackendError> {
        let mut todo: Vec<(u32, KeyValue)> = self.read(keys).await?.0.into_iter().collect();
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
