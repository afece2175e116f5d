//! The least-privilege Redis ACL rule for lockrun's user, written once here for the
//! docs/backends.md, the tests and the error lines that name a missing permission. Part of
//! [`super`].
//!
//! lockrun sends `EVAL` and, for the acquire and release scripts once the server has
//! them, `EVALSHA`
//! (every step is a script, see `scripts.rs`; a user without `+evalsha` gets every
//! script by `EVAL`) and, to wait with
//! `--wait`, `SUBSCRIBE` to its own wake-up channel; the scripts call the commands in
//! [`SCRIPT_COMMANDS`] on keys under the key prefix and `PUBLISH` to channels under it
//! (`P{NAME}:wake:ID`); the acquire script also reads `INFO memory` (the eviction
//! check; without `+info` the lock is still taken, unchecked, and `-v` says so), and a
//! release asks `PUBSUB NUMSUB` whether the waiter it would grant the lock to listens
//! (without it, the waiter is woken and asks, as before grants).
//! `HELLO` and `AUTH` need no permission. A URL that names a
//! database also sends `SELECT`, and a Sentinel target asks the master `ROLE`: those
//! two are not in the rule, and the error line names them if they are denied. Nor are
//! the two a Redis Cluster may need (see `cluster.rs`): `ASKING`, during a slot
//! migration (a denial is named), and `CLUSTER SLOTS`, asked of the other nodes after
//! one is lost (a denial only leaves those nodes to redirect): add `+asking
//! +cluster|slots` for a Cluster. A unit test keeps [`SCRIPT_COMMANDS`] equal to the
//! commands the Lua sources call.

/// The commands lockrun itself sends once connected (besides `HELLO`/`AUTH`).
pub const CLIENT_COMMANDS: [&str; 3] = ["eval", "evalsha", "subscribe"];

/// The commands lockrun's scripts call, in alphabetical order.
pub const SCRIPT_COMMANDS: [&str; 18] = [
    "del",
    "exists",
    "get",
    "hdel",
    "hexists",
    "hget",
    "hmget",
    "hset",
    "info",
    "pexpire",
    "pttl",
    "publish",
    "pubsub|numsub",
    "set",
    "time",
    "zadd",
    "zrange",
    "zrem",
];

/// `prefix` with the characters Redis glob patterns treat specially escaped, for a
/// key prefix that holds them.
pub(super) fn glob_escape(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The key pattern of every key under `prefix`: `~lockrun:*` for the default one.
pub fn key_pattern(prefix: &str) -> String {
    format!("~{}*", glob_escape(prefix))
}

/// The channel pattern of every wake-up channel under `prefix`: `&lockrun:*`.
pub fn channel_pattern(prefix: &str) -> String {
    format!("&{}*", glob_escape(prefix))
}

/// The permissions of a user that can do everything lockrun does under `prefix`, and
/// nothing else: its keys, its channels, and the commands.
pub fn permissions(prefix: &str) -> String {
    let mut rule = format!("{} {}", key_pattern(prefix), channel_pattern(prefix));
    for c in CLIENT_COMMANDS.iter().chain(&SCRIPT_COMMANDS) {
        rule.push_str(" +");
        rule.push_str(c);
    }
    rule
}

/// The whole `ACL SETUSER` line for user `user` under `prefix`, as docs/backends.md states
/// it: `reset` first, so that the user has exactly these permissions whatever it had
/// before, then `on` and the password (`>PASSWORD`, to be replaced).
pub fn setuser_line(user: &str, prefix: &str) -> String {
    format!(
        "ACL SETUSER {user} reset on >PASSWORD {}",
        permissions(prefix)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::scripts::Script;
    use std::collections::BTreeSet;

    /// Every `redis.call('X'` and `redis.pcall('X'` in `src`, lower case.
    fn called(src: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for opening in ["redis.call('", "redis.pcall('"] {
            for (at, _) in src.match_indices(opening) {
                let rest = &src[at + opening.len()..];
                let name = rest[..rest.find('\'').expect("a closing quote")].to_ascii_lowercase();
                // A command with subcommands is allowed one of them: `pubsub|numsub`.
                let sub = rest
                    .strip_prefix("PUBSUB', '")
                    .and_then(|r| r.find('\'').map(|end| &r[..end]));
                match sub {
                    Some(sub) => out.insert(format!("{name}|{}", sub.to_ascii_lowercase())),
                    None => out.insert(name),
                };
            }
        }
        out
    }

    #[test]
    fn the_rule_lists_exactly_the_commands_the_scripts_call() {
        let mut all = BTreeSet::new();
        for s in Script::ALL {
            all.extend(called(s.source()));
        }
        let listed: BTreeSet<String> = SCRIPT_COMMANDS.iter().map(|c| c.to_string()).collect();
        assert_eq!(all, listed);
        let mut sorted = SCRIPT_COMMANDS;
        sorted.sort_unstable();
        assert_eq!(sorted, SCRIPT_COMMANDS, "keep them sorted");
    }

    #[test]
    fn the_default_rule_reads_as_the_readme_states_it() {
        assert_eq!(
            setuser_line("lockrun", "lockrun:"),
            "ACL SETUSER lockrun reset on >PASSWORD ~lockrun:* &lockrun:* +eval +evalsha +subscribe \
             +del +exists +get +hdel +hexists +hget +hmget +hset +info +pexpire +pttl \
             +publish +pubsub|numsub +set +time +zadd +zrange +zrem"
        );
    }

    #[test]
    fn a_prefix_with_glob_characters_is_escaped() {
        assert_eq!(key_pattern("a*b?[c]\\:"), "~a\\*b\\?\\[c\\]\\\\:*");
        assert_eq!(channel_pattern("jobs:"), "&jobs:*");
        assert_eq!(key_pattern(""), "~*");
    }
}
