//! The key of a lock's row: `PREFIX{NAME}`, injective by construction. Pure; part of
//! [`super`].
//!
//! A lock name is 1 to 200 bytes of `A-Z a-z 0-9 . _ - : /` (`name::LockName`): it
//! holds no `{` or `}`. So in a key `PREFIX{NAME}` (and in a semaphore's rows
//! `PREFIX{NAME}#i` and `PREFIX{NAME}#slots`, the waiters' `PREFIX{NAME}#queue` and
//! the run record's `PREFIX{NAME}#last`, whose suffixes hold no brace either) the
//! last `}` closes the name, the last `{` before it opens it, and what comes before is
//! the prefix, whatever bytes the prefix holds: two different (prefix, name) pairs, or
//! rows of different slots, never share a key. Redis writes its keys the same way.
//!
//! Lockrun 0.x before this layout wrote `PREFIXNAME`, which is not injective
//! (`lockrun:a:` + `b` and `lockrun:` + `a:b` were one lock). A row of that layout is
//! never a row of this one unless its prefix held a `}`: every key here ends with `}`,
//! `}#i`, `}#slots`, `}#queue` or `}#last`. While older lockruns may still hold locks, a plain acquisition
//! also looks at [`legacy_key`] (read only).

/// The key of lock `name` under `prefix`: slot 0's row, the plain lock's.
pub(super) fn lock_key(prefix: &str, name: &str) -> String {
    format!("{prefix}{{{name}}}")
}

/// The lock name of row key `key` under `prefix`: one of [`lock_key`]'s, a slot's,
/// the limit's, the queue's or the record's row; `None` for any other key.
pub(super) fn name_of(prefix: &str, key: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let (name, suffix) = rest.rsplit_once('}')?;
    let known = match suffix.strip_prefix('#') {
        None => suffix.is_empty(),
        Some(s) => {
            matches!(s, "slots" | "queue" | "last")
                || (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        }
    };
    (known && !name.contains(['{', '}'])).then(|| name.to_owned())
}

/// The key lockrun gave lock `name` under `prefix` before this layout, `PREFIXNAME`:
/// a plain acquisition treats a live row there as a holder, so a lock an older
/// lockrun holds is busy for this one (an older lockrun does not see ours). It may be
/// the old key of another pair too: then that pair's holder makes this one wait, never
/// the reverse, and nothing else reads or writes it.
pub(super) fn legacy_key(prefix: &str, name: &str) -> String {
    format!("{prefix}{name}")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::records::record_key;
    use super::super::slots::{limit_key, queue_key, slot_key};
    use super::*;

    /// Every row key of (prefix, name) for a semaphore of `slots`, with its slot
    /// (`None`: the limit, queue and record rows).
    fn rows(prefix: &str, name: &str, slots: u32) -> Vec<(String, Option<u32>)> {
        let key = lock_key(prefix, name);
        let mut all: Vec<_> = (0..slots).map(|i| (slot_key(&key, i), Some(i))).collect();
        for other in [limit_key(&key), queue_key(&key), record_key(&key)] {
            all.push((other, None));
        }
        all
    }

    #[test]
    fn every_row_of_a_name_gives_the_name_back_and_other_keys_none() {
        for (prefix, name) in [("lockrun:", "job"), ("a{b}#1", "x/y:z"), ("", "last")] {
            for (key, _) in rows(prefix, name, 3) {
                assert_eq!(name_of(prefix, &key).as_deref(), Some(name), "{key}");
            }
        }
        assert_eq!(name_of("lockrun:", "lockrun:job"), None);
        assert_eq!(name_of("lockrun:", "lockrun:{job}#x"), None);
        assert_eq!(name_of("lockrun:", "lockrun:{job}#"), None);
        assert_eq!(name_of("lockrun:", "other:{job}"), None);
    }

    #[test]
    fn the_name_is_braced_after_the_prefix() {
        assert_eq!(lock_key("lockrun:", "job"), "lockrun:{job}");
        assert_eq!(lock_key("", "a/b"), "{a/b}");
        assert_eq!(lock_key("lockrun:teamA:", "job"), "lockrun:teamA:{job}");
        assert_eq!(lock_key("lockrun:", "teamA:job"), "lockrun:{teamA:job}");
    }

    #[test]
    fn no_two_prefix_and_name_pairs_share_a_row() {
        // Prefixes with the bytes the keys use as separators, and pairs that the old
        // layout (`PREFIXNAME`) merged.
        let prefixes = [
            "",
            "lockrun:",
            "lockrun:teamA:",
            "lockrun:teamA",
            "{",
            "}",
            "{}",
            "a{",
            "a}",
            "a{b}",
            "a{b}#",
            "a{b}#1",
            "a{b}%",
            "#",
            "%",
            "#slots",
            "a{b}#last",
            "p#1",
            "}#1{",
            "é{",
        ];
        let names = [
            "job",
            "teamA:job",
            "A:job",
            "b",
            "b}",
            "1",
            "slots",
            "last",
            "a",
            "a:b",
            "x/y",
            ".",
        ];
        let mut seen: HashMap<String, (&str, &str, Option<u32>)> = HashMap::new();
        for prefix in prefixes {
            for name in names {
                if crate::name::LockName::parse(name).is_err() {
                    continue;
                }
                for (key, slot) in rows(prefix, name, 12) {
                    if let Some(other) = seen.insert(key.clone(), (prefix, name, slot)) {
                        panic!("{key:?} is {other:?} and ({prefix:?}, {name:?}, {slot:?})");
                    }
                }
            }
        }
        // The pair of issue 13: two locks now, one before.
        assert_ne!(
            lock_key("lockrun:teamA:", "job"),
            lock_key("lockrun:", "teamA:job")
        );
        assert!(crate::name::LockName::parse("b}").is_err());
        assert!(crate::name::LockName::parse("{b").is_err());
    }
}
