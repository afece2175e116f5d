//! The Lua scripts of the Redis backend as typed constants, and the keys of one lock
//! (every slot of a semaphore). Part of [`super`]; their replies are parsed in
//! `replies.rs`.
//!
//! One file per script under `scripts/`, included at build time; the scripts that free
//! a slot get the wake-up helper (`scripts/wake.lua`) prepended, those that set a
//! semaphore holder's lease the limit helper (`scripts/limit.lua`), those that take a
//! slot the eviction check (`scripts/evict.lua`), and the release the grant
//! (`scripts/grant.lua`). Each script is
//! chosen by the [`Script`] enum, which also knows how many fixed keys it takes before
//! the slot keys; [`Keys::for_script`] is the one place that lists them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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

/// How long a woken waiter has priority for a free slot (`WAKE_GRACE_MS` in
/// `scripts/args.lua`; `scripts/acquire.lua` says why; a unit test keeps the two equal): longer than
/// a woken waiter takes to ask on a loaded machine, short enough that one that died or
/// froze holds the others back little, and the bound on the delay when Redlock's
/// servers keep the slot for different waiters.
pub const WAKE_GRACE: Duration = Duration::from_secs(2);

/// One of the backend's scripts. Each runs atomically on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Script {
    /// Take the lowest free slot (or the one asked for), or say who holds them (and
    /// queue a waiter); refuse a holder of another N, and a server that may evict the
    /// lock (its `INFO memory`) unless allowed.
    Acquire,
    /// Extend our lease if the stored token is ours (in the slot taken, or any).
    Renew,
    /// Delete (or shorten) our slot, wherever it is, and wake one waiter (or grant it
    /// the slot, when it asked for grants).
    Release,
    /// Redlock: raise this server's fencing counter to the quorum's token.
    FenceFloor,
    /// Leave the waiters' queue.
    Leave,
    /// Who holds each slot.
    Inspect,
    /// Delete every slot whoever holds it and wake one waiter per slot freed.
    Force,
    /// Read the record of the last run.
    LastRun,
}

impl Script {
    /// Every script.
    pub const ALL: [Script; 8] = [
        Script::Acquire,
        Script::Renew,
        Script::Release,
        Script::FenceFloor,
        Script::Leave,
        Script::Inspect,
        Script::Force,
        Script::LastRun,
    ];

    /// The script's Lua source. Every script that sets an expiry gets the argument
    /// checks (`scripts/args.lua`) first; the scripts that free a lock get the wake-up
    /// helper.
    pub fn source(self) -> &'static str {
        match self {
            Script::Acquire => concat!(
                include_str!("scripts/args.lua"),
                include_str!("scripts/limit.lua"),
                include_str!("scripts/evict.lua"),
                include_str!("scripts/acquire.lua")
            ),
            Script::Renew => concat!(
                include_str!("scripts/args.lua"),
                include_str!("scripts/limit.lua"),
                include_str!("scripts/renew.lua")
            ),
            Script::Release => concat!(
                include_str!("scripts/args.lua"),
                include_str!("scripts/limit.lua"),
                include_str!("scripts/evict.lua"),
                include_str!("scripts/grant.lua"),
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
            Script::LastRun => include_str!("scripts/last.lua"),
        }
    }

    /// How many keys it takes before the slot keys (all of them for the scripts that
    /// [`Script::takes_slots`], none for the others).
    pub fn fixed_keys(self) -> usize {
        match self {
            Script::Inspect | Script::Renew | Script::LastRun => 1,
            Script::FenceFloor | Script::Leave => 2,
            Script::Force => 3,
            Script::Acquire => 4,
            Script::Release => 5,
        }
    }

    /// Whether the slot keys follow the fixed ones: every slot (one taken slot for a
    /// renewal that knows it). The fencing floor takes the one slot held as its second
    /// fixed key.
    pub fn takes_slots(self) -> bool {
        !matches!(self, Script::FenceFloor | Script::Leave | Script::LastRun)
    }

    /// The SHA-1 of [`Script::source`] in hex, as `EVALSHA` names the script (a unit
    /// test keeps each equal to its source's; it prints the new one when a script
    /// changes).
    pub fn sha1(self) -> &'static str {
        match self {
            Script::Acquire => "aa46cd0cb4f1f0292b3d159146d4a97d78dc1458",
            Script::Renew => "93a1445f46bebddcfea33e33c407b939882d0c0f",
            Script::Release => "b683ec7cfd5b0976cefc87a784489085f71dddbd",
            Script::FenceFloor => "27f0bcad53a7f85edfe1dd2d78912fa6a7ad0c97",
            Script::Leave => "8f3ac4c0a52d50fd343e76187f3db5d71c48de78",
            Script::Inspect => "1a4280b32b65a66a8869171fac270bd824b16118",
            Script::Force => "f971dbf6f1d17e9cd60e703f16a27c112ae89cb1",
            Script::LastRun => "3cbf20beaec1d80815b3558e50f4f22b22f0993f",
        }
    }

    /// Whether lockrun sends it by its digest (`EVALSHA`) first: the acquire script,
    /// the largest (13 KB) and the one a run waits for before its command starts (about
    /// 0.14 ms less a run on a fresh connection here), and the release (12 KB), which
    /// the next holder of a busy lock waits for (it grants the lock). The others go by
    /// source: on a server that lacks the script (restarted, failed over, never asked),
    /// a renewal by digest would take two round trips, where its time is bounded by
    /// the lease.
    pub fn by_digest(self) -> bool {
        matches!(self, Script::Acquire | Script::Release)
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
            Script::LastRun => "last_run",
        }
    }
}

/// The Lua source lockrun sends for its script `name` (`acquire`, `renew`, `release`,
/// `fence_floor`, `leave`, `inspect`, `force`), helpers included: what an operator
/// or a test can EVAL by hand to see exactly what lockrun runs.
pub fn script_source(name: &str) -> Option<&'static str> {
    Script::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .map(Script::source)
}

/// The SHA-1 (hex) of the script of that name, as `EVALSHA` names it.
pub fn script_sha1(name: &str) -> Option<&'static str> {
    Script::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .map(Script::sha1)
}

/// Set once a server refused `EVALSHA` (`NOPERM`: a user with the ACL rule of an
/// earlier release, `+eval` only): the scripts go by source from then on.
pub(super) static NO_EVALSHA: AtomicBool = AtomicBool::new(false);

/// Whether an `EVALSHA` that failed with `e` is to be sent by source: the server does
/// not have the script (`NOSCRIPT`), or will not run `EVALSHA` (`NOPERM`; then never
/// again in this process, see [`NO_EVALSHA`]).
pub(super) fn wants_source(e: &redis::RedisError) -> bool {
    match e.code() {
        Some("NOSCRIPT") => true,
        Some("NOPERM") => {
            NO_EVALSHA.store(true, Ordering::Relaxed);
            true
        }
        _ => false,
    }
}

/// The keys of one lock. All share the `{NAME}` hash tag, so every script touches a
/// single Redis Cluster slot.
///
/// A semaphore's slot 0 is the plain lock's key, so `--slots 1` is the lock as it was
/// before semaphores; slot `i` of 1 to N-1 is `P{NAME}#i`: no lock name holds a `#`
/// (nor a brace), so no other prefix and name can give that key.
pub struct Keys {
    /// `P{NAME}`: a hash `token`, `fence`, `host`, `pid`, `since_ms` (and, with
    /// `--slots` above 1, `slot` and `slots`); its PX is the lease. Slot 0.
    pub lock: String,
    /// `P{NAME}:fence`: the fencing counter, one for every slot.
    pub fence: String,
    /// `P{NAME}:waiters`: the queue of waiters, by arrival (under Redlock, by the place
    /// each waiter gives).
    pub queue: String,
    /// `P{NAME}:alive`: each waiter's heartbeat (and `w:ID` while it is woken, `g:ID`
    /// what a release needs to grant it a slot).
    pub alive: String,
    /// `P{NAME}:slots`: the N of `--slots` of the semaphore's live holders, as long as
    /// their longest lease (never written for a plain lock).
    pub limit: String,
    /// `P{NAME}:wake:`: prefix of each waiter's own wake-up channel.
    pub wake_prefix: String,
    /// `P{NAME}:last`: the record of the last run that ended (a hash, see
    /// `scripts/release.lua`), kept as long as the fencing counter.
    pub last: String,
}

impl Keys {
    /// The keys of lock `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Keys {
        let base = format!("{prefix}{{{name}}}");
        Keys {
            fence: format!("{base}:fence"),
            queue: format!("{base}:waiters"),
            alive: format!("{base}:alive"),
            limit: format!("{base}:slots"),
            wake_prefix: format!("{base}:wake:"),
            last: format!("{base}:last"),
            lock: base,
        }
    }

    /// The key of slot `i`: the lock's for slot 0, `P{NAME}#i` for the others.
    pub fn slot(&self, i: u32) -> String {
        match i {
            0 => self.lock.clone(),
            i => format!("{}#{i}", self.lock),
        }
    }

    /// The keys `script` takes for a lock of `slots` slots, in its `KEYS[1..]` order:
    /// its fixed keys, then every slot's key, slot 0 first (`taken`'s key only, when a
    /// renewal or the fencing floor knows the slot held).
    pub fn for_script(&self, script: Script, slots: u32, taken: Option<u32>) -> Vec<String> {
        let mut keys = match script {
            Script::Acquire => vec![
                self.fence.clone(),
                self.queue.clone(),
                self.alive.clone(),
                self.limit.clone(),
            ],
            Script::Renew | Script::Inspect => vec![self.limit.clone()],
            Script::Release => vec![
                self.queue.clone(),
                self.alive.clone(),
                self.limit.clone(),
                self.last.clone(),
                self.fence.clone(),
            ],
            Script::Force => vec![self.queue.clone(), self.alive.clone(), self.limit.clone()],
            Script::LastRun => vec![self.last.clone()],
            Script::FenceFloor => vec![self.fence.clone(), self.slot(taken.unwrap_or(0))],
            Script::Leave => vec![self.queue.clone(), self.alive.clone()],
        };
        debug_assert_eq!(keys.len(), script.fixed_keys(), "{script:?}");
        match (script.takes_slots(), script, taken) {
            (false, _, _) => {}
            (true, Script::Renew, Some(i)) => keys.push(self.slot(i)),
            (true, _, _) => keys.extend((0..slots.max(1)).map(|i| self.slot(i))),
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_digest_is_its_sources() {
        for script in Script::ALL {
            let d = ring::digest::digest(
                &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
                script.source().as_bytes(),
            );
            let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(
                script.sha1(),
                hex,
                "the SHA-1 of the {} script",
                script.name()
            );
        }
    }

    #[test]
    fn keys_share_one_hash_tag() {
        let k = Keys::new("lockrun:", "nightly/backup");
        assert_eq!(k.lock, "lockrun:{nightly/backup}");
        assert_eq!(k.fence, "lockrun:{nightly/backup}:fence");
        assert_eq!(k.limit, "lockrun:{nightly/backup}:slots");
        assert!(k.queue.starts_with("lockrun:{nightly/backup}:"));
        assert!(k.alive.starts_with("lockrun:{nightly/backup}:"));
        assert_eq!(k.wake_prefix, "lockrun:{nightly/backup}:wake:");
    }

    #[test]
    fn slot_0_is_the_plain_lock_and_the_others_share_its_hash_tag() {
        let k = Keys::new("lockrun:", "job");
        assert_eq!(k.slot(0), k.lock);
        assert_eq!(k.slot(2), "lockrun:{job}#2");
        assert_eq!(k.slot(999), "lockrun:{job}#999");
        // Redis Cluster hashes the text between the first '{' and the next '}'.
        let tag = |key: &str| {
            let open = key.find('{').unwrap();
            let close = open + key[open..].find('}').unwrap();
            key[open..=close].to_owned()
        };
        assert_eq!(tag(&k.slot(7)), tag(&k.lock));
        // No lock name holds '#', so no other name's keys can be a slot's.
        let other = Keys::new("lockrun:", "job#2");
        assert_ne!(other.lock, k.slot(2), "a name with '#' is refused anyway");
        for key in [&k.fence, &k.queue, &k.alive, &k.limit] {
            assert!(!key.contains('#'), "{key}");
        }
    }

    #[test]
    fn a_plain_lock_takes_todays_keys() {
        let k = Keys::new("p:", "n");
        assert_eq!(
            k.for_script(Script::Acquire, 1, None),
            [
                "p:{n}:fence",
                "p:{n}:waiters",
                "p:{n}:alive",
                "p:{n}:slots",
                "p:{n}"
            ]
        );
        assert_eq!(
            k.for_script(Script::Release, 1, None),
            [
                "p:{n}:waiters",
                "p:{n}:alive",
                "p:{n}:slots",
                "p:{n}:last",
                "p:{n}:fence",
                "p:{n}"
            ]
        );
        assert_eq!(
            k.for_script(Script::Renew, 1, Some(0)),
            ["p:{n}:slots", "p:{n}"]
        );
        assert_eq!(
            k.for_script(Script::FenceFloor, 1, None),
            ["p:{n}:fence", "p:{n}"]
        );
    }

    #[test]
    fn a_semaphore_passes_every_slot_or_the_one_taken() {
        let k = Keys::new("p:", "n");
        let all = k.for_script(Script::Force, 3, None);
        assert_eq!(&all[3..], ["p:{n}", "p:{n}#1", "p:{n}#2"]);
        assert_eq!(k.for_script(Script::Renew, 3, None).len(), 4);
        assert_eq!(
            k.for_script(Script::Renew, 3, Some(2)),
            ["p:{n}:slots", "p:{n}#2"]
        );
        assert_eq!(k.for_script(Script::FenceFloor, 3, Some(2))[1], "p:{n}#2");
        // Release always looks everywhere: a lost acquire answer leaves the slot unknown.
        assert_eq!(k.for_script(Script::Release, 3, Some(1)).len(), 8);
    }

    #[test]
    fn every_script_takes_as_many_keys_as_it_declares_and_uses() {
        let k = Keys::new("p:", "n");
        for s in Script::ALL {
            let fixed = s.fixed_keys();
            let slots = if s.takes_slots() { 3 } else { 0 };
            assert_eq!(k.for_script(s, 3, None).len(), fixed + slots, "{s:?}");
            let src = s.source();
            if fixed > 0 {
                let used = format!("KEYS[{fixed}]");
                assert!(src.contains(&used), "{s:?} never uses {used}");
            }
            // Slot keys are reached by a computed index, never by a constant one.
            assert!(!src.contains(&format!("KEYS[{}]", fixed + 1)), "{s:?}");
            if s.takes_slots() {
                assert!(src.contains("#KEYS"), "{s:?} does not count its slot keys");
            }
        }
    }

    #[test]
    fn the_scripts_that_free_a_slot_carry_the_wake_helper() {
        for s in Script::ALL {
            let frees = matches!(s, Script::Release | Script::Force);
            assert_eq!(s.source().contains("local function wake("), frees, "{s:?}");
            assert_eq!(s.source().matches("wake(").count() > 1, frees, "{s:?}");
        }
    }

    #[test]
    fn the_scripts_that_set_an_expiry_check_their_arguments_first() {
        for s in Script::ALL {
            let src = s.source();
            let expires = src.contains("PEXPIRE") || src.contains("'PX'");
            if matches!(s, Script::Force | Script::Leave | Script::LastRun) {
                assert!(!expires, "{s:?} sets an expiry without the checks");
                continue;
            }
            assert!(src.contains("local function bad_ms"), "{s:?}");
            // In the script proper, the checks come before the first write.
            let body = src
                .replace(include_str!("scripts/args.lua"), "")
                .replace(include_str!("scripts/limit.lua"), "")
                .replace(include_str!("scripts/evict.lua"), "")
                .replace(include_str!("scripts/grant.lua"), "")
                .replace(include_str!("scripts/wake.lua"), "");
            let first = |words: &[&str]| words.iter().filter_map(|w| body.find(w)).min();
            let check = first(&["bad_ms(", "error_reply("]);
            let write = first(&[
                "'SET'",
                "'HSET'",
                "'ZADD'",
                "'PEXPIRE'",
                "'DEL'",
                "cover_limit(",
                "wake(",
            ]);
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
        assert!(args.contains(&format!("local WAKE_GRACE_MS = {}\n", ms(WAKE_GRACE))));
    }
}
