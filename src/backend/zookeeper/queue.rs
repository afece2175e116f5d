//! The ZooKeeper backend's steps on the queue of one lock: joining it, finding our
//! place, reading the holder and the hold node, deleting our node, the
//! `--hold-at-least` hand-over and `release --force`, as methods of [`ZkBackend`].
//! Part of [`super`].

use std::time::Duration;

use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiWriteError};

use super::layout::{self, QueueNode, HOLD};
use super::{OurNode, WaitFor, ZkBackend};
use crate::backend::{Acquire, AcquireRequest, BackendError, Holder};

/// A hold node as read: its path, version, holder and whether it still keeps the lock.
struct Hold {
    path: String,
    version: i32,
    holder: Holder,
    on: bool,
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
            match self
                .delete_ours(client, &old.dir, &old.token, old.path.clone())
                .await
            {
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
    /// held. When the queue is empty, the directory's child version at the read
    /// (`Some(0)` for no directory yet): a node created next with that very sequence
    /// number is first in line, since ZooKeeper numbers a sequential node with its
    /// parent's child version, which every creation and deletion of a child moves on.
    pub(super) async fn busy_now(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Result<Option<i64>, Holder>, BackendError> {
        let (children, cversion) = match client.get_children(dir).await {
            Ok((children, stat)) => (children, stat.cversion),
            Err(ZkError::NoNode) => return Ok(Ok(Some(0))),
            Err(e) => return Err(self.error(&e, dir)),
        };
        let empty = children.iter().all(|c| c != HOLD) && layout::queue(&children).is_empty();
        if empty {
            return Ok(Ok(Some(i64::from(cversion))));
        }
        Ok(match self.look(client, dir).await? {
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
        let value = layout::queue_value(req, granted);
        // Recorded before asking: a creation never answered is cleaned up by its token.
        self.local().node = Some(OurNode {
            dir: dir.to_owned(),
            token: req.token.clone(),
            path: None,
            czxid: 0,
            value: value.clone(),
            waited: false,
        });
        let prefix = layout::queue_prefix(dir, &req.token);
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

    /// Our place in the queue of `dir`: first (and no hold on) takes the lock;
    /// otherwise busy, waiting for the node just ahead of ours (or the hold).
    pub(super) async fn take_or_wait(
        &self,
        client: &Client,
        dir: &str,
        token: &str,
    ) -> Result<Acquire, BackendError> {
        let children = self.children(client, dir).await?;
        let queue = layout::queue(&children);
        let Some(place) = queue.iter().position(|n| n.token == token) else {
            // Deleted under us (`release --force`, or the session ended): queue again.
            self.local().node = None;
            return Err(BackendError::Unavailable(format!(
                "lockrun's place in the queue of {dir} at ZooKeeper {} was removed; queueing \
                 again",
                self.at()
            )));
        };
        if place > 0 {
            let holder = self.holder_of(client, dir, &queue[0]).await?;
            let ahead = format!("{dir}/{}", queue[place - 1].name);
            self.busy(WaitFor::Node(ahead));
            return Ok(Acquire::Busy(holder));
        }
        if children.iter().any(|c| c == HOLD) {
            if let Some(hold) = self.hold(client, dir).await? {
                if hold.on {
                    self.busy(WaitFor::Hold(hold.path, hold.holder.ttl_left));
                    return Ok(Acquire::Busy(hold.holder));
                }
                // Over: ours now (only the first in line deletes it).
                match client.delete(&hold.path, Some(hold.version)).await {
                    Ok(()) | Err(ZkError::NoNode) | Err(ZkError::BadVersion) => {}
                    Err(e) => return Err(self.error(&e, &hold.path)),
                }
            }
        }
        self.taken(client).await
    }

    /// Records a busy answer and what to wait for.
    fn busy(&self, what: WaitFor) {
        let mut local = self.local();
        local.waiting_for = Some(what);
        if let Some(node) = local.node.as_mut() {
            node.waited = true;
        }
    }

    /// The lock is ours: after a wait, stamp the time it was taken on our node (the
    /// server's clock, for `status`); the fencing token is the node's creation zxid.
    pub(super) async fn taken(&self, client: &Client) -> Result<Acquire, BackendError> {
        let node = self.local().node.clone().ok_or(BackendError::NotOwner)?;
        let path = node.path.clone().unwrap_or_default();
        if node.waited {
            // Sent now, not waited for: only `status` reads the stamp, and the lock is
            // ours whatever it answers (a hand-off need not wait for a disk write).
            drop(client.set_data(&path, &node.value, None));
        }
        self.local().waiting_for = None;
        match u64::try_from(node.czxid) {
            Ok(fencing_token) if fencing_token > 0 => Ok(Acquire::Acquired {
                fencing_token,
                slot: 0,
            }),
            _ => Err(BackendError::Refused(format!(
                "ZooKeeper at {} created the lock node without its zxid (the fencing token)",
                self.at()
            ))),
        }
    }

    /// The children of `dir` (none when it does not exist).
    async fn children(&self, client: &Client, dir: &str) -> Result<Vec<String>, BackendError> {
        match client.list_children(dir).await {
            Ok(c) => Ok(c),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(e) => Err(self.error(&e, dir)),
        }
    }

    /// The holder described by queue node `node` (empty if it went meanwhile).
    async fn holder_of(
        &self,
        client: &Client,
        dir: &str,
        node: &QueueNode,
    ) -> Result<Holder, BackendError> {
        let path = format!("{dir}/{}", node.name);
        match client.get_data(&path).await {
            Ok((value, stat)) => Ok(layout::holder_from(&value, stat.czxid, stat.mtime)),
            Err(ZkError::NoNode) => Ok(Holder::default()),
            Err(e) => Err(self.error(&e, &path)),
        }
    }

    /// The hold node of `dir`, if there is one, judged by the server's clock.
    async fn hold(&self, client: &Client, dir: &str) -> Result<Option<Hold>, BackendError> {
        let path = format!("{dir}/{HOLD}");
        let (value, stat) = match client.get_data(&path).await {
            Ok(found) => found,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.error(&e, &path)),
        };
        // The server's "now": the time of a write of ours (to the directory's own data,
        // which nothing reads).
        let now = match client.set_data(dir, b"", None).await {
            Ok(stat) => stat.mtime,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.error(&e, dir)),
        };
        let (holder, on) = layout::hold_from(&value, stat.mtime, now);
        Ok(Some(Hold {
            path,
            version: stat.version,
            holder,
            on,
        }))
    }

    /// Who holds the lock in `dir` (a hold that is on, else the first in line), with
    /// the path of its node.
    pub(super) async fn look(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Option<(Holder, String)>, BackendError> {
        // A node may go between the listing and its read: look again, a few times.
        for _ in 0..3 {
            let children = self.children(client, dir).await?;
            if children.iter().any(|c| c == HOLD) {
                if let Some(hold) = self.hold(client, dir).await?.filter(|h| h.on) {
                    return Ok(Some((hold.holder, hold.path)));
                }
            }
            let Some(first) = layout::queue(&children).into_iter().next() else {
                return Ok(None);
            };
            let holder = self.holder_of(client, dir, &first).await?;
            if holder != Holder::default() {
                return Ok(Some((holder, format!("{dir}/{}", first.name))));
            }
        }
        Err(BackendError::Unavailable(format!(
            "the lock {dir} at ZooKeeper {} kept changing while it was read; try again",
            self.at()
        )))
    }

    /// `release --force`: deletes the node that holds the lock in `dir` (the hold node,
    /// or the first queue node, whose owner's next renewal then fails).
    pub(super) async fn break_lock(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Option<Holder>, BackendError> {
        let Some((holder, path)) = self.look(client, dir).await? else {
            return Ok(None);
        };
        match client.delete(&path, None).await {
            Ok(()) | Err(ZkError::NoNode) => Ok(Some(holder)),
            Err(e) => Err(self.error(&e, &path)),
        }
    }

    /// Deletes our node for `token` in `dir`: `path` if known, else every queue node
    /// carrying the token (a creation whose answer was lost). NotOwner if none was there.
    pub(super) async fn delete_ours(
        &self,
        client: &Client,
        dir: &str,
        token: &str,
        path: Option<String>,
    ) -> Result<(), BackendError> {
        let paths = match path {
            Some(p) => vec![p],
            None => layout::queue(&self.children(client, dir).await?)
                .into_iter()
                .filter(|n| n.token == token)
                .map(|n| format!("{dir}/{}", n.name))
                .collect(),
        };
        let mut deleted = false;
        for path in paths {
            // The token in the name makes the node ours: no other lockrun has it.
            match client.delete(&path, None).await {
                Ok(()) => deleted = true,
                Err(ZkError::NoNode) => {}
                Err(e) if super::session_over(&e) => {}
                Err(e) => return Err(self.error(&e, &path)),
            }
        }
        if deleted {
            Ok(())
        } else {
            Err(BackendError::NotOwner)
        }
    }

    /// `Release::KeepFor`: in one atomic multi-request, deletes our node (failing if it
    /// is gone: then it was not ours any more) and leaves a hold node that keeps the
    /// lock `keep` longer by the server's clock.
    pub(super) async fn keep_for(
        &self,
        client: &Client,
        node: &OurNode,
        keep: Duration,
    ) -> Result<(), BackendError> {
        let path = node.path.clone().unwrap_or_default();
        let hold_path = format!("{}/{HOLD}", node.dir);
        // When the lock was taken: the node's stamp (see `taken`), by the server's clock.
        let since_ms = match client.check_stat(&path).await {
            Ok(Some(stat)) => stat.mtime,
            Ok(None) => return Err(BackendError::NotOwner),
            Err(e) if super::session_over(&e) => return Err(BackendError::NotOwner),
            Err(e) => return Err(self.error(&e, &path)),
        };
        let holder = layout::holder_from(&node.value, node.czxid, since_ms);
        let value = layout::hold_value(&holder, keep);
        let options = CreateMode::Persistent.with_acls(self.acls());
        // A hold left over (one is deleted only by the next holder): overwrite it.
        for overwrite in [false, true] {
            let mut multi = client.new_multi_writer();
            let built = multi
                .add_delete(&path, None)
                .and_then(|()| match overwrite {
                    false => multi.add_create(&hold_path, &value, &options),
                    true => multi.add_set_data(&hold_path, &value, None),
                });
            built.map_err(|e| self.error(&e, &hold_path))?;
            match multi.commit().await {
                Ok(_) => return Ok(()),
                Err(MultiWriteError::OperationFailed { index: 0, source }) => {
                    return match source {
                        ZkError::NoNode => Err(BackendError::NotOwner),
                        e => Err(self.error(&e, &path)),
                    }
                }
                Err(MultiWriteError::OperationFailed {
                    source: ZkError::NodeExists,
                    ..
                }) if !overwrite => {}
                Err(MultiWriteError::OperationFailed { source, .. })
                | Err(MultiWriteError::RequestFailed { source }) => {
                    return match source {
                        e if super::session_over(&e) => Err(BackendError::NotOwner),
                        e => Err(self.error(&e, &hold_path)),
                    }
                }
            }
        }
        Err(BackendError::Unavailable(format!(
            "could not leave the hold node {hold_path} at ZooKeeper {}; try again",
            self.at()
        )))
    }
}
