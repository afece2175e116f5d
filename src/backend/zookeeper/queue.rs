//! The ZooKeeper backend's steps on the queue of one lock: joining it, finding our
//! place ([`place::step`] decides), answering busy with what to wait for, taking a
//! plain lock, and reading the holder and the hold nodes, as methods of
//! [`ZkBackend`]. A semaphore's claim is in `slots.rs`; leaving the queue in
//! `leave.rs`; `status` and `release --force` in `look.rs`. Part of [`super`].

use std::time::Duration;

use futures_util::future::join_all;
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use super::layout::{self, hold_name, QueueNode};
use super::place::{self, Judged, Listing, Step};
use super::slots::Claimed;
use super::{OurNode, WaitFor, ZkBackend};
use crate::backend::{slots_conflict, Acquire, AcquireRequest, Backend, BackendError, Holder};

/// A hold node as read: its path, slot, version, holder and whether it still keeps
/// its slot (the lock, for a plain lock's).
pub(super) struct Hold {
    pub(super) path: String,
    pub(super) slot: u32,
    pub(super) version: i32,
    /// Its creation zxid: which incarnation of the name it is.
    pub(super) czxid: i64,
    pub(super) holder: Holder,
    pub(super) on: bool,
}

impl Hold {
    /// What [`place::step`] needs of it.
    fn judged(&self) -> Judged {
        Judged {
            slot: self.slot,
            slots: self.holder.slots,
            on: self.on,
        }
    }
}

impl ZkBackend {
    /// Deletes a node of ours left by an earlier token (an attempt the driver gave up:
    /// its node would sit ahead of the new one, and we would wait for ourselves).
    pub(super) async fn drop_stale(
        &self,
        client: &Client,
        token: &str,
    ) -> Result<(), BackendError> {
        let stale = self
            .local()
            .node
            .clone()
            .filter(|n| n.token != token || n.path.is_none());
        if let Some(old) = stale {
            match self.delete_ours(client, &old, None).await {
                Ok(()) | Err(BackendError::NotOwner) => {}
                Err(e) => return Err(e),
            }
            let mut local = self.local();
            if local.node.as_ref().is_some_and(|n| n.token == old.token) {
                local.node = None;
            }
        }
        Ok(())
    }

    /// Who holds the lock in `dir` now, read without queueing: `Err(holder)` when it is
    /// held (every slot, for a semaphore). Otherwise, when the listing may be used for
    /// our node too, the directory's child version at the read (0 for no directory
    /// yet) and the listing: a node created next with that very sequence number was
    /// created with nothing come or gone since, because ZooKeeper numbers a sequential
    /// node with its parent's child version, which every creation and deletion of a
    /// child moves on. A plain lock's listing is used only when it is empty.
    pub(super) async fn busy_now(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Result<Option<(i64, Listing)>, Holder>, BackendError> {
        let (children, cversion) = match client.get_children(dir).await {
            Ok((children, stat)) => (children, stat.cversion),
            Err(ZkError::NoNode) => return Ok(Ok(Some((0, Listing::default())))),
            Err(e) => return Err(self.error(&e, dir)),
        };
        let listing = Listing::of(&children);
        // A holder (or an earlier waiter) with another N: refused without queueing.
        if let Some(other) = listing.queue.iter().find(|n| n.slots != self.slots) {
            return Err(slots_conflict(other.slots, self.slots));
        }
        if self.slots > 1 {
            return Ok(match listing.queue.first() {
                Some(first) if listing.queue.len() >= self.slots as usize => {
                    Err(self.holder_of(client, dir, first).await?)
                }
                _ => Ok(Some((i64::from(cversion), listing))),
            });
        }
        if listing.queue.is_empty() && listing.holds.is_empty() {
            return Ok(Ok(Some((i64::from(cversion), listing))));
        }
        Ok(match self.look_plain(client, dir).await? {
            Some((holder, _)) => Err(holder),
            None => Ok(None),
        })
    }

    /// Joins the queue of `dir` with a node for `req` (making the directories first
    /// when they are missing); returns the node's sequence number.
    pub(super) async fn enqueue(
        &self,
        client: &Client,
        dir: &str,
        req: &AcquireRequest,
        granted: Duration,
    ) -> Result<i64, BackendError> {
        let value = layout::queue_value(req, granted, self.slots);
        // Recorded before asking: a creation never answered is cleaned up by its token.
        self.local().node = Some(OurNode {
            value: value.clone(),
            ..OurNode::lost(dir.to_owned(), &req.token)
        });
        let prefix = layout::queue_prefix(dir, &req.token, self.slots);
        let options = CreateMode::EphemeralSequential.with_acls(self.acls());
        // The server removes empty directories on its own: one may go between our
        // making it and our node's creation. Three tries are plenty.
        for _ in 0..3 {
            match client.create(&prefix, &value, &options).await {
                Ok((stat, sequence)) => {
                    let mut local = self.local();
                    if let Some(node) = local.node.as_mut().filter(|n| n.token == req.token) {
                        node.path = Some(format!("{prefix}{sequence}"));
                        node.czxid = stat.czxid;
                        node.created_ms = stat.mtime;
                    }
                    return Ok(sequence.into_i64());
                }
                Err(ZkError::NoNode) => self.make_dirs(client, dir).await?,
                Err(e) => return Err(self.error(&e, dir)),
            }
        }
        Err(BackendError::Unavailable(format!(
            "ZooKeeper at {} kept removing the lock directory {dir}; try again",
            self.at()
        )))
    }

    /// Makes the prefix's and the lock's directories (container nodes).
    async fn make_dirs(&self, client: &Client, dir: &str) -> Result<(), BackendError> {
        let options = CreateMode::Container.with_acls(self.acls());
        let prefix_dir = dir.rsplit_once('/').map_or("", |(p, _)| p);
        for (path, parent_missing) in [(prefix_dir, "chroot"), (dir, "prefix")] {
            match client.create(path, b"", &options).await {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(ZkError::NoNode) if parent_missing == "chroot" => {
                    return Err(BackendError::Refused(format!(
                        "the chroot {} does not exist on ZooKeeper at {}: create it (zkCli.sh \
                         create {}) or fix the URL",
                        self.target.chroot,
                        self.target.servers.join(","),
                        self.target.chroot
                    )))
                }
                // The prefix's directory went meanwhile: the caller tries again.
                Err(ZkError::NoNode) => return Ok(()),
                Err(e) => return Err(self.error(&e, path)),
            }
        }
        Ok(())
    }

    /// Our place in the queue of `dir` (listed now, unless `known` is a listing that
    /// is still exact): take the lock or a slot ([`place::step`]), or answer busy and
    /// record what to wait for.
    pub(super) async fn take_or_wait(
        &self,
        client: &Client,
        dir: &str,
        token: &str,
        known: Option<Listing>,
    ) -> Result<Acquire, BackendError> {
        let mut listing = match known {
            Some(listing) => listing,
            None => Listing::of(&self.children(client, dir).await?),
        };
        let mut holds: Option<Vec<Hold>> = None;
        // Each round either ends, judges the holds once, or learns of a slot another
        // claim took (at most N) or of a hold that changed (listed again).
        for _ in 0..self.slots + 8 {
            let judged: Option<Vec<Judged>> =
                holds.as_ref().map(|h| h.iter().map(Hold::judged).collect());
            match place::step(&listing, token, self.slots, judged.as_deref()) {
                Step::Gone => return Err(self.removed(dir)),
                Step::Conflict(theirs) => {
                    // Leave the queue at once: our node would hold up the nodes behind.
                    let _ = self.stop_waiting("").await;
                    return Err(slots_conflict(theirs, self.slots));
                }
                Step::JudgeHolds => holds = Some(self.judge_holds(client, dir, &listing).await?),
                Step::Wait(watch) => {
                    let holds = holds.as_deref().unwrap_or_default();
                    return self
                        .answer_busy(client, dir, token, &listing, holds, watch)
                        .await;
                }
                Step::Take(_) if self.slots == 1 => {
                    // Over holds: ours to delete now (only the first in line does).
                    let over = holds.iter().flatten().filter(|h| !h.on);
                    self.delete_holds(client, over).await?;
                    return self.taken(client).await;
                }
                Step::Take(slot) => {
                    let hold = holds.iter().flatten().find(|h| h.slot == slot);
                    match self.claim(client, dir, slot, hold).await? {
                        Claimed::Won(acquired) => return Ok(acquired),
                        Claimed::Gone => return Err(self.removed(dir)),
                        Claimed::Lost => listing.slot_nodes.push(slot),
                        Claimed::HoldChanged => {
                            listing = Listing::of(&self.children(client, dir).await?);
                            holds = None;
                        }
                    }
                }
            }
        }
        Err(BackendError::Unavailable(format!(
            "the slots of {dir} at ZooKeeper {} kept changing while lockrun claimed one; \
             trying again",
            self.at()
        )))
    }

    /// Deletes each of `holds`, unless it is gone or changed meanwhile.
    async fn delete_holds<'h>(
        &self,
        client: &Client,
        holds: impl Iterator<Item = &'h Hold>,
    ) -> Result<(), BackendError> {
        for hold in holds {
            match client.delete(&hold.path, Some(hold.version)).await {
                Ok(()) | Err(ZkError::NoNode) | Err(ZkError::BadVersion) => {}
                Err(e) => return Err(self.error(&e, &hold.path)),
            }
        }
        Ok(())
    }

    /// Our node was deleted under us (`release --force`, or the session ended): forget
    /// it; the driver queues again.
    fn removed(&self, dir: &str) -> BackendError {
        self.local().node = None;
        BackendError::Unavailable(format!(
            "lockrun's place in the queue of {dir} at ZooKeeper {} was removed; queueing \
             again",
            self.at()
        ))
    }

    /// Answers busy, and records what to wait for: the `watch` children of `dir`
    /// (until the earliest hold among them ends, if any). The holder named is the hold
    /// that ends first, else the first in line.
    async fn answer_busy(
        &self,
        client: &Client,
        dir: &str,
        token: &str,
        listing: &Listing,
        holds: &[Hold],
        watch: Vec<String>,
    ) -> Result<Acquire, BackendError> {
        let first_hold = holds
            .iter()
            .filter(|h| h.on)
            .min_by_key(|h| h.holder.ttl_left);
        let within = holds
            .iter()
            .filter(|h| h.on && watch.contains(&hold_name(h.slot)))
            .map(|h| h.holder.ttl_left)
            .min();
        let holder = match (first_hold, listing.queue.first()) {
            (Some(hold), _) => hold.holder.clone(),
            (None, Some(first)) if first.token != token => {
                self.holder_of(client, dir, first).await?
            }
            (None, _) => Holder::default(),
        };
        let mut local = self.local();
        local.waiting_for = Some(WaitFor {
            paths: watch.iter().map(|w| format!("{dir}/{w}")).collect(),
            within,
        });
        if let Some(node) = local.node.as_mut() {
            node.waited = true;
        }
        Ok(Acquire::Busy(holder))
    }

    /// The lock is ours: after a wait, stamp the time it was taken on our node (the
    /// server's clock, for `status`); the fencing token is the node's creation zxid.
    pub(super) async fn taken(&self, client: &Client) -> Result<Acquire, BackendError> {
        let node = self.local().node.clone().ok_or(BackendError::NotOwner)?;
        let path = node.path.clone().unwrap_or_default();
        if node.waited {
            // Sent now, not waited for: only `status` and the run's record read the
            // stamp, and the lock is ours whatever it answers (a hand-off need not wait
            // for a disk write). Its answer, when it comes, gives the record the time.
            let stamp = client.set_data(&path, &node.value, None);
            let (at, answer) = tokio::sync::watch::channel(None);
            tokio::spawn(async move {
                if let Ok(stat) = stamp.await {
                    let _ = at.send(Some(stat.mtime));
                }
            });
            if let Some(ours) = self.local().node.as_mut().filter(|n| n.token == node.token) {
                ours.stamp = Some(answer);
            }
        }
        self.local().waiting_for = None;
        self.fencing(node.czxid, 0)
    }

    /// The answer for a lock (or slot) taken with fencing token `zxid`.
    pub(super) fn fencing(&self, zxid: i64, slot: u32) -> Result<Acquire, BackendError> {
        match u64::try_from(zxid) {
            Ok(fencing_token) if fencing_token > 0 => Ok(Acquire::Acquired {
                fencing_token,
                slot,
            }),
            _ => Err(BackendError::Refused(format!(
                "ZooKeeper at {} created the lock node without its zxid (the fencing token)",
                self.at()
            ))),
        }
    }

    /// The children of `dir` (none when it does not exist).
    pub(super) async fn children(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Vec<String>, BackendError> {
        match client.list_children(dir).await {
            Ok(c) => Ok(c),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(e) => Err(self.error(&e, dir)),
        }
    }

    /// The holder described by queue node `node` (empty if it went meanwhile).
    pub(super) async fn holder_of(
        &self,
        client: &Client,
        dir: &str,
        node: &QueueNode,
    ) -> Result<Holder, BackendError> {
        let path = format!("{dir}/{}", node.name);
        match client.get_data(&path).await {
            Ok((value, stat)) => Ok(layout::holder_from(
                &value, stat.czxid, stat.mzxid, stat.mtime,
            )),
            Err(ZkError::NoNode) => Ok(Holder::default()),
            Err(e) => Err(self.error(&e, &path)),
        }
    }

    /// The hold nodes `listing` names in `dir`, judged by the server's clock (those
    /// gone meanwhile left out). A plain lock's one hold costs what it did before
    /// semaphores: a read, then a write for "now".
    pub(super) async fn judge_holds(
        &self,
        client: &Client,
        dir: &str,
        listing: &Listing,
    ) -> Result<Vec<Hold>, BackendError> {
        let paths: Vec<(u32, String)> = listing
            .holds
            .iter()
            .map(|&slot| (slot, format!("{dir}/{}", hold_name(slot))))
            .collect();
        let read = join_all(paths.iter().map(|(_, path)| client.get_data(path))).await;
        let mut found = Vec::with_capacity(read.len());
        for (answer, (slot, path)) in read.into_iter().zip(paths) {
            match answer {
                Ok((value, stat)) => found.push((slot, path, value, stat)),
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(self.error(&e, &path)),
            }
        }
        if found.is_empty() {
            return Ok(Vec::new());
        }
        // The server's "now": the time of a write of ours (to the directory's own data,
        // which nothing reads).
        let now = match client.set_data(dir, b"", None).await {
            Ok(stat) => stat.mtime,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(self.error(&e, dir)),
        };
        Ok(found
            .into_iter()
            .map(|(slot, path, value, stat)| {
                let (holder, on) = layout::hold_from(&value, stat.mtime, now);
                Hold {
                    path,
                    slot,
                    version: stat.version,
                    czxid: stat.czxid,
                    holder: Holder { slot, ..holder },
                    on,
                }
            })
            .collect())
    }
}
