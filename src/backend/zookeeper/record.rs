//! The record of a lock's last run on ZooKeeper: the persistent node `last` in the
//! lock's directory, its value, and how a release's multi-request writes it. No I/O.
//! Part of [`super`]; depends on [`super::layout`].
//!
//! **Value.** JSON `{"host", "pid", "fencing_token", "slot", "started_ms",
//! "exit_status", "ended_by", "keep_ms"}`: the holder as the lock's nodes describe it
//! (`started_ms` is when it took the lock, by the server's clock, as `status` shows it),
//! how the run ended, and how long the record is kept. The end time is the node's own
//! modification time: the server's clock at the release, which wrote it.
//!
//! **Written by the release**, as one more operation of the multi-request that deletes
//! the holder's nodes (or leaves its hold node), so a run makes no more round trips than
//! before: it sets the node's data ([`RecordWrite::Set`], the usual case). When there is
//! no node yet (the name's first run, or the last one expired), that multi-request
//! fails as a whole, applying nothing, and is sent again creating it: a TTL node where
//! the server allows them, else a plain persistent one. Should the server refuse the
//! record for another reason (an ACL of someone else's), the release goes on without it:
//! giving the lock back matters more.
//!
//! **Expiry** (property 8). ZooKeeper removes a TTL node not modified for its TTL,
//! [`RECORD_KEEP`] (and then the lock's directory, a container, once empty), but only
//! when the server runs with `zookeeper.extendedTypesEnabled=true`; without it, the
//! create of a TTL node is refused (`Unimplemented`) and the record is a plain node,
//! which stays until the next run of the name overwrites it. Either way `status` shows
//! a record only while `keep_ms` after its write has not passed (by the reader's clock
//! against the server's write time: minutes of skew against 7 days), so every backend
//! shows the same.

use std::time::Duration;

use zookeeper_client::{Acls, CreateMode, Error as ZkError, MultiWriteError, MultiWriter};

use crate::backend::{Holder, RunEnd, RunRecord};

/// The name of the record node in the lock's directory.
pub const RECORD: &str = "last";

/// How long a record is kept after its run ended: as long as on every backend.
pub const RECORD_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many times a release writes its record another way before going on without.
const TRIES: u8 = 3;

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

/// The record in a node of `value` last written at `mtime` (the server's clock), as
/// seen at `now_ms`: `None` when it is not one, or is older than its `keep_ms`.
pub fn record_from(value: &[u8], mtime: i64, now_ms: u64) -> Option<RunRecord> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    let number = |key: &str| v.get(key)?.as_u64();
    let ended_ms = u64::try_from(mtime).ok()?;
    if ended_ms.saturating_add(number("keep_ms")?) <= now_ms {
        return None;
    }
    Some(RunRecord {
        host: v.get("host")?.as_str()?.to_owned(),
        pid: u32::try_from(number("pid")?).ok()?,
        fencing_token: number("fencing_token")?,
        slot: u32::try_from(number("slot")?).ok()?,
        started_ms: number("started_ms")?,
        ended_ms,
        exit_status: u8::try_from(number("exit_status")?).ok()?,
        ended_by: v.get("ended_by")?.as_str()?.to_owned(),
        last_ok: None,
    })
}

/// How a release writes the record node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordWrite {
    /// Over the node there (the name ran before).
    Set,
    /// A new TTL node.
    CreateTtl,
    /// A new persistent node (the server has no TTL nodes).
    Create,
}

impl RecordWrite {
    /// The next way to try after the record's operation failed with `e`, if any.
    fn after(self, e: &ZkError) -> Option<RecordWrite> {
        match (self, e) {
            (RecordWrite::Set, ZkError::NoNode) => Some(RecordWrite::CreateTtl),
            (RecordWrite::CreateTtl, ZkError::Unimplemented) => Some(RecordWrite::Create),
            (RecordWrite::CreateTtl | RecordWrite::Create, ZkError::NodeExists) => {
                Some(RecordWrite::Set)
            }
            _ => None,
        }
    }
}

/// The record a release writes, and how it writes it now.
#[derive(Clone, Debug)]
pub struct Recording {
    path: String,
    value: Vec<u8>,
    acls: Acls<'static>,
    /// `None`: the release goes on without it.
    write: Option<RecordWrite>,
    tries: u8,
}

impl Recording {
    /// The record `value` of the lock in `dir`, created with `acls` if new.
    pub fn new(dir: &str, value: Vec<u8>, acls: Acls<'static>) -> Recording {
        Recording {
            path: format!("{dir}/{RECORD}"),
            value,
            acls,
            write: Some(RecordWrite::Set),
            tries: 0,
        }
    }

    /// Adds its operation to `multi` (none once left out).
    pub fn add(&self, multi: &mut MultiWriter<'_>) -> Result<(), ZkError> {
        let persistent = CreateMode::Persistent.with_acls(self.acls);
        match self.write {
            None => Ok(()),
            Some(RecordWrite::Set) => multi.add_set_data(&self.path, &self.value, None),
            Some(RecordWrite::Create) => multi.add_create(&self.path, &self.value, &persistent),
            Some(RecordWrite::CreateTtl) => {
                let ttl = persistent.with_ttl(RECORD_KEEP);
                multi.add_create(&self.path, &self.value, &ttl)
            }
        }
    }

    /// After the multi-request with its operation at index `at` failed with `e`: true
    /// if that operation failed, and the request is to be sent again, with the record
    /// written another way (or, failing that, left out).
    pub fn retry(&mut self, e: &MultiWriteError, at: usize) -> bool {
        let MultiWriteError::OperationFailed { index, source } = e else {
            return false;
        };
        if *index != at || self.write.is_none() {
            return false;
        }
        self.tries += 1;
        self.write = self
            .write
            .and_then(|w| w.after(source))
            .filter(|_| self.tries < TRIES);
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
    fn the_record_is_set_else_created_with_a_ttl_else_without_else_left_out() {
        let failed = |index, source| MultiWriteError::OperationFailed { index, source };
        let mut r = Recording::new("/p/n", b"{}".to_vec(), Acls::anyone_all());
        assert_eq!(r.path, "/p/n/last");
        assert_eq!(r.write, Some(RecordWrite::Set));
        // Another operation's failure, or a request that failed whole: not the record's.
        assert!(!r.retry(&failed(0, ZkError::NoNode), 1));
        let whole = MultiWriteError::RequestFailed {
            source: ZkError::ConnectionLoss,
        };
        assert!(!r.retry(&whole, 1));
        assert!(r.retry(&failed(1, ZkError::NoNode), 1));
        assert_eq!(r.write, Some(RecordWrite::CreateTtl));
        assert!(r.retry(&failed(1, ZkError::Unimplemented), 1));
        assert_eq!(r.write, Some(RecordWrite::Create));
        // Racing another release forth and back: after three tries, left out.
        assert!(r.retry(&failed(1, ZkError::NodeExists), 1));
        assert_eq!(r.write, None);
        assert!(!r.retry(&failed(1, ZkError::NoNode), 1));
        // Refused for another reason: left out at once.
        let mut r = Recording::new("/p/n", b"{}".to_vec(), Acls::anyone_all());
        assert!(r.retry(&failed(2, ZkError::NoAuth), 2));
        assert_eq!(r.write, None);
    }
}
