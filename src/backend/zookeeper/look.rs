//! Looking at one lock's directory from outside (`status`, a busy answer without
//! queueing, the last run's record) and breaking it (`release --force`), as methods of
//! [`ZkBackend`]. A plain lock is held by its hold node while that is on, else by the
//! first in line; a semaphore by each slot node and each hold that is on. Part of
//! [`super`].

use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use zookeeper_client::{Client, Error as ZkError, MultiWriteError};

use super::layout::{self, slot_name};
use super::place::Listing;
use super::record::{ok_from, record_from, OK, RECORD};
use super::ZkBackend;
use crate::backend::{BackendError, Holder, RunRecord};

/// A holder, with the nodes that make it one (what `release --force` deletes: a hold
/// node; a plain lock's queue node; a slot node and its owner's queue node).
type Found = (Holder, Vec<String>);

impl ZkBackend {
    /// Who holds the plain lock in `dir` (a hold that is on, else the first in line),
    /// with the path of its node.
    pub(super) async fn look_plain(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Option<(Holder, String)>, BackendError> {
        // A node may go between the listing and its read: look again, a few times.
        for _ in 0..3 {
            let listing = Listing::of(&self.children(client, dir).await?);
            if let Some(found) = self.plain_holder(client, dir, &listing).await? {
                return Ok(found);
            }
        }
        Err(self.kept_changing(dir))
    }

    /// The plain lock's holder in `listing`: `None` when its node went meanwhile.
    async fn plain_holder(
        &self,
        client: &Client,
        dir: &str,
        listing: &Listing,
    ) -> Result<Option<Option<(Holder, String)>>, BackendError> {
        if listing.holds.contains(&0) {
            let plain_hold = Listing {
                holds: vec![0],
                ..Listing::default()
            };
            let holds = self.judge_holds(client, dir, &plain_hold).await?;
            if let Some(hold) = holds.into_iter().find(|h| h.on) {
                return Ok(Some(Some((hold.holder, hold.path))));
            }
        }
        let Some(first) = listing.queue.first() else {
            return Ok(Some(None));
        };
        let holder = self.holder_of(client, dir, first).await?;
        Ok((holder != Holder::default()).then(|| Some((holder, format!("{dir}/{}", first.name)))))
    }

    /// Every holder of the lock in `dir`: the plain lock's, or each of a semaphore's.
    pub(super) async fn look(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Vec<Found>, BackendError> {
        for _ in 0..3 {
            let listing = Listing::of(&self.children(client, dir).await?);
            if listing.has_semaphore() {
                return self.slot_holders(client, dir, &listing).await;
            }
            if let Some(found) = self.plain_holder(client, dir, &listing).await? {
                return Ok(found.into_iter().map(|(h, path)| (h, vec![path])).collect());
            }
        }
        Err(self.kept_changing(dir))
    }

    /// A semaphore's holders in `listing`: each hold that is on, and each slot node
    /// (read: its value describes its holder) with its owner's queue node; and a plain
    /// lock's first in line, when a semaphore's over holds are still listed beside it.
    async fn slot_holders(
        &self,
        client: &Client,
        dir: &str,
        listing: &Listing,
    ) -> Result<Vec<Found>, BackendError> {
        let mut found: Vec<Found> = Vec::new();
        for hold in self.judge_holds(client, dir, listing).await? {
            if hold.on {
                found.push((hold.holder, vec![hold.path]));
            }
        }
        let plain_first = listing.queue.first().filter(|n| n.slots == 1);
        if let Some(first) = plain_first.filter(|_| !found.iter().any(|(h, _)| h.slot == 0)) {
            let holder = self.holder_of(client, dir, first).await?;
            if holder != Holder::default() {
                found.push((holder, vec![format!("{dir}/{}", first.name)]));
            }
        }
        let paths: Vec<(u32, String)> = listing
            .slot_nodes
            .iter()
            .map(|&s| (s, format!("{dir}/{}", slot_name(s))))
            .collect();
        let read = join_all(paths.iter().map(|(_, p)| client.get_data(p))).await;
        let mut slots = Vec::new();
        for (answer, (slot, path)) in read.into_iter().zip(paths) {
            match answer {
                Ok((value, stat)) => {
                    let holder = layout::holder_from(&value, stat.czxid, stat.mzxid, stat.mtime);
                    slots.push((Holder { slot, ..holder }, path, layout::token_in(&value)));
                }
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(self.error(&e, &path)),
            }
        }
        // An owner created after the listing: list again to find its queue node.
        let owns = |l: &Listing, token: &str| l.queue.iter().any(|n| n.token == token);
        let mut owners = listing.clone();
        if slots.iter().any(|(_, _, token)| !owns(&owners, token)) {
            owners = Listing::of(&self.children(client, dir).await?);
        }
        for (holder, path, token) in slots {
            let owner = owners.queue.iter().find(|n| n.token == token);
            let mut nodes = vec![path];
            nodes.extend(owner.map(|n| format!("{dir}/{}", n.name)));
            found.push((holder, nodes));
        }
        Ok(found)
    }

    /// `release --force`: deletes the nodes of every holder of the lock in `dir` (a
    /// slot node with its owner's queue node, in one multi-request: if that queue node
    /// went meanwhile, so did its slot, and a new owner's is left alone). The owners'
    /// next renewals fail.
    pub(super) async fn break_lock(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Vec<Holder>, BackendError> {
        let mut broken = Vec::new();
        for (holder, nodes) in self.look(client, dir).await? {
            let deleted = match nodes.as_slice() {
                [one] => client.delete(one, None).await,
                several => {
                    let mut multi = client.new_multi_writer();
                    for path in several {
                        multi
                            .add_delete(path, None)
                            .map_err(|e| self.error(&e, path))?;
                    }
                    match multi.commit().await {
                        Ok(_) => Ok(()),
                        Err(MultiWriteError::OperationFailed { source, .. })
                        | Err(MultiWriteError::RequestFailed { source }) => Err(source),
                    }
                }
            };
            match deleted {
                Ok(()) => broken.push(holder),
                // Gone meanwhile: that holder left by itself.
                Err(ZkError::NoNode) if nodes.len() > 1 => {}
                Err(ZkError::NoNode) => broken.push(holder),
                Err(e) => return Err(self.error(&e, &nodes[0])),
            }
        }
        Ok(broken)
    }

    /// The record of the last run of the lock in `dir`, with its last success, unless
    /// there is none or it is past its keep (by this host's clock, against the server's
    /// time of its write). Both nodes are read side by side: one round trip.
    pub(super) async fn read_record(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Option<RunRecord>, BackendError> {
        let (last, ok) = (format!("{dir}/{RECORD}"), format!("{dir}/{OK}"));
        let now = SystemTime::now().duration_since(UNIX_EPOCH);
        let now_ms = now.map_or(0, |d| d.as_millis() as u64);
        let (record, success) = tokio::join!(client.get_data(&last), client.get_data(&ok));
        let record = match record {
            Ok((value, stat)) => record_from(&value, stat.mtime, now_ms),
            Err(ZkError::NoNode) => None,
            Err(e) => return Err(self.error(&e, &last)),
        };
        let last_ok = match success {
            Ok((value, stat)) => ok_from(&value, stat.mtime, now_ms),
            Err(ZkError::NoNode) => None,
            Err(e) => return Err(self.error(&e, &ok)),
        };
        Ok(record.map(|r| RunRecord { last_ok, ..r }))
    }

    fn kept_changing(&self, dir: &str) -> BackendError {
        BackendError::Unavailable(format!(
            "the lock {dir} at ZooKeeper {} kept changing while it was read; try again",
            self.at()
        ))
    }
}
