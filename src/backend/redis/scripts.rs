//! The Lua scripts of the Redis backend as typed constants, the keys of one lock, and
//! the scripts' replies parsed into types. Part of [`super`].
//!
//! One file per script under `scripts/`, included at build time; the scripts that free
//! a lock get the wake-up helper (`scripts/wake.lua`) prepended. Each script is chosen
//! by the [`Script`] enum, which also knows how many keys it takes; [`Keys::for_script`]
//! is the one place that lists them. A reply that does not parse is an error
//! ([`BadReply`]), never a default: a fencing token of 0 or a holder made up of empty
//! fields must not reach the command or `status`.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use crate::backend::Holder;

/// The longest lease the scripts accept (`MAX_MS` in `scripts/args.lua`; a unit test
/// keeps the two equal).
pub use crate::backend::MAX_LEASE;

/// How long a fencing counter outlives its last write (`FENCE_KEEP_MS` in
/// `scripts/args.lua`), so that a name no longer used leaves nothing behind for good.
///
/// Why tokens still only increase once the counter is gone: a token is
/// `max(counter + 1, server time in µs)`. The counter is at most a few µs ahead of
/// the clock that wrote it, because it advances by more than the clock only when two
/// acquisitions of one name fall in the same microsecond, and each is a whole script
/// run (tens of µs at least) on a server that runs one script at a time. It can be
/// further ahead only through the clock itself: a server clock stepped back, or
/// (Redlock) a token raised to by a quorum whose clocks run ahead. The counter expires
/// 7 days after the last acquisition, so the next token is at least that server's
/// time then, 7 days (6.0e11 µs) past the time of the last token: larger than it
/// unless the counter was more than 7 days ahead of the clock, that is, unless a clock
/// was off by more than a week (the same proviso as property 5: the clock does not run
/// backwards). While the counter lives, a counter ahead of the clock is honoured as
/// before. 7 days is also far longer than any lease (at most [`MAX_LEASE`]), so a
/// lock's counter outlives the lock.
pub const FENCE_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// One of the backend's scripts. Each runs atomically on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Script {
    /// Take the lock, or say who holds it (and queue a waiter).
    Acquire,
    /// Extend our lease if the stored token is ours.
    Renew,
    /// Delete (or shorten) our lock and wake one waiter.
    Release,
    /// Redlock: raise this server's fencing counter to the quorum's token.
    FenceFloor,
    /// Leave the waiters' queue.
    Leave,
    /// Who holds the lock.
    Inspect,
    /// Delete the lock whoever holds it and wake one waiter.
    Force,
}

impl Script {
    /// Every script.
    pub const ALL: [Script; 7] = [
        Script::Acquire,
        Script::Renew,
        Script::Release,
        Script::FenceFloor,
        Script::Leave,
        Script::Inspect,
        Script::Force,
    ];

    /// The script's Lua source. Every script that sets an expiry gets the argument
    /// checks (`scripts/args.lua`) first; the scripts that free a lock get the wake-up
    /// helper.
    pub fn source(self) -> &'static str {
        match self {
            Script::Acquire => concat!(
                include_str!("scripts/args.lua"),
                include_str!("scripts/acquire.lua")
            ),
            Script::Renew => concat!(
                include_str!("scripts/args.lua"),
                include_str!("scripts/renew.lua")
            ),
            Script::Release => concat!(
                include_str!("scripts/args.lua"),
                include_str!("scripts/wake.lua"),
                include_str!("scripts/release.lua")
            ),
            Script::FenceFloor => concat!(
                include_str!("scripts/args.lua"),
                include_str!("scripts/fence_floor.lua")
            ),
            Script::Leave => include_str!("scripts/leave.lua"),
            Script::Inspect => concat!(
                include_str!("scripts/args.lua"),
                include_str!("scripts/inspect.lua")
            ),
            Script::Force => concat!(
                include_str!("scripts/wake.lua"),
                include_str!("scripts/force.lua")
            ),
        }
    }

    /// How many of its arguments are keys (EVAL's `numkeys`).
    pub fn key_count(self) -> usize {
        match self {
            Script::Acquire => 4,
            Script::Renew | Script::Inspect => 1,
            Script::Release | Script::Force => 3,
            Script::FenceFloor | Script::Leave => 2,
        }
    }

    /// The name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Script::Acquire => "acquire",
            Script::Renew => "renew",
            Script::Release => "release",
            Script::FenceFloor => "fence_floor",
            Script::Leave => "leave",
            Script::Inspect => "inspect",
            Script::Force => "force",
        }
    }
}

/// The keys of one lock. All share the `{NAME}` hash tag, so every script touches a
/// single Redis Cluster slot.
pub struct Keys {
    /// `P{NAME}`: a hash `token`, `fence`, `host`, `pid`, `since_ms`; its PX is the lease.
    pub lock: String,
    /// `P{NAME}:fence`: the fencing counter.
    pub fence: String,
    /// `P{NAME}:waiters`: the queue of waiters, by arrival.
    pub queue: String,
    /// `P{NAME}:alive`: each waiter's heartbeat.
    pub alive: String,
    /// `P{NAME}:wake:`: prefix of each waiter's own wake-up channel.
    pub wake_prefix: String,
}

impl Keys {
    /// The keys of lock `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Keys {
        let base = format!("{prefix}{{{name}}}");
        Keys {
            fence: format!("{base}:fence"),
            queue: format!("{base}:waiters"),
            alive: format!("{base}:alive"),
            wake_prefix: format!("{base}:wake:"),
            lock: base,
        }
    }

    /// The keys `script` takes, in its `KEYS[1..]` order.
    pub fn for_script(&self, script: Script) -> Vec<&str> {
        let keys = match script {
            Script::Acquire => vec![&self.lock, &self.fence, &self.queue, &self.alive],
            Script::Renew | Script::Inspect => vec![&self.lock],
            Script::Release | Script::Force => vec![&self.lock, &self.queue, &self.alive],
            Script::FenceFloor => vec![&self.fence, &self.lock],
            Script::Leave => vec![&self.queue, &self.alive],
        };
        keys.into_iter().map(String::as_str).collect()
    }
}

/// A reply that is not what the script returns: an old or foreign script, a proxy that
/// mangles replies, a key that is not lockrun's.
#[derive(Debug, PartialEq, Eq)]
pub struct BadReply(pub String);

fn bad(what: &str, v: &Value) -> ParsingError {
    format!("{what}: got {v:?}").into()
}

/// The acquire script's answer: `{1, fence}` or `{0, host, pid, since_ms, fence, pttl}`.
#[derive(Debug, PartialEq, Eq)]
pub enum AcquireReply {
    /// Ours, with this fencing token (never 0).
    Acquired(u64),
    /// Held by someone else.
    Busy(Holder),
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(items) = &v else {
            return Err(bad("not an array", &v));
        };
        match items.split_first() {
            Some((Value::Int(1), [fence])) => Ok(AcquireReply::Acquired(fencing_token(fence)?)),
            Some((Value::Int(0), rest)) => Ok(AcquireReply::Busy(holder(rest)?)),
            _ => Err(bad("neither {1, fence} nor {0, holder}", &v)),
        }
    }
}

/// The inspect and force scripts' answer: the holder, or nobody (`{}`).
#[derive(Debug, PartialEq, Eq)]
pub struct HolderReply(pub Option<Holder>);

impl FromRedisValue for HolderReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match &v {
            Value::Array(items) if items.is_empty() => Ok(HolderReply(None)),
            Value::Array(items) => Ok(HolderReply(Some(holder(items)?))),
            _ => Err(bad("not an array", &v)),
        }
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

fn text(v: &Value) -> Result<String, ParsingError> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        _ => Err(bad("not a string", v)),
    }
}

/// Parses `{host, pid, since_ms, fence, pttl}`. A lock written by lockrun has every
/// field; `pid` may be missing (`'0'`) only for a hash written by hand.
fn holder(fields: &[Value]) -> Result<Holder, ParsingError> {
    let [host, pid, since, fence, pttl] = fields else {
        return Err(format!("a holder of {} fields instead of 5", fields.len()).into());
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
        ..Holder::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn keys_share_one_hash_tag() {
        let k = Keys::new("lockrun:", "nightly/backup");
        assert_eq!(k.lock, "lockrun:{nightly/backup}");
        assert_eq!(k.fence, "lockrun:{nightly/backup}:fence");
        assert!(k.queue.starts_with("lockrun:{nightly/backup}:"));
        assert!(k.alive.starts_with("lockrun:{nightly/backup}:"));
        assert_eq!(k.wake_prefix, "lockrun:{nightly/backup}:wake:");
    }

    #[test]
    fn every_script_takes_as_many_keys_as_it_declares_and_uses() {
        let k = Keys::new("p:", "n");
        for s in Script::ALL {
            assert_eq!(k.for_script(s).len(), s.key_count(), "{s:?}");
            let src = s.source();
            let used = format!("KEYS[{}]", s.key_count());
            assert!(src.contains(&used), "{s:?} never uses {used}");
            assert!(
                !src.contains(&format!("KEYS[{}]", s.key_count() + 1)),
                "{s:?}"
            );
        }
    }

    #[test]
    fn the_scripts_that_free_a_lock_carry_the_wake_helper() {
        for s in Script::ALL {
            let frees = matches!(s, Script::Release | Script::Force);
            assert_eq!(
                s.source().contains("local function wake_one"),
                frees,
                "{s:?}"
            );
            assert_eq!(s.source().contains("wake_one("), frees, "{s:?}");
        }
    }

    #[test]
    fn the_scripts_that_set_an_expiry_check_their_arguments_first() {
        for s in Script::ALL {
            let src = s.source();
            let expires = src.contains("PEXPIRE") || src.contains("'PX'");
            if matches!(s, Script::Force | Script::Leave) {
                assert!(!expires, "{s:?} sets an expiry without the checks");
                continue;
            }
            assert!(src.contains("local function bad_ms"), "{s:?}");
            // In the script proper, the checks come before the first write.
            let body = src
                .replace(include_str!("scripts/args.lua"), "")
                .replace(include_str!("scripts/wake.lua"), "");
            let first = |words: &[&str]| words.iter().filter_map(|w| body.find(w)).min();
            let check = first(&["bad_ms(", "error_reply("]);
            let write = first(&["'SET'", "'HSET'", "'ZADD'", "'PEXPIRE'", "'DEL'"]);
            if s == Script::Inspect {
                // No arguments; its one write is the expiry of a lock that has none.
                assert_eq!(check, None);
            } else {
                assert!(check.is_some() && check < write, "{s:?}");
            }
        }
    }

    #[test]
    fn the_lua_bounds_are_the_rust_ones() {
        let args = include_str!("scripts/args.lua");
        let ms = |d: Duration| d.as_millis().to_string();
        assert!(args.contains(&format!("local MAX_MS = {}\n", ms(MAX_LEASE))));
        assert!(args.contains(&format!("local FENCE_KEEP_MS = {}\n", ms(FENCE_KEEP))));
    }

    #[test]
    fn acquire_replies_parse() {
        let ok = Value::Array(vec![Value::Int(1), bulk("1700000000000123")]);
        assert_eq!(
            parse::<AcquireReply>(Script::Acquire, ok),
            Ok(AcquireReply::Acquired(1_700_000_000_000_123))
        );
        let busy = Value::Array(vec![
            Value::Int(0),
            bulk("host1"),
            bulk("42"),
            bulk("1700000000000"),
            bulk("1700000000000123"),
            Value::Int(2500),
        ]);
        let Ok(AcquireReply::Busy(h)) = parse::<AcquireReply>(Script::Acquire, busy) else {
            panic!()
        };
        assert_eq!((h.host.as_str(), h.pid), ("host1", 42));
        assert_eq!(h.fencing_token, 1_700_000_000_000_123);
        assert_eq!(h.ttl_left, Duration::from_millis(2500));
    }

    #[test]
    fn a_malformed_reply_is_an_error_never_token_zero() {
        for v in [
            Value::Array(vec![Value::Int(1), bulk("0")]),
            Value::Array(vec![Value::Int(1), bulk("garbage")]),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(0), bulk("h")]),
            Value::Int(1),
            Value::Nil,
        ] {
            let e = parse::<AcquireReply>(Script::Acquire, v.clone()).unwrap_err();
            assert!(e.0.contains("acquire script"), "{v:?}: {}", e.0);
        }
        assert!(parse::<Done>(Script::Renew, Value::Nil).is_err());
        assert_eq!(parse::<Done>(Script::Renew, Value::Int(0)), Ok(Done(false)));
    }

    #[test]
    fn holder_replies_parse() {
        assert_eq!(
            parse::<HolderReply>(Script::Inspect, Value::Array(vec![])),
            Ok(HolderReply(None))
        );
        let fields = vec![bulk("h"), bulk("7"), bulk("1"), bulk("9"), Value::Int(-1)];
        let HolderReply(Some(h)) =
            parse::<HolderReply>(Script::Inspect, Value::Array(fields)).unwrap()
        else {
            panic!()
        };
        assert_eq!((h.pid, h.fencing_token, h.ttl_left), (7, 9, MAX_LEASE));
        let short = Value::Array(vec![bulk("h"), bulk("7")]);
        assert!(parse::<HolderReply>(Script::Force, short).is_err());
    }
}
