//! The record of a lock's last run on ZooKeeper: the persistent node `last` in the
//! lock's directory, and beside it `ok`, the last run that succeeded; their values, and
//! how a release's multi-request writes them. No I/O. Part of [`super`].
//!
//! **Values.** `last` is JSON `{"host", "pid", "fencing_token", "slot", "started_ms",
//! "exit_status", "ended_by", "keep_ms"}`: the holder as the lock's nodes describe it
//! (`started_ms` is when it took the lock, by the server's clock, as `status` shows it),
//! how the run ended, and how long the record is kept. The end time is the node's own
//! modification time: the server's clock at the release, which wrote it. `ok` is JSON
//! `{"host", "started_ms", "keep_ms"}` of the last run that exited 0: a node of its own,
//! written only by such a run (in the same multi-request), so that a failed run leaves
//! it as it was without reading it first.
//!
//! **Written by the release**, as more operations of the multi-request that deletes
//! the holder's nodes (or leaves its hold node), so a run makes no more round trips than
//! before: it sets the nodes' data ([`RecordWrite::Set`], the usual case). When a node
//! is missing (the name's first run, or the last one expired), that multi-request fails
//! as a whole, applying nothing, and is sent again creating it (and `ok` with it, which
//! is never newer than `last`): as TTL nodes where the server allows them, else plain
//! persistent ones. Should the server refuse a record node for another reason (an ACL
//! of someone else's), the release goes on without it: giving the lock back matters
//! more.
//!
//! **Expiry** (property 8). ZooKeeper removes a TTL node not modified for its TTL,
//! [`RECORD_KEEP`] (and then the lock's directory, a container, once empty), but only
//! when the server runs with `zookeeper.extendedTypesEnabled=true`; without it, the
//! create of a TTL node is refused (`Unimplemented`) and the nodes are plain ones,
//! which stay until the next runs of the name overwrite them. Either way `status` shows
//! a node only while `keep_ms` after its write has not passed (by the reader's clock
//! against the server's write time: minutes of skew against 7 days), so every backend
//! shows the same.

use std::time::Duration;

use zookeeper_client::{Acls, CreateMode, Error as ZkError, MultiWriteError, MultiWriter};

use crate::backend::{Holder, LastOk, RunEnd, RunRecord};

/// The name of the record node in the lock's directory.
pub const RECORD: &str = "last";

/// The name of the last success's node in the lock's directory.
pub const OK: &str = "ok";

/// How long a record is kept after its run ended: as long as on every backend.
pub const RECORD_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many times a release writes its record another way before going on without.
const TRIES: u8 = 4;

/// The record's value for `holder` (host, pid, time taken, fencing token, slot) that
/// ended as `end`.
pub fn record_value(holder: &Holder, end: RunEnd) -> Vec<u8> {
    serde_json::json!({
        "host": holder.host, "pid": holder.pid, "fencing_token": holder.fencing_token,
        "slot": holder.slot, "started_ms": holder.since_ms,
        "exit_status": end.exit_status, "ended_by": end.ended_by.as_str(),
        "keep_ms": RECORD_KEEP.as_millis() as u64,
    })
    .to_string()
    .into_bytes()
}

/// The value of `ok` for `holder`'s run, which succeeded.
pub fn ok_value(holder: &Holder) -> Vec<u8> {
    serde_json::json!({
        "host": holder.host, "started_ms": holder.since_ms,
        "keep_ms": RECORD_KEEP.as_millis() as u64,
    })
    .to_string()
    .into_bytes()
}

/// A node's JSON `value`, last written at `mtime` (the server's clock), as seen at
/// `now_ms`: `None` when it is not JSON, or older than its `keep_ms`.
fn kept(value: &[u8], mtime: i64, now_ms: u64) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    let written = u64::try_from(mtime).ok()?;
    let keep = v.get("keep_ms")?.as_u64()?;
    (written.saturating_add(keep) > now_ms).then_some(v)
}

/// The record in a node of `value` last written at `mtime` (the server's clock), as
/// seen at `now_ms`: `None` when it is not one, or is older than its `keep_ms`.
pub fn record_from(value: &[u8], mtime: i64, now_ms: u64) -> Option<RunRecord> {
    let v = kept(value, mtime, now_ms)?;
    RunRecord::from_json(&v, u64::try_from(mtime).ok()?)
}

/// The last success in an `ok` node, as [`record_from`] reads a record.
pub fn ok_from(value: &[u8], mtime: i64, now_ms: u64) -> Option<LastOk> {
    LastOk::from_json(&kept(value, mtime, now_ms)?)
}

/// How a release writes a record node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordWrite {
    /// Over the node there (the name ran before).
    Set,
    /// A new node: a TTL node, or a plain one where the server has none.
    Create,
}

/// One node a release writes.
#[derive(Clone, Debug)]
struct Written {
    path: String,
    value: Vec<u8>,
    /// `None`: the release goes on without it.
    write: Option<RecordWrite>,
}

/// The record a release writes (`last`, and `ok` after a success), and how it writes
/// them now.
#[derive(Clone, Debug)]
pub struct Recording {
    nodes: Vec<Written>,
    acls: Acls<'static>,
    /// New nodes are TTL nodes, until the server says it has none.
    ttl: bool,
    tries: u8,
}

impl Recording {
    /// The record `value` of the lock in `dir` (and `ok`, the value of its last
    /// success, for a run that succeeded), created with `acls` if new.
    pub fn new(dir: &str, value: Vec<u8>, ok: Option<Vec<u8>>, acls: Acls<'static>) -> Self {
        let node = |name: &str, value: Vec<u8>| Written {
            path: format!("{dir}/{name}"),
            value,
            write: Some(RecordWrite::Set),
        };
        let nodes = std::iter::once(node(RECORD, value))
            .chain(ok.map(|ok| node(OK, ok)))
            .collect();
        Recording {
            nodes,
            acls,
            ttl: true,
            tries: 0,
        }
    }

    /// Adds its operations to `multi`, one per node not left out.
    pub fn add(&self, multi: &mut MultiWriter<'_>) -> Result<(), ZkError> {
        let persistent = CreateMode::Persistent.with_acls(self.acls);
        let created = match self.ttl {
            true => persistent.clone().with_ttl(RECORD_KEEP),
            false => persistent,
        };
        for n in &self.nodes {
            match n.write {
                None => {}
                Some(RecordWrite::Set) => multi.add_set_data(&n.path, &n.value, None)?,
                Some(RecordWrite::Create) => multi.add_create(&n.path, &n.value, &created)?,
            }
        }
        Ok(())
    }

    /// After the multi-request with its first operation at index `at` failed with `e`:
    /// true if one of its operations failed, and the request is to be sent again, with
    /// that node written another way (or, failing that, left out; after a few tries,
    /// all of them).
    pub fn retry(&mut self, e: &MultiWriteError, at: usize) -> bool {
        let MultiWriteError::OperationFailed { index, source } = e else {
            return false;
        };
        let written: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].write.is_some())
            .collect();
        let Some(&failed) = index.checked_sub(at).and_then(|k| written.get(k)) else {
            return false;
        };
        self.tries += 1;
        match (self.nodes[failed].write, source) {
            // A node missing: so is every one after it (`ok` is never newer than
            // `last`).
            (Some(RecordWrite::Set), ZkError::NoNode) => {
                for n in self.nodes[failed..]
                    .iter_mut()
                    .filter(|n| n.write.is_some())
                {
                    n.write = Some(RecordWrite::Create);
                }
            }
            (Some(RecordWrite::Create), ZkError::Unimplemented) if self.ttl => self.ttl = false,
            (Some(RecordWrite::Create), ZkError::NodeExists) => {
                self.nodes[failed].write = Some(RecordWrite::Set)
            }
            _ => self.nodes[failed].write = None,
        }
        if self.tries >= TRIES {
            self.nodes.iter_mut().for_each(|n| n.write = None);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::EndedBy;

    fn holder() -> Holder {
        Holder {
            host: "web1".into(),
            pid: 4242,
            since_ms: 1_700_000_000_000,
            fencing_token: 77,
            slot: 2,
            ..Holder::default()
        }
    }

    #[test]
    fn a_record_round_trips_with_the_servers_write_time_as_its_end() {
        let end = RunEnd {
            exit_status: 3,
            ended_by: EndedBy::Exited,
        };
        let value = record_value(&holder(), end);
        let r = record_from(&value, 1_700_000_005_000, 1_700_000_006_000).expect("a record");
        assert_eq!((r.host.as_str(), r.pid, r.slot), ("web1", 4242, 2));
        assert_eq!((r.fencing_token, r.exit_status), (77, 3));
        assert_eq!(r.ended_by, "exited");
        assert_eq!(
            (r.started_ms, r.ended_ms),
            (1_700_000_000_000, 1_700_000_005_000)
        );
    }

    #[test]
    fn a_record_past_its_keep_or_not_one_is_none() {
        let end = RunEnd {
            exit_status: 0,
            ended_by: EndedBy::Exited,
        };
        let value = record_value(&holder(), end);
        let keep = RECORD_KEEP.as_millis() as u64;
        let written = 1_700_000_005_000;
        assert!(record_from(&value, written as i64, written + keep - 1).is_some());
        assert!(record_from(&value, written as i64, written + keep).is_none());
        assert!(record_from(&value, -1, written).is_none());
        for bad in [&b"not json"[..], b"{}", b"[1]"] {
            assert!(record_from(bad, written as i64, written).is_none());
        }
        let mut v: serde_json::Value = serde_json::from_slice(&value).unwrap();
        v["exit_status"] = 256.into();
        assert!(record_from(v.to_string().as_bytes(), written as i64, written).is_none());
    }

    #[test]
    fn the_last_success_is_a_node_of_its_own_kept_as_long() {
        let value = ok_value(&holder());
        let written = 1_700_000_005_000;
        let ok = ok_from(&value, written as i64, written).expect("a last success");
        assert_eq!(
            (ok.host.as_str(), ok.started_ms),
            ("web1", 1_700_000_000_000)
        );
        let keep = RECORD_KEEP.as_millis() as u64;
        assert!(ok_from(&value, written as i64, written + keep).is_none());
        assert!(ok_from(b"{}", written as i64, written).is_none());
    }

    /// How `r` writes its nodes now.
    fn writes(r: &Recording) -> Vec<Option<RecordWrite>> {
        r.nodes.iter().map(|n| n.write).collect()
    }

    #[test]
    fn the_nodes_are_set_else_created_with_a_ttl_else_without_else_left_out() {
        use RecordWrite::{Create, Set};
        let failed = |index, source| MultiWriteError::OperationFailed { index, source };
        let ok = Some(b"{}".to_vec());
        let mut r = Recording::new("/p/n", b"{}".to_vec(), ok.clone(), Acls::anyone_all());
        let paths: Vec<&str> = r.nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, ["/p/n/last", "/p/n/ok"]);
        assert_eq!((writes(&r), r.ttl), (vec![Some(Set), Some(Set)], true));
        // Another operation's failure, or a request that failed whole: not the record's.
        assert!(!r.retry(&failed(0, ZkError::NoNode), 1));
        let whole = MultiWriteError::RequestFailed {
            source: ZkError::ConnectionLoss,
        };
        assert!(!r.retry(&whole, 1));
        // No `last`: no `ok` either; both created, as TTL nodes, else plain ones.
        assert!(r.retry(&failed(1, ZkError::NoNode), 1));
        assert_eq!(
            (writes(&r), r.ttl),
            (vec![Some(Create), Some(Create)], true)
        );
        assert!(r.retry(&failed(2, ZkError::Unimplemented), 1));
        assert_eq!(
            (writes(&r), r.ttl),
            (vec![Some(Create), Some(Create)], false)
        );
        // Created meanwhile by another release: set.
        assert!(r.retry(&failed(2, ZkError::NodeExists), 1));
        assert_eq!(writes(&r), [Some(Create), Some(Set)]);
        // After four tries, the release goes on without them.
        assert!(r.retry(&failed(1, ZkError::NodeExists), 1));
        assert_eq!(writes(&r), [None, None]);
        assert!(!r.retry(&failed(1, ZkError::NoNode), 1));
        // Only `ok` missing: only it is created. One refused for another reason: left
        // out at once, and the other counted from the operations still sent.
        let mut r = Recording::new("/p/n", b"{}".to_vec(), ok, Acls::anyone_all());
        assert!(r.retry(&failed(3, ZkError::NoNode), 2));
        assert_eq!(writes(&r), [Some(Set), Some(Create)]);
        assert!(r.retry(&failed(2, ZkError::NoAuth), 2));
        assert_eq!(writes(&r), [None, Some(Create)]);
        assert!(r.retry(&failed(2, ZkError::NoAuth), 2));
        assert_eq!(writes(&r), [None, None]);
        // A failed run writes `last` alone.
        let r = Recording::new("/p/n", b"{}".to_vec(), None, Acls::anyone_all());
        assert_eq!(writes(&r), [Some(Set)]);
    }
}
