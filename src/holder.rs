//! How a lock's holder is shown: in `lockrun status` (text and JSON), in
//! `release --force`'s line and in the busy line of a run.
//!
//! A backend fills a [`Holder`] with what it could read; a description it could not
//! parse leaves empty fields (no host, pid 0, start time 0, fencing token 0), values a
//! lockrun never writes. Those are unknown, not facts: the text leaves them out and
//! JSON gives `null`, so no one reads "pid 0 since 1970". What a backend holds is
//! untrusted: the text escapes control characters in the host name (JSON escapes its
//! strings itself) and shows a start time past the year 9999 as invalid, never panics.
//! Pure functions; depends on [`crate::backend::Holder`] and `units` only.

use std::time::Duration;

use serde_json::{json, Value};

use crate::backend::{Holder, RunRecord};
use crate::units::{ms, printable, rfc3339_ms};

/// The fields of a [`Holder`] that are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Known {
    /// Host name of the holder.
    pub host: Option<String>,
    /// Process id of the holder's lockrun.
    pub pid: Option<u32>,
    /// Acquisition time, milliseconds since the Unix epoch (server clock).
    pub since_ms: Option<u64>,
    /// The acquisition time as RFC 3339 (seconds, UTC); `None` if unknown or past the
    /// year 9999 (then `since_ms` is still given).
    pub since: Option<String>,
    /// The fencing token of the holder's acquisition (never 0 when known).
    pub fencing_token: Option<u64>,
    /// Lease time left.
    pub ttl_left: Duration,
}

impl Known {
    /// What is known of `h`.
    pub fn of(h: &Holder) -> Known {
        Known {
            host: (!h.host.is_empty()).then(|| h.host.clone()),
            pid: (h.pid != 0).then_some(h.pid),
            since_ms: (h.since_ms != 0).then_some(h.since_ms),
            since: (h.since_ms != 0).then(|| h.since()).flatten(),
            fencing_token: (h.fencing_token != 0).then_some(h.fencing_token),
            ttl_left: h.ttl_left,
        }
    }

    /// Who holds it and since when: `held by web-1 pid 42 since 2024-05-01T10:00:00Z`,
    /// `held by pid 42`, `held (holder unknown)`.
    pub fn held(&self) -> String {
        let host = self.host.as_deref().map(printable);
        let who = match (host, self.pid) {
            (Some(host), Some(pid)) => format!("held by {host} pid {pid}"),
            (Some(host), None) => format!("held by {host}"),
            (None, Some(pid)) => format!("held by pid {pid}"),
            (None, None) => "held (holder unknown)".to_owned(),
        };
        match (&self.since, self.since_ms) {
            (Some(since), _) => format!("{who} since {since}"),
            (None, Some(ms)) => format!("{who} since an invalid time ({ms} ms after 1970)"),
            (None, None) => who,
        }
    }

    /// [`Known::held`] with the fencing token and the lease left:
    /// `held by web-1 pid 42 since …, fencing token 7, 2s left`.
    pub fn summary(&self) -> String {
        let token = self
            .fencing_token
            .map(|t| format!(", fencing token {t}"))
            .unwrap_or_default();
        format!("{}{token}, {} left", self.held(), ms(self.ttl_left))
    }
}

/// A time from the store as RFC 3339, or the raw number when no calendar can write it.
fn time_or_raw(ms: u64) -> String {
    rfc3339_ms(ms).unwrap_or_else(|| format!("an invalid time ({ms} ms after 1970)"))
}

/// The last run, for the text of `status` and `list`: `web-1 pid 42, fencing token 7,
/// slot 1, 2024-05-01T10:00:00Z to 2024-05-01T10:00:05Z, exit status 3 (exited)`.
pub fn last_run_text(r: &RunRecord) -> String {
    let slot = match r.slot {
        0 => String::new(),
        n => format!(", slot {n}"),
    };
    format!(
        "{} pid {}, fencing token {}{slot}, {} to {}, exit status {} ({})",
        printable(&r.host),
        r.pid,
        r.fencing_token,
        time_or_raw(r.started_ms),
        time_or_raw(r.ended_ms),
        r.exit_status,
        printable(&r.ended_by)
    )
}

/// The last run as `status --json` and `list --json` give it (`null` when none).
pub fn last_run_json(r: Option<&RunRecord>) -> Value {
    let Some(r) = r else { return Value::Null };
    json!({
        "host": r.host, "pid": r.pid, "fencing_token": r.fencing_token, "slot": r.slot,
        "started": rfc3339_ms(r.started_ms), "ended": rfc3339_ms(r.ended_ms),
        "started_ms": r.started_ms, "ended_ms": r.ended_ms,
        "exit_status": r.exit_status, "ended_by": r.ended_by,
        "last_ok": r.last_ok.as_ref().map(|ok| json!({
            "host": ok.host, "started": rfc3339_ms(ok.started_ms), "started_ms": ok.started_ms,
        })),
    })
}

/// The `lockrun status` text for lock `name` of `slots` slots held by `holders`
/// (sorted by slot; empty when free), then its last run (an indented line) where the
/// backend keeps one: one line for a plain lock, as before semaphores; with
/// `--slots N`, a count, then one indented line per holder.
pub fn status_text(name: &str, slots: u32, holders: &[Holder], last: Option<&RunRecord>) -> String {
    let mut out = holders_text(name, slots, holders);
    if let Some(r) = last {
        out.push_str(&format!("\n  last run: {}", last_run_text(r)));
        if let Some(ok) = &r.last_ok {
            let (at, host) = (time_or_raw(ok.started_ms), printable(&ok.host));
            out.push_str(&format!("\n  last success: started {at} on {host}"));
        }
    }
    out
}

fn holders_text(name: &str, slots: u32, holders: &[Holder]) -> String {
    match (slots, holders) {
        (1, []) => format!("{name}: free"),
        (1, [h, ..]) => format!("{name}: {}", Known::of(h).summary()),
        (n, all) => {
            let mut out = format!("{name}: {} of {n} slots held", all.len());
            for h in all {
                out.push_str(&format!("\n  slot {}: {}", h.slot, Known::of(h).summary()));
            }
            out
        }
    }
}

/// The `lockrun status --json` object for lock `name` of `slots` slots held by
/// `holders` (sorted by slot; empty when free). The top-level holder fields are
/// those of the lowest slot held (the only one of a plain lock); `holders` lists
/// every one, with its slot.
pub fn status_json(name: &str, slots: u32, holders: &[Holder], last: Option<&RunRecord>) -> Value {
    let mut v = holders_json(name, slots, holders);
    v["last_run"] = last_run_json(last);
    v
}

fn holders_json(name: &str, slots: u32, holders: &[Holder]) -> Value {
    let each: Vec<Value> = holders
        .iter()
        .map(|h| {
            let k = Known::of(h);
            json!({
                "slot": h.slot, "fencing_token": k.fencing_token,
                "ttl_ms": k.ttl_left.as_millis() as u64, "host": k.host, "pid": k.pid,
                "since": k.since, "since_ms": k.since_ms,
            })
        })
        .collect();
    match holders.first().map(Known::of) {
        Some(k) => json!({
            "name": name, "held": true, "fencing_token": k.fencing_token,
            "ttl_ms": k.ttl_left.as_millis() as u64, "host": k.host, "pid": k.pid,
            "since": k.since, "since_ms": k.since_ms, "slots": slots, "holders": each,
        }),
        None => json!({
            "name": name, "held": false, "fencing_token": null, "ttl_ms": null,
            "host": null, "pid": null, "since": null, "since_ms": null,
            "slots": slots, "holders": each,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Holder {
        Holder {
            host: "web-1".into(),
            pid: 42,
            since_ms: 1_714_557_600_000,
            fencing_token: 7,
            ttl_left: Duration::from_millis(2000),
            ..Holder::default()
        }
    }

    #[test]
    fn a_full_holder_is_shown_whole() {
        assert_eq!(
            Known::of(&full()).summary(),
            "held by web-1 pid 42 since 2024-05-01T10:00:00Z, fencing token 7, 2s left"
        );
    }

    #[test]
    fn an_unreadable_holder_shows_only_what_is_known() {
        let empty = Holder {
            fencing_token: 7,
            ttl_left: Duration::from_millis(2000),
            ..Holder::default()
        };
        assert_eq!(
            Known::of(&empty).summary(),
            "held (holder unknown), fencing token 7, 2s left"
        );
        assert_eq!(
            Known::of(&Holder::default()).summary(),
            "held (holder unknown), 0s left"
        );
        let pid_only = Holder {
            pid: 42,
            ..Holder::default()
        };
        assert_eq!(Known::of(&pid_only).held(), "held by pid 42");
        let host_since = Holder {
            host: "web-1".into(),
            since_ms: 1_714_557_600_000,
            ..Holder::default()
        };
        assert_eq!(
            Known::of(&host_since).held(),
            "held by web-1 since 2024-05-01T10:00:00Z"
        );
    }

    #[test]
    fn a_time_past_the_year_9999_is_shown_as_invalid() {
        let far = Holder {
            since_ms: 253_402_300_800_000,
            ..full()
        };
        assert_eq!(
            Known::of(&far).held(),
            "held by web-1 pid 42 since an invalid time (253402300800000 ms after 1970)"
        );
        let v = status_json(
            "job",
            1,
            &[Holder {
                since_ms: u64::MAX,
                ..full()
            }],
            None,
        );
        assert!(v["since"].is_null(), "{v}");
        assert_eq!(v["since_ms"], u64::MAX);
    }

    #[test]
    fn a_host_with_control_characters_is_escaped_in_text_only() {
        let forged = Holder {
            host: "h\nlockrun: acquired lock \"job\"\u{1b}[2J".into(),
            ..full()
        };
        let text = status_text("job", 1, std::slice::from_ref(&forged), None);
        assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text}");
        assert!(
            text.starts_with("job: held by h\\nlockrun: acquired lock \"job\"\\u{1b}[2J pid 42")
        );
        assert_eq!(
            status_json("job", 1, std::slice::from_ref(&forged), None)["host"],
            forged.host.as_str()
        );
    }

    #[test]
    fn json_gives_null_for_what_is_unknown() {
        let v = status_json("job", 1, &[Holder::default()], None);
        assert_eq!(v["held"], true);
        for key in ["host", "pid", "since", "since_ms", "fencing_token"] {
            assert!(v[key].is_null(), "{key}: {v}");
        }
        assert_eq!(v["ttl_ms"], 0);
        let v = status_json("job", 1, &[full()], None);
        assert_eq!(v["host"], "web-1");
        assert_eq!(v["pid"], 42);
        assert_eq!(v["since"], "2024-05-01T10:00:00Z");
        assert_eq!(v["since_ms"], 1_714_557_600_000u64);
        assert_eq!(v["fencing_token"], 7);
        assert_eq!(v["ttl_ms"], 2000);
    }

    #[test]
    fn the_last_run_is_a_line_of_its_own_and_an_object_in_json() {
        let last = RunRecord {
            host: "web-2\u{1b}[2J".into(),
            pid: 9,
            fencing_token: 8,
            slot: 0,
            started_ms: 1_714_557_600_000,
            ended_ms: 1_714_557_605_000,
            exit_status: 3,
            ended_by: "exited".into(),
            last_ok: None,
        };
        assert_eq!(
            status_text("job", 1, &[], Some(&last)),
            "job: free\n  last run: web-2\\u{1b}[2J pid 9, fencing token 8, \
             2024-05-01T10:00:00Z to 2024-05-01T10:00:05Z, exit status 3 (exited)"
        );
        let v = status_json("job", 1, &[full()], Some(&last));
        assert_eq!(v["held"], true);
        let l = &v["last_run"];
        assert_eq!(
            (l["fencing_token"].clone(), l["exit_status"].clone()),
            (json!(8), json!(3))
        );
        assert_eq!(l["started"], "2024-05-01T10:00:00Z");
        assert_eq!(l["ended"], "2024-05-01T10:00:05Z");
        assert_eq!(l["host"], "web-2\u{1b}[2J", "JSON escapes it itself");
        assert!(status_json("job", 1, &[], None)["last_run"].is_null());
        let far = RunRecord {
            slot: 2,
            ended_ms: u64::MAX,
            ..last
        };
        assert!(last_run_text(&far).contains(", slot 2, "));
        assert!(last_run_text(&far).contains("to an invalid time"));
        assert!(last_run_json(Some(&far))["ended"].is_null());
        assert!(last_run_json(Some(&far))["last_ok"].is_null());
        let ok = RunRecord {
            last_ok: Some(crate::backend::LastOk {
                started_ms: 1_714_550_400_000,
                host: "web-1".into(),
            }),
            ..far
        };
        assert!(status_text("job", 1, &[], Some(&ok))
            .ends_with("\n  last success: started 2024-05-01T08:00:00Z on web-1"));
        let j = last_run_json(Some(&ok));
        assert_eq!(j["last_ok"]["host"], "web-1");
        assert_eq!(j["last_ok"]["started"], "2024-05-01T08:00:00Z");
        assert_eq!(j["last_ok"]["started_ms"], 1_714_550_400_000u64);
    }

    #[test]
    fn json_of_a_free_lock() {
        let v = status_json("job", 1, &[], None);
        assert_eq!(v["held"], false);
        assert_eq!(v["name"], "job");
        assert!(v["host"].is_null() && v["fencing_token"].is_null());
    }

    #[test]
    fn a_semaphore_lists_every_holder_by_slot() {
        let second = Holder {
            slot: 2,
            slots: 3,
            fencing_token: 9,
            ..full()
        };
        let first = Holder { slots: 3, ..full() };
        let text = status_text("job", 3, &[first.clone(), second.clone()], None);
        assert_eq!(
            text,
            "job: 2 of 3 slots held\n  slot 0: held by web-1 pid 42 since \
             2024-05-01T10:00:00Z, fencing token 7, 2s left\n  slot 2: held by web-1 pid 42 \
             since 2024-05-01T10:00:00Z, fencing token 9, 2s left"
        );
        assert_eq!(status_text("job", 3, &[], None), "job: 0 of 3 slots held");
        assert_eq!(status_text("job", 1, &[], None), "job: free");
        let v = status_json("job", 3, &[first, second], None);
        assert_eq!(
            (v["held"].clone(), v["slots"].clone()),
            (json!(true), json!(3))
        );
        assert_eq!(v["fencing_token"], 7);
        let slots: Vec<_> = v["holders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["slot"].clone())
            .collect();
        assert_eq!(slots, [json!(0), json!(2)]);
        assert_eq!(v["holders"][1]["fencing_token"], 9);
        assert_eq!(status_json("job", 3, &[], None)["holders"], json!([]));
    }
}
