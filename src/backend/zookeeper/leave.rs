//! Leaving the queue of one lock, as methods of [`ZkBackend`]: deleting our node
//! (with our slot node, for a semaphore's that claimed one, in the same multi-request:
//! a slot node never outlives its owner's queue node) and the `--hold-at-least`
//! hand-over to a hold node; a run's release writes its record in the same
//! multi-request (`record.rs`). Part of [`super`].

use std::time::Duration;

use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiWriteError};

use super::layout::{self, hold_name, slot_name};
use super::record::{ok_value, record_value, Recording};
use super::{session_over, Claim, OurNode, ZkBackend};
use crate::backend::{BackendError, Holder, RunEnd};

/// What a release that keeps the lock (`--hold-at-least`) leaves in the hold node: the
/// claim's time and zxid by the server, its slot (none for a plain lock), and whether
/// the claim found a hold node left over (to be overwritten).
struct Kept {
    since_ms: i64,
    zxid: i64,
    slot: Option<u32>,
    left_over: bool,
}

impl ZkBackend {
    /// The record of the run that held the lock with our `node` and ended as `end`:
    /// none for a node that holds nothing (a semaphore's without its slot).
    pub(super) async fn recording(&self, node: &OurNode, end: RunEnd) -> Option<Recording> {
        let (slot, fence, since) = match node.claim {
            Claim::Held {
                slot,
                zxid,
                since_ms,
                ..
            } => (slot, zxid, since_ms),
            Claim::Unclaimed if self.slots == 1 => (0, node.czxid, node.taken_at().await),
            Claim::Unclaimed | Claim::Sent => return None,
        };
        let holder = Holder {
            slot,
            fencing_token: u64::try_from(fence).unwrap_or(0),
            since_ms: u64::try_from(since).unwrap_or(0),
            ..layout::holder_from(&node.value, 0, 0, 0)
        };
        let value = record_value(&holder, end);
        let ok = (end.exit_status == 0).then(|| ok_value(&holder));
        Some(Recording::new(&node.dir, value, ok, self.acls()))
    }

    /// Deletes our `node`: its path if known, else every queue node carrying its token
    /// (a creation whose answer was lost); with the slot node of its claim, and
    /// `record`, the run's, written in the same multi-request. NotOwner if none was
    /// there.
    pub(super) async fn delete_ours(
        &self,
        client: &Client,
        node: &OurNode,
        mut record: Option<Recording>,
    ) -> Result<(), BackendError> {
        let dir = &node.dir;
        let nodes: Vec<(String, Claim)> = match &node.path {
            Some(p) => vec![(p.clone(), node.claim)],
            // A semaphore's node seen only in a listing may have claimed a slot.
            None => layout::queue(&self.children(client, dir).await?)
                .into_iter()
                .filter(|n| n.token == node.token)
                .map(|n| {
                    let claim = match n.slots {
                        1 => Claim::Unclaimed,
                        _ => Claim::Sent,
                    };
                    (format!("{dir}/{}", n.name), claim)
                })
                .collect(),
        };
        let mut deleted = false;
        for (path, claim) in nodes {
            // The token in the name makes the node ours: no other lockrun has it.
            let gone = match (claim, record.as_mut()) {
                (Claim::Unclaimed, None) => client.delete(&path, None).await.map(|()| true),
                (Claim::Unclaimed, Some(record)) => {
                    match delete_all(client, &[(&path, None)], Some(record)).await {
                        Ok(()) => Ok(true),
                        Err((_, e)) => Err(e),
                    }
                }
                (Claim::Sent, _) => self.delete_claimed(client, dir, &path).await,
                (
                    Claim::Held {
                        slot, hold_version, ..
                    },
                    record,
                ) => {
                    let held = (slot, hold_version);
                    self.delete_held(client, dir, &path, held, record).await
                }
            };
            match gone {
                Ok(true) => deleted = true,
                Ok(false) | Err(ZkError::NoNode) => {}
                Err(e) if session_over(&e) => {}
                Err(e) => return Err(self.error(&e, &path)),
            }
        }
        if deleted {
            Ok(())
        } else {
            Err(BackendError::NotOwner)
        }
    }

    /// Deletes our queue node at `path`, which holds `slot`, with the slot node and the
    /// slot's over hold node the claim found (of `hold_version`: only the holder of
    /// the slot writes it, so it is the same one, unless `release --force` removed it);
    /// and writes `record`.
    async fn delete_held(
        &self,
        client: &Client,
        dir: &str,
        path: &str,
        (slot, hold_version): (u32, Option<i32>),
        mut record: Option<&mut Recording>,
    ) -> Result<bool, ZkError> {
        let slot_path = format!("{dir}/{}", slot_name(slot));
        let hold_path = format!("{dir}/{}", hold_name(slot));
        for hold in [hold_version, None] {
            let mut ops = vec![(path, None), (slot_path.as_str(), None)];
            if let Some(v) = hold {
                ops.push((hold_path.as_str(), Some(v)));
            }
            match delete_all(client, &ops, record.as_deref_mut()).await {
                Ok(()) => return Ok(true),
                Err((2, _)) => {} // the hold was removed meanwhile: without it
                Err((0, ZkError::NoNode)) => return Ok(false),
                // The slot node alone is gone (not lockrun's doing): the queue node.
                Err((1, ZkError::NoNode)) => return client.delete(path, None).await.map(|()| true),
                Err((_, e)) => return Err(e),
            }
        }
        Ok(false)
    }

    /// Deletes our queue node at `path` whose claim's answer was lost: its value says
    /// whether the claim applied, and which slot; the node's version makes sure no
    /// claim applies between that read and the deletion.
    async fn delete_claimed(
        &self,
        client: &Client,
        dir: &str,
        path: &str,
    ) -> Result<bool, ZkError> {
        for _ in 0..3 {
            let (value, stat) = match client.get_data(path).await {
                Ok(found) => found,
                Err(ZkError::NoNode) => return Ok(false),
                Err(e) => return Err(e),
            };
            let slot_path = layout::slot_in(&value).map(|s| format!("{dir}/{}", slot_name(s)));
            let mut ops = vec![(path, Some(stat.version))];
            ops.extend(slot_path.as_deref().map(|p| (p, None)));
            match delete_all(client, &ops, None).await {
                Ok(()) => return Ok(true),
                Err((0, ZkError::BadVersion)) => {} // a claim applied meanwhile: again
                Err((0, ZkError::NoNode)) => return Ok(false),
                Err((1, ZkError::NoNode)) => {
                    return client.delete(path, Some(stat.version)).await.map(|()| true)
                }
                Err((_, e)) => return Err(e),
            }
        }
        Err(ZkError::BadVersion)
    }

    /// `Release::KeepFor`: in one atomic multi-request, deletes our node (failing if it
    /// is gone: then it was not ours any more), a semaphore's slot node with it, and
    /// leaves the slot's hold node that keeps it (the lock, for a plain lock) `keep`
    /// longer by the server's clock.
    pub(super) async fn keep_for(
        &self,
        client: &Client,
        node: &OurNode,
        keep: Duration,
        mut record: Option<Recording>,
    ) -> Result<(), BackendError> {
        let path = node.path.clone().unwrap_or_default();
        let Some(Kept {
            since_ms,
            zxid,
            slot,
            left_over,
        }) = self.kept(client, node, &path).await?
        else {
            // A semaphore's node that holds no slot holds nothing to keep.
            return self.delete_ours(client, node, record).await;
        };
        let hold_path = format!("{}/{}", node.dir, hold_name(slot.unwrap_or(0)));
        let slot_path = slot.map(|s| format!("{}/{}", node.dir, slot_name(s)));
        let holder = layout::holder_from(&node.value, node.czxid, zxid, since_ms);
        let value = layout::hold_value(&holder, keep);
        let options = CreateMode::Persistent.with_acls(self.acls());
        let hold_at = 1 + usize::from(slot_path.is_some());
        // A hold left over (one is deleted only by the slot's next holder): overwrite
        // it; first, when our claim found one. The run's record goes last: each way of
        // leaving the hold, and of writing the record, may take a try.
        let mut overwrite = left_over;
        for _ in 0..6 {
            let mut multi = client.new_multi_writer();
            let built = multi
                .add_delete(&path, None)
                .and_then(|()| match &slot_path {
                    Some(p) => multi.add_delete(p, None),
                    None => Ok(()),
                })
                .and_then(|()| match overwrite {
                    false => multi.add_create(&hold_path, &value, &options),
                    true => multi.add_set_data(&hold_path, &value, None),
                })
                .and_then(|()| record.as_ref().map_or(Ok(()), |r| r.add(&mut multi)));
            built.map_err(|e| self.error(&e, &hold_path))?;
            match multi.commit().await {
                Ok(_) => return Ok(()),
                Err(e) if record.as_mut().is_some_and(|r| r.retry(&e, hold_at + 1)) => {}
                Err(e) => {
                    if let Some(e) = self.leave_failed(e, hold_at, &path, &hold_path) {
                        return Err(e);
                    }
                    overwrite = !overwrite;
                }
            }
        }
        Err(BackendError::Unavailable(format!(
            "could not leave the hold node {hold_path} at ZooKeeper {}; try again",
            self.at()
        )))
    }

    /// The answer to a failed multi-request of [`Self::keep_for`] that deletes our
    /// node (`path`) and leaves `hold_path` (operation `hold_at`): not ours when the
    /// deletes fail, `None` (try the other way) when only the hold node was in the way.
    fn leave_failed(
        &self,
        e: MultiWriteError,
        hold_at: usize,
        path: &str,
        hold_path: &str,
    ) -> Option<BackendError> {
        match e {
            MultiWriteError::OperationFailed { index, source } if index < hold_at => {
                Some(match source {
                    ZkError::NoNode => BackendError::NotOwner,
                    e => self.error(&e, path),
                })
            }
            MultiWriteError::OperationFailed {
                source: ZkError::NodeExists | ZkError::NoNode,
                ..
            } => None,
            MultiWriteError::OperationFailed { source, .. }
            | MultiWriteError::RequestFailed { source } => Some(match source {
                e if session_over(&e) => BackendError::NotOwner,
                e => self.error(&e, hold_path),
            }),
        }
    }

    /// What [`Self::keep_for`] keeps of our claim `node` (at `path`); `None` for a
    /// semaphore's node that holds no slot.
    async fn kept(
        &self,
        client: &Client,
        node: &OurNode,
        path: &str,
    ) -> Result<Option<Kept>, BackendError> {
        Ok(Some(match node.claim {
            Claim::Held {
                slot,
                zxid,
                since_ms,
                hold_version,
            } => Kept {
                since_ms,
                zxid,
                slot: Some(slot),
                left_over: hold_version.is_some(),
            },
            _ if self.slots > 1 => return Ok(None),
            // When the lock was taken: the node's stamp (see `taken`), by the server's
            // clock.
            _ => match client.check_stat(path).await {
                Ok(Some(stat)) => Kept {
                    since_ms: stat.mtime,
                    zxid: node.czxid,
                    slot: None,
                    left_over: false,
                },
                Ok(None) => return Err(BackendError::NotOwner),
                Err(e) if session_over(&e) => return Err(BackendError::NotOwner),
                Err(e) => return Err(self.error(&e, path)),
            },
        }))
    }
}

/// Deletes every `(path, version)` of `ops` in one multi-request (all or none), which
/// writes `record` too (sent again while only the record's operation fails: see
/// [`Recording::retry`]); the index and error of the operation that failed.
async fn delete_all(
    client: &Client,
    ops: &[(&str, Option<i32>)],
    mut record: Option<&mut Recording>,
) -> Result<(), (usize, ZkError)> {
    loop {
        let mut multi = client.new_multi_writer();
        for (path, version) in ops {
            multi.add_delete(path, *version).map_err(|e| (0, e))?;
        }
        if let Some(r) = record.as_deref() {
            r.add(&mut multi).map_err(|e| (ops.len(), e))?;
        }
        match multi.commit().await {
            Ok(_) => return Ok(()),
            Err(e)
                if record
                    .as_deref_mut()
                    .is_some_and(|r| r.retry(&e, ops.len())) => {}
            Err(MultiWriteError::OperationFailed { index, source }) => return Err((index, source)),
            Err(MultiWriteError::RequestFailed { source }) => return Err((usize::MAX, source)),
        }
    }
}
