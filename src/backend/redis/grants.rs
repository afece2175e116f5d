//! The waiter's side of a grant (`scripts/grant.lua`): a release may give the slot it
//! frees to the waiter it would wake, and say so on that waiter's wake-up channel
//! (`granted FENCE SLOT TOKEN16`), so that the next holder's command starts one round
//! trip sooner. Part of [`super`].
//!
//! The lease of a grant counts from the moment this waiter sent its last attempt that
//! found the lock busy: the grant was made after that attempt reached the server (the
//! slot was someone else's then), so the server's expiry (the TTL from the grant) is
//! later than the same TTL from that moment. A grant whose lease has less than half of
//! the TTL left by that count, or one for another token, is not used: the next attempt
//! asks the server, which finds the slot held with this waiter's token and gives it a
//! fresh lease (`scripts/acquire.lua`); so does a waiter whose grant message was lost.

use std::sync::Mutex;
use std::time::Duration;

use crate::clock::BootInstant;

/// A slot granted to this waiter, as its message says.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    fence: u64,
    slot: u32,
    /// The first 16 characters of the token the slot was granted to.
    token16: String,
}

/// What a waiter keeps about grants. Each lock is held for no await.
#[derive(Debug, Default)]
pub(super) struct Grants {
    /// The token and send time of the last attempt that found the lock busy.
    asked: Mutex<Option<(String, BootInstant)>>,
    /// The grant heard and not yet taken.
    heard: Mutex<Option<Grant>>,
}

/// A taken grant: the fencing token, the slot, and when its lease began at the latest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Taken {
    pub fence: u64,
    pub slot: u32,
    pub since: BootInstant,
}

impl Grants {
    /// The attempt with `token`, sent at `at`, found the lock busy.
    pub fn asked(&self, token: &str, at: BootInstant) {
        *self.asked.lock().unwrap_or_else(|e| e.into_inner()) = Some((token.to_owned(), at));
    }

    /// The token of the last attempt that found the lock busy, if any: the one a grant
    /// may have been made to.
    pub fn last_token(&self) -> Option<String> {
        let asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        asked.as_ref().map(|(token, _)| token.clone())
    }

    /// A wake-up message: keeps the grant it carries, if any (a plain wake-up says
    /// `released`).
    pub fn heard(&self, payload: &[u8]) {
        if let Some(grant) = parse(payload) {
            *self.heard.lock().unwrap_or_else(|e| e.into_inner()) = Some(grant);
        }
    }

    /// The grant heard for `token`, if its lease of `ttl` (counted as the module says)
    /// still has at least half of it left at `now`. Taken once; a grant not used is
    /// forgotten (the server gives it back at the next attempt, see the module).
    pub fn take(&self, token: &str, ttl: Duration, now: BootInstant) -> Option<Taken> {
        let grant = self
            .heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        let asked = self.asked.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (asked_token, since) = asked?;
        let ours = asked_token == token && token.starts_with(&grant.token16);
        (ours && grant.token16.len() == 16 && now < since + ttl / 2).then_some(Taken {
            fence: grant.fence,
            slot: grant.slot,
            since,
        })
    }
}

/// Reads `granted FENCE SLOT TOKEN16`; anything else is no grant.
fn parse(payload: &[u8]) -> Option<Grant> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut words = text.strip_prefix("granted ")?.split(' ');
    let fence = digits(words.next()?)?.parse().ok()?;
    let slot = digits(words.next()?)?.parse().ok()?;
    let token16 = words.next()?.to_owned();
    if words.next().is_some() || fence == 0 {
        return None;
    }
    Some(Grant {
        fence,
        slot,
        token16,
    })
}

/// `w` if it is digits only (`parse` alone would take a sign).
fn digits(w: &str) -> Option<&str> {
    (!w.is_empty() && w.bytes().all(|b| b.is_ascii_digit())).then_some(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn at(ms: u64) -> BootInstant {
        BootInstant::from_since_boot(Duration::from_millis(ms))
    }

    #[test]
    fn a_grant_message_is_read_and_anything_else_is_not() {
        let g = parse(b"granted 1700000000123456 2 0123456789abcdef").unwrap();
        assert_eq!(
            (g.fence, g.slot, g.token16.as_str()),
            (1700000000123456, 2, "0123456789abcdef")
        );
        for bad in [
            &b"released"[..],
            b"granted",
            b"granted 12 0",
            b"granted x 0 0123456789abcdef",
            b"granted 12 -1 0123456789abcdef",
            b"granted 0 0 0123456789abcdef",
            b"granted 12 0 0123456789abcdef more",
            b"granted +12 0 0123456789abcdef",
            b"\xffgranted 12 0 0123456789abcdef",
        ] {
            assert_eq!(parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_grant_counts_its_lease_from_the_last_busy_attempt() {
        let g = Grants::default();
        g.asked(TOKEN, at(1_000));
        g.heard(b"granted 77 0 0123456789abcdef");
        let ttl = Duration::from_secs(30);
        assert_eq!(
            g.take(TOKEN, ttl, at(1_500)),
            Some(Taken {
                fence: 77,
                slot: 0,
                since: at(1_000)
            })
        );
        assert_eq!(g.take(TOKEN, ttl, at(1_500)), None, "taken once");
    }

    #[test]
    fn a_grant_with_less_than_half_its_lease_left_or_for_another_token_is_not_taken() {
        let ttl = Duration::from_secs(30);
        let g = Grants::default();
        g.asked(TOKEN, at(1_000));
        g.heard(b"granted 77 0 0123456789abcdef");
        assert_eq!(g.take(TOKEN, ttl, at(16_000)), None, "half the lease gone");
        g.heard(b"granted 77 0 fedcba9876543210");
        assert_eq!(g.take(TOKEN, ttl, at(1_500)), None, "another token's grant");
        g.heard(b"granted 77 0 0123456789abcdef");
        assert_eq!(
            g.take("ffff", ttl, at(1_500)),
            None,
            "a later attempt's token"
        );
        let never_asked = Grants::default();
        never_asked.heard(b"granted 77 0 0123456789abcdef");
        assert_eq!(
            never_asked.take(TOKEN, ttl, at(1_500)),
            None,
            "no busy attempt"
        );
    }
}
