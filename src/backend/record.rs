//! The record of a lock's last run: what a run tells the backend as it gives the lock
//! back ([`RunEnd`]), and what the backend keeps of it under the lock's name for
//! `status` and `list` ([`RunRecord`]). The backend writes the record in the same
//! step as the release (the release script on Redis, the release's statement on
//! PostgreSQL, before the lock is let go of on `file://`, the release's transaction on
//! PostgreSQL, before the lock is let go of on `file://`, the release's transaction on
//! etcd, its multi-request on ZooKeeper), so a run makes no more round trips than
//! before; the times in it are the backend's own clock, like the holder's start time
//! (the holder's where the backend tells none: etcd). A record expires with the fencing
//! counter, or 7 days after the run where the counter never expires (PostgreSQL's
//! sequence; a ZooKeeper TTL node), or with a lease its week's records share (etcd), or
//! stays bounded as the counter does (one file per name on `file://`, one node per name
//! on a ZooKeeper without TTL nodes: property 8 of docs/guarantees.md). The record also
//! keeps the last run that succeeded ([`LastOk`]), which `--once-per` judges by. Part of
//! the backend interface; depends on nothing else.

/// Why a run that held the lock ended, as kept in its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndedBy {
    /// The command exited by itself.
    Exited,
    /// The command was killed by a signal lockrun did not send on lock loss.
    Signal,
    /// lockrun stopped the command: the lock was lost.
    Lost,
    /// lockrun stopped the command: `--max-runtime` was reached.
    MaxRuntime,
    /// The command could not be started (not found, not executable, no guard).
    NotStarted,
}

impl EndedBy {
    /// As stored and shown (`exited`, `signal`, `lost`, `max_runtime`, `not_started`).
    pub fn as_str(self) -> &'static str {
        match self {
            EndedBy::Exited => "exited",
            EndedBy::Signal => "signal",
            EndedBy::Lost => "lost",
            EndedBy::MaxRuntime => "max_runtime",
            EndedBy::NotStarted => "not_started",
        }
    }
}

/// How this run ended, given with the release: the rest of the record (who, which
/// token and slot, since when) is the holder the backend stored at acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunEnd {
    /// lockrun's exit status for the run.
    pub exit_status: u8,
    /// Why it ended.
    pub ended_by: EndedBy,
}

/// The last run of a lock that ended (with `--slots N`: of any slot), as a backend
/// keeps it. Its fields come from the store: untrusted, shown with care.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunRecord {
    /// Host name of the run's lockrun.
    pub host: String,
    /// Process id of the run's lockrun.
    pub pid: u32,
    /// The fencing token the run held.
    pub fencing_token: u64,
    /// The slot it held (0 for a plain lock).
    pub slot: u32,
    /// When it took the lock, milliseconds since the Unix epoch (backend clock).
    pub started_ms: u64,
    /// When it gave the lock back, milliseconds since the Unix epoch (backend clock).
    pub ended_ms: u64,
    /// lockrun's exit status for the run.
    pub exit_status: u8,
    /// Why it ended, as stored (see [`EndedBy::as_str`]).
    pub ended_by: String,
    /// The last run that succeeded (exit status 0), this one or an earlier one: kept
    /// by every release, replaced only by a run that exits 0 (`--once-per`).
    pub last_ok: Option<LastOk>,
}

/// The last successful run of a lock, as its record keeps it beside the last run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LastOk {
    /// When it took the lock, milliseconds since the Unix epoch (backend clock).
    pub started_ms: u64,
    /// Host name of its lockrun.
    pub host: String,
}

/// Why `--once-per` does not start a run (property 11 of docs/guarantees.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// A run that started within the period succeeded.
    Succeeded(LastOk),
    /// With `--slots`: another slot's run started earlier within the period and still
    /// holds its slot (it may yet succeed).
    Running(super::Holder),
}

/// A backend's own `--once-per` judgment ([`super::Backend::once_per`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Period {
    /// The command may start.
    Run,
    /// It may not.
    Skip(Skip),
    /// The backend has no judgment of its own: the caller judges from the holders and
    /// the run record, whose times are the backend's clock.
    ByRecords,
}

impl RunRecord {
    /// A record from the JSON object a backend that stores records as JSON keeps (etcd,
    /// ZooKeeper: `host`, `pid`, `fencing_token`, `slot`, `started_ms`, `exit_status`,
    /// `ended_by`), ended at `ended_ms`; `None` when a field is missing or out of range
    /// (a value written by hand, or by something else). Without its last success.
    pub fn from_json(v: &serde_json::Value, ended_ms: u64) -> Option<RunRecord> {
        let number = |key: &str| v.get(key)?.as_u64();
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
}

impl LastOk {
    /// A last success from a JSON object with `host` and `started_ms`.
    pub fn from_json(v: &serde_json::Value) -> Option<LastOk> {
        Some(LastOk {
            host: v.get("host")?.as_str()?.to_owned(),
            started_ms: v.get("started_ms")?.as_u64()?,
        })
    }
}
