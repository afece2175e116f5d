//! A semaphore's claim of a slot (`--slots N`, N > 1), as methods of [`ZkBackend`]:
//! one multi-request that creates the slot's ephemeral node `slot-<i>` (only one
//! create of a name can succeed: never two holders on one slot), writes our queue
//! node's value with the slot (the write that wakes the waiter watching our node, and
//! whose zxid is the fencing token), and guards against a hold on the slot:
//! - the slot had no hold node when listed: the multi creates and deletes
//!   `hold-<i>`, which fails if one exists now. (Between our listing and our claim,
//!   another claimer may have taken the slot and left it with a hold that is on.)
//! - the slot had an over hold node: the multi checks its version, and, once the slot
//!   is ours (then nobody else writes that node), a read checks its creation zxid. A
//!   version alone could match a hold deleted and made again meanwhile.
//!
//! Part of [`super`].

use zookeeper_client::{
    Client, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, Stat,
};

use super::layout::{self, slot_name};
use super::place::Listing;
use super::queue::Hold;
use super::{Claim, ZkBackend};
use crate::backend::{Acquire, Backend, BackendError};

/// How a claim ended.
pub(super) enum Claimed {
    /// The slot is ours.
    Won(Acquire),
    /// Another claim took the slot first.
    Lost,
    /// The slot's hold node changed since it was judged: list again.
    HoldChanged,
    /// Our queue node is gone.
    Gone,
}

impl ZkBackend {
    /// Claims `slot` of the lock in `dir` for our queue node; `hold` is the slot's
    /// hold node, judged over.
    pub(super) async fn claim(
        &self,
        client: &Client,
        dir: &str,
        slot: u32,
        hold: Option<&Hold>,
    ) -> Result<Claimed, BackendError> {
        let node = self.local().node.clone().filter(|n| n.path.is_some());
        let Some(node) = node else {
            return Ok(Claimed::Gone);
        };
        let path = node.path.clone().unwrap_or_default();
        let value = layout::with_slot(&node.value, slot);
        let slot_path = format!("{dir}/{}", slot_name(slot));
        let ephemeral = CreateMode::Ephemeral.with_acls(self.acls());
        let hold_path = format!("{dir}/{}", layout::hold_name(slot));
        let persistent = CreateMode::Persistent.with_acls(self.acls());
        let mut multi = client.new_multi_writer();
        let guarded = match hold {
            Some(h) => multi.add_check_version(&h.path, h.version),
            None => multi
                .add_create(&hold_path, b"", &persistent)
                .and_then(|()| multi.add_delete(&hold_path, None)),
        };
        guarded
            .and_then(|()| multi.add_create(&slot_path, &value, &ephemeral))
            .and_then(|()| multi.add_set_data(&path, &value, None))
            .map_err(|e| self.error(&e, &slot_path))?;
        // Recorded before sending: a claim whose answer is lost is undone by reading
        // the node's value (see `leave.rs`).
        self.set_claim(&node.token, Claim::Sent, None);
        let first = match hold {
            Some(_) => 1,
            None => 2,
        };
        match multi.commit().await {
            Ok(results) => {
                let stat = self.claim_stat(&results, &slot_path)?;
                let held = Claim::Held {
                    slot,
                    zxid: stat.mzxid,
                    since_ms: stat.mtime,
                    hold_version: hold.map(|h| h.version),
                };
                self.set_claim(&node.token, held, Some(value));
                if let Some(h) = hold {
                    self.same_hold(client, h).await?;
                }
                self.local().waiting_for = None;
                Ok(Claimed::Won(self.fencing(stat.mzxid, slot)?))
            }
            Err(MultiWriteError::OperationFailed { index, source }) => {
                // Nothing of it applied.
                self.set_claim(&node.token, Claim::Unclaimed, None);
                self.not_claimed(index.checked_sub(first), source, &slot_path)
            }
            Err(MultiWriteError::RequestFailed { source }) => Err(self.error(&source, &slot_path)),
        }
    }

    /// The claim's stat (its zxid is the fencing token): the answer to its last
    /// operation, which sets our queue node's value.
    fn claim_stat<'r>(
        &self,
        results: &'r [MultiWriteResult],
        slot_path: &str,
    ) -> Result<&'r Stat, BackendError> {
        match results.last() {
            Some(MultiWriteResult::SetData { stat }) => Ok(stat),
            _ => Err(BackendError::Unavailable(format!(
                "ZooKeeper at {} answered lockrun's claim of {slot_path} without the \
                 claim's zxid (the fencing token); try again",
                self.at()
            ))),
        }
    }

    /// A claim that failed at operation `index` (counted from the slot node's create;
    /// `None`: the check of the hold node) with `source`.
    fn not_claimed(
        &self,
        index: Option<usize>,
        source: ZkError,
        slot_path: &str,
    ) -> Result<Claimed, BackendError> {
        match (index, source) {
            (None, _) => Ok(Claimed::HoldChanged),
            (Some(0), ZkError::NodeExists) => Ok(Claimed::Lost),
            (Some(_), ZkError::NoNode) => Ok(Claimed::Gone),
            (Some(_), e) => Err(self.error(&e, slot_path)),
        }
    }

    /// After a claim checked the version of the over hold `judged`: whether the hold
    /// node is still that one (or gone: `release --force`). If it is another one with
    /// the same version, it may be on: our node and slot are given back and the
    /// driver queues again.
    async fn same_hold(&self, client: &Client, judged: &Hold) -> Result<(), BackendError> {
        let answer = client.check_stat(&judged.path).await;
        if matches!(&answer, Ok(Some(stat)) if stat.czxid == judged.czxid) {
            return Ok(());
        }
        // Not the hold judged: our release must leave it alone.
        if let Some(node) = self.local().node.as_mut() {
            if let Claim::Held { hold_version, .. } = &mut node.claim {
                *hold_version = None;
            }
        }
        let error = match answer {
            Ok(None) => return Ok(()),
            Ok(Some(_)) => BackendError::Unavailable(format!(
                "the hold node {} at ZooKeeper {} was made again while lockrun claimed its \
                 slot; queueing again",
                judged.path,
                self.at()
            )),
            Err(e) => self.error(&e, &judged.path),
        };
        let _ = self.stop_waiting("").await;
        Err(error)
    }

    /// Records our node's claim (and its new value), if the node is still `token`'s.
    fn set_claim(&self, token: &str, claim: Claim, value: Option<Vec<u8>>) {
        let mut local = self.local();
        if let Some(node) = local.node.as_mut().filter(|n| n.token == token) {
            node.claim = claim;
            if let Some(value) = value {
                node.value = value;
            }
        }
    }

    /// `listing` (read just before our node's creation, with nothing come or gone
    /// in between) with our node added at the end of the queue: what a listing read
    /// now would say, without reading it.
    pub(super) fn with_ours(&self, mut listing: Listing) -> Option<Listing> {
        let path = self.local().node.as_ref()?.path.clone()?;
        let name = path.rsplit('/').next()?.to_owned();
        let ours = layout::queue(&[name]).pop()?;
        listing.queue.push(ours);
        Some(listing)
    }
}
