//! Counting the servers' answers for Redlock: which slot a majority can hold, the
//! votes for it, another N seen, and the holders grouped by slot and token (pure
//! functions); the quorum's refusal and `list`'s names. Part of [`super`].

use std::time::Duration;

use super::super::replies::{AcquireReply, HoldersReply, SlotHolder};
use super::super::RedisBackend;
use super::RedlockBackend;
use crate::backend::{BackendError, Holder, RunRecord};

/// The free slots each server saw when it took one (`None`: it took none).
pub fn free_maps(answers: &[Result<AcquireReply, BackendError>]) -> Vec<Option<&[bool]>> {
    answers
        .iter()
        .map(|a| match a {
            Ok(AcquireReply::Acquired { free, .. }) => Some(free.as_slice()),
            _ => None,
        })
        .collect()
}

/// The lowest slot that was free on at least `quorum` servers, if any: the slot a
/// holder takes on a majority. The servers' maps may differ in length only if their
/// answers do; a slot missing from a map is not free there.
pub fn choose_slot(free: &[Option<&[bool]>], quorum: usize) -> Option<u32> {
    let longest = free.iter().flatten().map(|m| m.len()).max()?;
    (0..longest)
        .find(|&s| {
            let free_on = free.iter().flatten().filter(|m| m.get(s) == Some(&true));
            free_on.count() >= quorum
        })
        .and_then(|s| u32::try_from(s).ok())
}

/// The fencing tokens of the servers that hold `slot` for us.
pub fn votes(answers: &[Result<AcquireReply, BackendError>], slot: u32) -> Vec<u64> {
    answers
        .iter()
        .filter_map(|a| match a {
            Ok(AcquireReply::Acquired {
                fencing_token,
                slot: s,
                ..
            }) if *s == slot => Some(*fencing_token),
            _ => None,
        })
        .collect()
}

/// True if a server took another slot than `slot`.
pub fn disagree(answers: &[Result<AcquireReply, BackendError>], slot: u32) -> bool {
    answers
        .iter()
        .any(|a| matches!(a, Ok(AcquireReply::Acquired { slot: s, .. }) if *s != slot))
}

/// The N of a live holder taken with another `--slots`, if a server saw one.
pub fn conflict_in(answers: &[Result<AcquireReply, BackendError>]) -> Option<u32> {
    answers.iter().find_map(|a| match a {
        Ok(AcquireReply::Conflict(theirs)) => Some(*theirs),
        _ => None,
    })
}

/// The N of `--slots`, not `ours`, that a server's holders (or its limit key) show.
pub fn other_n(reply: &HoldersReply, ours: u32) -> Option<u32> {
    match reply.theirs {
        0 => reply
            .holders
            .iter()
            .map(|h| h.holder.slots)
            .find(|&n| n != ours),
        theirs => Some(theirs),
    }
}

/// The servers' holders grouped by slot and token: how many servers hold each, and the
/// holder with the largest fencing token of them (the quorum's, once written back); by
/// slot.
pub fn group<'a>(holders: impl Iterator<Item = &'a SlotHolder>) -> Vec<(usize, Holder)> {
    let mut groups: Vec<(usize, &SlotHolder)> = Vec::new();
    for h in holders {
        let same = |g: &&mut (usize, &SlotHolder)| {
            g.1.holder.slot == h.holder.slot && g.1.token == h.token
        };
        match groups.iter_mut().find(same) {
            Some(g) => {
                g.0 += 1;
                if h.holder.fencing_token > g.1.holder.fencing_token {
                    g.1 = h;
                }
            }
            None => groups.push((1, h)),
        }
    }
    groups.sort_by_key(|(_, h)| h.holder.slot);
    groups
        .into_iter()
        .map(|(count, h)| (count, h.holder.clone()))
        .collect()
}

/// The last run a majority of the servers keeps: the record of the largest fencing
/// token that at least `quorum` servers hold (each server's copy differs only in its
/// own clock's end time; the earliest is shown). A release that reached only a
/// minority is not the quorum's: the run before it is shown then. Its last success is
/// the newest any server keeps.
pub fn majority_record(records: &[Option<RunRecord>], quorum: usize) -> Option<RunRecord> {
    let mut tokens: Vec<u64> = records.iter().flatten().map(|r| r.fencing_token).collect();
    tokens.sort_unstable_by(|a, b| b.cmp(a));
    tokens.dedup();
    tokens
        .into_iter()
        .find_map(|token| {
            let same: Vec<&RunRecord> = records
                .iter()
                .flatten()
                .filter(|r| r.fencing_token == token)
                .collect();
            (same.len() >= quorum)
                .then(|| same.into_iter().min_by_key(|r| r.ended_ms).cloned())
                .flatten()
        })
        .map(|mut r| {
            // The last success is the newest any server keeps (`--once-per` would rather
            // skip a run than repeat one whose success reached a minority).
            r.last_ok = newest_ok(records);
            r
        })
}

/// The newest last success any of `records` keeps.
fn newest_ok(records: &[Option<RunRecord>]) -> Option<crate::backend::LastOk> {
    records
        .iter()
        .flatten()
        .filter_map(|r| r.last_ok.clone())
        .max_by_key(|ok| ok.started_ms)
}

impl RedlockBackend {
    /// Explains a missing quorum from the answers' errors.
    pub(super) fn no_quorum<T>(
        &self,
        what: &str,
        ok: usize,
        answers: &[Result<T, BackendError>],
    ) -> BackendError {
        let first_error = answers.iter().find_map(|a| a.as_ref().err());
        let refused = answers
            .iter()
            .filter(|a| a.as_ref().is_err_and(BackendError::is_refusal))
            .count();
        let detail = first_error.map(|e| format!(" ({e})")).unwrap_or_default();
        let msg = format!(
            "only {ok} of {} Redis servers {what}; a majority of {} is needed{detail}",
            self.nodes.len(),
            self.quorum()
        );
        if refused > self.nodes.len() - self.quorum() {
            BackendError::Refused(msg)
        } else {
            BackendError::Unavailable(msg)
        }
    }

    /// `lockrun list`: the names any server that answered has keys of (each is then
    /// asked as `status` asks, by majority), once a majority answered.
    pub(super) async fn quorum_names(&self) -> Result<Vec<String>, BackendError> {
        let answers = self
            .on_all(Duration::from_secs(5), RedisBackend::scan_names)
            .await;
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered < self.quorum() {
            return Err(self.no_quorum("answered", answered, &answers));
        }
        let mut names: Vec<String> = answers.into_iter().flatten().flatten().collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quorums_last_run_is_the_newest_a_majority_keeps() {
        let rec = |fence: u64, ended_ms: u64| {
            Some(RunRecord {
                fencing_token: fence,
                ended_ms,
                ..RunRecord::default()
            })
        };
        let got =
            |r: &[Option<RunRecord>]| majority_record(r, 2).map(|r| (r.fencing_token, r.ended_ms));
        assert_eq!(got(&[rec(7, 30), rec(7, 20), rec(5, 10)]), Some((7, 20)));
        // Token 9's release reached one server only: the quorum still says 7.
        assert_eq!(got(&[rec(9, 50), rec(7, 20), rec(7, 25)]), Some((7, 20)));
        assert_eq!(got(&[rec(9, 50), None, rec(7, 25)]), None);
        assert_eq!(got(&[None, None, None]), None);
        let ok = |started_ms: u64| crate::backend::LastOk {
            started_ms,
            host: "h".into(),
        };
        let with_ok = |fence: u64, started: u64| {
            Some(RunRecord {
                fencing_token: fence,
                last_ok: Some(ok(started)),
                ..RunRecord::default()
            })
        };
        let r = majority_record(&[with_ok(7, 10), with_ok(7, 10), with_ok(9, 40)], 2);
        assert_eq!(r.unwrap().last_ok, Some(ok(40)));
    }

    fn map(s: &str) -> Vec<bool> {
        s.chars().map(|c| c == '1').collect()
    }

    #[test]
    fn the_slot_taken_is_the_lowest_free_on_a_majority() {
        let (a, b, c) = (map("011"), map("001"), map("111"));
        // Slot 0 is free on one server only; slot 1 on two of three.
        let free = [Some(&a[..]), Some(&b[..]), Some(&c[..])];
        assert_eq!(choose_slot(&free, 2), Some(1));
        assert_eq!(choose_slot(&free, 3), Some(2));
        // A busy or silent server has nothing free.
        assert_eq!(choose_slot(&[Some(&a[..]), None, None], 2), None);
        assert_eq!(choose_slot(&[None, None, None], 2), None);
        // Every slot free on a different server: no majority anywhere.
        let (x, y, z) = (map("100"), map("010"), map("001"));
        assert_eq!(
            choose_slot(&[Some(&x[..]), Some(&y[..]), Some(&z[..])], 2),
            None
        );
    }

    fn took(slot: u32, fence: u64) -> Result<AcquireReply, BackendError> {
        Ok(AcquireReply::Acquired {
            fencing_token: fence,
            slot,
            free: vec![true; 3],
        })
    }

    #[test]
    fn votes_count_only_the_slot_chosen() {
        let answers = [
            took(1, 10),
            took(0, 11),
            took(1, 12),
            Err(BackendError::Unavailable("down".into())),
            Ok(AcquireReply::Conflict(2)),
        ];
        assert_eq!(votes(&answers, 1), [10, 12]);
        assert!(disagree(&answers, 1));
        assert!(!disagree(&answers[..1], 1));
        assert_eq!(conflict_in(&answers), Some(2));
        assert_eq!(conflict_in(&answers[..3]), None);
    }

    fn slot_holder(slot: u32, token: &str, fence: u64, slots: u32) -> SlotHolder {
        SlotHolder {
            holder: Holder {
                slot,
                slots,
                fencing_token: fence,
                ..Holder::default()
            },
            token: token.into(),
        }
    }

    #[test]
    fn holders_are_grouped_by_slot_and_token_with_the_largest_fence() {
        let all = [
            slot_holder(2, "a", 5, 3),
            slot_holder(0, "b", 7, 3),
            slot_holder(2, "a", 9, 3),
            slot_holder(2, "c", 8, 3),
            slot_holder(0, "b", 6, 3),
        ];
        let got: Vec<(usize, u32, u64)> = group(all.iter())
            .into_iter()
            .map(|(n, h)| (n, h.slot, h.fencing_token))
            .collect();
        assert_eq!(got, [(2, 0, 7), (2, 2, 9), (1, 2, 8)]);
    }

    #[test]
    fn another_n_shows_in_the_limit_key_or_a_holder() {
        let reply = |theirs, holders| HoldersReply { theirs, holders };
        assert_eq!(other_n(&reply(0, vec![slot_holder(0, "a", 1, 3)]), 3), None);
        assert_eq!(
            other_n(&reply(0, vec![slot_holder(0, "a", 1, 1)]), 3),
            Some(1)
        );
        assert_eq!(other_n(&reply(5, vec![]), 3), Some(5));
    }
}
