//! The Redis scripts' replies parsed into types. Part of [`super`]; the scripts are in
//! `scripts.rs`.
//!
//! A reply that does not parse is an error ([`BadReply`]), never a default: a fencing
//! token of 0, a slot out of range or a holder made up of empty fields must not reach
//! the command or `status`.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::scripts::Script;
use crate::backend::{Holder, LastOk, RunRecord, MAX_LEASE, MAX_SLOTS};

/// A reply that is not what the script returns: an old or foreign script, a proxy that
/// mangles replies, a key that is not lockrun's.
#[derive(Debug, PartialEq, Eq)]
pub struct BadReply(pub String);

fn bad(what: &str, v: &Value) -> ParsingError {
    format!("{what}: got {v:?}").into()
}

/// The acquire script's answer: `{1, fence, slot, free}`,
/// `{0, host, pid, since_ms, fence, pttl, slot, slots}`, `{2, theirs}` or
/// `{3, policy, maxmemory}` (see [`Checked`] for the `{4, why, answer}` around it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireReply {
    /// Ours.
    Acquired {
        /// The fencing token (never 0).
        fencing_token: u64,
        /// The slot taken.
        slot: u32,
        /// Which slots were free when it was taken (the one taken included): Redlock
        /// picks from these a slot free on a majority.
        free: Vec<bool>,
    },
    /// Every slot (or the one asked for) is held: the holder to wait for.
    Busy(Holder),
    /// A live holder was taken with this other N of `--slots`; nothing was written.
    Conflict(u32),
    /// The server may evict the lock (`maxmemory` set, `maxmemory-policy` not
    /// `noeviction`) and `--allow-eviction` was not given; nothing was written.
    Evicting {
        /// The server's `maxmemory-policy`.
        policy: String,
        /// The server's `maxmemory`, in bytes (never 0).
        maxmemory: u64,
    },
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(items) = &v else {
            return Err(bad("not an array", &v));
        };
        match items.split_first() {
            Some((Value::Int(1), [fence, slot, free])) => Ok(AcquireReply::Acquired {
                fencing_token: fencing_token(fence)?,
                slot: slot_number(slot)?,
                free: free_map(free)?,
            }),
            Some((Value::Int(0), rest)) => Ok(AcquireReply::Busy(holder(rest)?)),
            Some((Value::Int(2), [theirs])) => Ok(AcquireReply::Conflict(slot_count(theirs)?)),
            Some((Value::Int(3), [policy, maxmemory])) => Ok(AcquireReply::Evicting {
                policy: policy_name(policy)?,
                maxmemory: match number(maxmemory)? {
                    0 => return Err(bad("a maxmemory of 0 that may evict", &v)),
                    n => n,
                },
            }),
            _ => Err(bad(
                "neither {1, fence, slot, free}, {0, holder}, {2, slots} nor {3, policy, maxmemory}",
                &v,
            )),
        }
    }
}

/// The acquire script's whole answer: the [`AcquireReply`], and, when the server would
/// not let the script read `INFO` for the eviction check (`{4, why, answer}`), why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// The answer proper.
    pub reply: AcquireReply,
    /// The server's error when the eviction check could not be made (the answer then
    /// stands as if the server could not evict).
    pub unchecked: Option<String>,
}

impl FromRedisValue for Checked {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Array(items) if items.first() == Some(&Value::Int(4)) => {
                let [_, why, answer] = <[Value; 3]>::try_from(items)
                    .map_err(|items| bad("not {4, why, answer}", &Value::Array(items)))?;
                Ok(Checked {
                    unchecked: Some(text(&why)?),
                    reply: AcquireReply::from_redis_value(answer)?,
                })
            }
            v => Ok(Checked {
                reply: AcquireReply::from_redis_value(v)?,
                unchecked: None,
            }),
        }
    }
}

/// A holder as the inspect and force scripts give it, with its owner token: Redlock
/// counts the servers that hold one slot with one token. The token never leaves the
/// backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotHolder {
    /// Who, in which slot, with how long left.
    pub holder: Holder,
    /// The owner's token.
    pub token: String,
}

/// The inspect and force scripts' answer: `{theirs, holder...}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldersReply {
    /// The N of `--slots` the name's semaphore holders were taken with, when it is not
    /// the one asked with (0 otherwise). For force, nothing was deleted then.
    pub theirs: u32,
    /// Every live holder, by slot.
    pub holders: Vec<SlotHolder>,
}

impl FromRedisValue for HoldersReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(items) = &v else {
            return Err(bad("not an array", &v));
        };
        let Some((theirs, rest)) = items.split_first() else {
            return Err(bad("an empty answer", &v));
        };
        let theirs = match number(theirs)? {
            0 => 0,
            _ => slot_count(theirs)?,
        };
        let holders = rest
            .iter()
            .map(|h| match h {
                Value::Array(fields) => match fields.split_last() {
                    Some((token, fields)) => Ok(SlotHolder {
                        holder: holder(fields)?,
                        token: text(token)?,
                    }),
                    None => Err(bad("an empty holder", h)),
                },
                other => Err(bad("a holder that is not an array", other)),
            })
            .collect::<Result<_, _>>()?;
        Ok(HoldersReply { theirs, holders })
    }
}

/// The renew and release scripts' answer: 1 done, 0 not ours.
#[derive(Debug, PartialEq, Eq)]
pub struct Done(pub bool);

impl FromRedisValue for Done {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(1) => Ok(Done(true)),
            Value::Int(0) => Ok(Done(false)),
            other => Err(bad("neither 1 nor 0", &other)),
        }
    }
}

/// Parses `value` as `T`, naming `script` when it does not parse.
pub fn parse<T: FromRedisValue>(script: Script, value: Value) -> Result<T, BadReply> {
    T::from_redis_value(value).map_err(|e| {
        BadReply(format!(
            "an unexpected answer to the {} script ({e})",
            script.name()
        ))
    })
}

fn number(v: &Value) -> Result<u64, ParsingError> {
    match v {
        Value::Int(i) => u64::try_from(*i).map_err(|_| bad("a negative number", v)),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("not a number", v)),
        Value::SimpleString(s) => s.parse().map_err(|_| bad("not a number", v)),
        _ => Err(bad("not a number", v)),
    }
}

fn fencing_token(v: &Value) -> Result<u64, ParsingError> {
    match number(v)? {
        0 => Err(bad("a fencing token of 0", v)),
        n => Ok(n),
    }
}

/// A slot, 0 to [`MAX_SLOTS`] - 1.
fn slot_number(v: &Value) -> Result<u32, ParsingError> {
    u32::try_from(number(v)?)
        .ok()
        .filter(|&s| s < MAX_SLOTS)
        .ok_or_else(|| bad("a slot out of range", v))
}

/// An N of `--slots`, 1 to [`MAX_SLOTS`].
fn slot_count(v: &Value) -> Result<u32, ParsingError> {
    u32::try_from(number(v)?)
        .ok()
        .filter(|n| (1..=MAX_SLOTS).contains(n))
        .ok_or_else(|| bad("a number of slots out of range", v))
}

/// `'1'` where a slot was free, `'0'` where it was held, one character per slot.
fn free_map(v: &Value) -> Result<Vec<bool>, ParsingError> {
    let map = text(v)?;
    if map.is_empty() || map.len() > MAX_SLOTS as usize {
        return Err(bad("a map of free slots of the wrong length", v));
    }
    map.chars()
        .map(|c| match c {
            '1' => Ok(true),
            '0' => Ok(false),
            _ => Err(bad("a map of free slots that is not 0s and 1s", v)),
        })
        .collect()
}

/// A `maxmemory-policy` as INFO spells it: a short word of letters, digits, `-`, `_`
/// (it goes into an error line).
fn policy_name(v: &Value) -> Result<String, ParsingError> {
    let name = text(v)?;
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if name.is_empty() || name.len() > 64 || !name.chars().all(ok) {
        return Err(bad("not a maxmemory-policy", v));
    }
    Ok(name)
}

fn text(v: &Value) -> Result<String, ParsingError> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        _ => Err(bad("not a string", v)),
    }
}

/// Parses `{host, pid, since_ms, fence, pttl, slot, slots}`. A lock written by lockrun
/// has every field; `pid` may be missing (`'0'`) only for a hash written by hand, and
/// `slots` is 1 for a plain lock's.
fn holder(fields: &[Value]) -> Result<Holder, ParsingError> {
    let [host, pid, since, fence, pttl, slot, slots] = fields else {
        return Err(format!("a holder of {} fields instead of 7", fields.len()).into());
    };
    // -1: a key without expiry, which the scripts replace by MAX_LEASE (and give that
    // expiry); should one still come, it is treated alike.
    let ttl_left = match pttl {
        Value::Int(-1) => MAX_LEASE.as_millis() as u64,
        other => number(other)?,
    };
    Ok(Holder {
        host: text(host)?,
        pid: u32::try_from(number(pid)?).map_err(|_| bad("a pid out of range", pid))?,
        since_ms: number(since)?,
        fencing_token: number(fence)?,
        ttl_left: Duration::from_millis(ttl_left),
        slot: slot_number(slot)?,
        slots: slot_count(slots)?,
    })
}

/// The last-run script's answer: the record's eight fields, all nil when there is none,
/// and the last success's two (nil when none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastRunReply(pub Option<RunRecord>);

impl FromRedisValue for LastRunReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(items) = &v else {
            return Err(bad("not an array", &v));
        };
        let [host, pid, fence, slot, started, ended, exit, ended_by, ok_started, ok_host] =
            items.as_slice()
        else {
            return Err(bad("a run record of the wrong length", &v));
        };
        if items[..8].iter().all(|f| *f == Value::Nil) {
            return Ok(LastRunReply(None));
        }
        let last_ok = match (ok_started, ok_host) {
            (Value::Nil, _) | (_, Value::Nil) => None,
            _ => Some(LastOk {
                started_ms: number(ok_started)?,
                host: text(ok_host)?,
            }),
        };
        Ok(LastRunReply(Some(RunRecord {
            host: text(host)?,
            pid: u32::try_from(number(pid)?).map_err(|_| bad("a pid out of range", pid))?,
            fencing_token: number(fence)?,
            slot: slot_number(slot)?,
            started_ms: number(started)?,
            ended_ms: number(ended)?,
            exit_status: u8::try_from(number(exit)?)
                .map_err(|_| bad("an exit status out of range", exit))?,
            ended_by: text(ended_by)?,
            last_ok,
        })))
    }
}

#[cfg(test)]
mod tests;
