//! The history checker of the soak. It takes what the sections reported, what the tap
//! recorded, what the nemesis did, how every lockrun ended and the fenced store's log,
//! and checks SPEC's safety properties; every violation becomes one line of
//! [`Report::failures`], and the figures go into the summary line.
//!
//! Bounds are always taken on the safe side, so that a violation found is a real one:
//! - a section's own instants (taken by the section before it reported them) prove it
//!   was running then;
//! - a request reached the tap after lockrun took its send time, so "arrival at the tap
//!   + TTL" is never earlier than the deadline lockrun could know;
//! - a fault counts from just before it was applied to just after it was healed.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::Value;

use super::deadlines::check_deadlines;
use super::report::{Fault, FaultEvent, Run, Section};
use super::tap::{Call, Record};
use crate::support::{overlaps, reused_tokens, Span};

/// Faults whose effect reaches a little before the instant recorded for them: the test
/// notes the time, then acts.
const FAULT_SLOP: Duration = Duration::from_millis(100);

/// Exit statuses SPEC allows here: the command's own (the section exits 0), 75 (busy
/// after --wait), 124 (lock lost), 125 (backend unreachable, command not started).
const ALLOWED_CODES: [i32; 4] = [0, 75, 124, 125];

/// The checker's verdict and figures.
#[derive(Debug, Default)]
pub struct Report {
    /// One line per violation.
    pub failures: Vec<String>,
    /// Critical sections that reported a start.
    pub sections: usize,
    /// lockrun runs by exit status.
    pub codes: BTreeMap<i32, usize>,
    /// Faults by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// Pairs of sections that overlapped in time, by the fault that explains them.
    pub overlaps: BTreeMap<&'static str, usize>,
    /// Store writes accepted.
    pub writes_accepted: usize,
    /// Store writes rejected (all from a stale holder).
    pub stale_rejected: usize,
    /// Sections stopped by lockrun because the lease was lost (exit 124).
    pub stopped: usize,
    /// The latest death of a section stopped on loss, relative to the deadline lockrun
    /// could know (negative: that much before it), for lockruns that were not paused.
    pub max_kill_lateness_ms: Option<i64>,
    /// The longest time from the SIGCONT of a lockrun paused past its deadline to the
    /// death of its command.
    pub max_resume_kill_ms: Option<i64>,
    /// Sections that ran while nothing that may cause overlaps was in the schedule.
    pub sections_in_safe_phases: usize,
}

impl Report {
    /// The one-line summary.
    pub fn summary(&self) -> String {
        let kv = |m: &BTreeMap<&'static str, usize>| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let codes: Vec<String> = self.codes.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        let ms = |v: Option<i64>| v.map_or("-".into(), |v| format!("{v}ms"));
        format!(
            "sections={} (in safe phases {}) runs by status {{{}}} stopped-on-loss={} | faults: {} \
             (total {}) | overlaps={} {{{}}} | store writes accepted={} stale writes rejected={} | \
             kill lateness max={} (vs. the deadline lockrun could know) | kill after resume max={}",
            self.sections,
            self.sections_in_safe_phases,
            codes.join(" "),
            self.stopped,
            kv(&self.faults),
            self.faults.values().sum::<usize>(),
            self.overlaps.values().sum::<usize>(),
            kv(&self.overlaps),
            self.writes_accepted,
            self.stale_rejected,
            ms(self.max_kill_lateness_ms),
            ms(self.max_resume_kill_ms),
        )
    }
}

/// Everything the checker looks at.
pub struct History<'a> {
    /// The sections (one per connection to the listener).
    pub sections: &'a [Section],
    /// The tap's record of lockrun's EVALs.
    pub records: &'a [Record],
    /// The nemesis' faults.
    pub faults: &'a [FaultEvent],
    /// Every lockrun run.
    pub runs: &'a [Run],
    /// The store's log, in the order the store took the writes: `1|0 fence pid seq t`.
    pub store_log: &'a [String],
    /// The lease length every lockrun was given.
    pub ttl: Duration,
}

/// `d` in whole milliseconds.
pub(super) fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// `a - b` in milliseconds, negative when `a` is earlier.
pub(super) fn signed_ms(a: Duration, b: Duration) -> i64 {
    if a >= b {
        ms(a - b)
    } else {
        -ms(b - a)
    }
}

/// A lockrun run as its JSON log tells it.
struct Parsed {
    fence: Option<u64>,
    events: Vec<String>,
}

fn parse_log(run: &Run, failures: &mut Vec<String>) -> Parsed {
    let mut p = Parsed {
        fence: None,
        events: Vec::new(),
    };
    for line in run.stderr.lines() {
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => {
                failures.push(format!(
                    "lockrun {} wrote a line that is not JSON: {line:?}",
                    run.pid
                ));
                continue;
            }
        };
        for key in ["ts", "level", "event", "lock"] {
            if v.get(key).is_none() {
                failures.push(format!(
                    "lockrun {} wrote a JSON line without {key:?}: {line}",
                    run.pid
                ));
            }
        }
        let event = v["event"].as_str().unwrap_or("").to_owned();
        if event == "acquired" {
            p.fence = v["fencing_token"].as_u64();
        }
        p.events.push(event);
    }
    p
}

/// Runs every check.
pub fn check(h: &History<'_>) -> Report {
    let mut r = Report::default();
    for f in h.faults {
        *r.faults.entry(f.kind.name()).or_default() += 1;
    }
    let runs = check_runs(h, &mut r);
    let sections: Vec<&Section> = h.sections.iter().filter(|s| s.fence != 0).collect();
    r.sections = sections.len();
    for s in h.sections {
        if !s.garbage.is_empty() {
            r.failures.push(format!(
                "a section sent lines the test cannot read: {:?}",
                s.garbage
            ));
        }
        if s.fence == 0 && (s.end.is_some() || !s.writes.is_empty()) {
            r.failures
                .push("a section wrote before saying which token it has".into());
        }
    }
    let acquires = check_fences(h, &sections, &mut r);
    check_overlaps(h, &sections, &acquires, &mut r);
    check_store(h, &sections, &mut r);
    check_deadlines(h, &sections, &runs, &acquires, &mut r);
    r
}

/// Exit statuses, explanations and JSON lines (check 4); returns runs by fencing token.
fn check_runs<'a>(h: &History<'a>, r: &mut Report) -> HashMap<u64, &'a Run> {
    let mut by_fence = HashMap::new();
    for run in h.runs {
        let log = parse_log(run, &mut r.failures);
        let code = run.code.unwrap_or(-1);
        *r.codes.entry(code).or_default() += 1;
        if run.hung {
            r.failures.push(format!(
                "lockrun {} did not end within its time and was killed; its log:\n{}",
                run.pid, run.stderr
            ));
        }
        if !ALLOWED_CODES.contains(&code) {
            r.failures.push(format!(
                "lockrun {} ended with status {:?}, not one SPEC allows here; its log:\n{}",
                run.pid, run.code, run.stderr
            ));
        }
        let why = match code {
            124 => Some("lost"),
            75 => Some("busy"),
            125 => Some("error"),
            _ => None,
        };
        if let Some(event) = why {
            if !log.events.iter().any(|e| e == event) {
                r.failures.push(format!(
                    "lockrun {} exited {code} without a {event:?} line saying why:\n{}",
                    run.pid, run.stderr
                ));
            }
        }
        if code == 124 {
            r.stopped += 1;
        }
        if let Some(f) = log.fence {
            if by_fence.insert(f, run).is_some() {
                r.failures
                    .push(format!("fencing token {f} was handed to two lockruns"));
            }
        }
    }
    by_fence
}

/// Property 5: fencing tokens strictly increase across acquisitions. Returns the
/// successful acquire records by fencing token.
fn check_fences<'a>(
    h: &History<'a>,
    sections: &[&Section],
    r: &mut Report,
) -> HashMap<u64, &'a Record> {
    let mut acquires: HashMap<u64, &Record> = HashMap::new();
    for rec in h.records.iter().filter(|x| x.call == Call::Acquire) {
        if let Some(f) = rec.fence() {
            if let Some(other) = acquires.insert(f, rec) {
                r.failures.push(format!(
                    "fencing token {f} was handed out twice (lock tokens {} and {})",
                    other.token, rec.token
                ));
            }
        }
    }
    // Ordered by the server for sure: a's reply left the server before b reached the
    // tap. Then a was executed first and b's token must be larger.
    let mut by_reply: Vec<&Record> = acquires.values().copied().collect();
    by_reply.sort_by_key(|x| x.replied);
    let mut by_sent: Vec<&Record> = acquires.values().copied().collect();
    by_sent.sort_by_key(|x| x.sent);
    let mut i = 0;
    let mut max_before: Option<&Record> = None;
    for b in &by_sent {
        while i < by_reply.len() && by_reply[i].replied.is_some_and(|t| t < b.sent) {
            if max_before.is_none_or(|m| by_reply[i].fence() > m.fence()) {
                max_before = Some(by_reply[i]);
            }
            i += 1;
        }
        if let Some(a) = max_before {
            if a.fence() >= b.fence() {
                r.failures.push(format!(
                    "fencing tokens went backwards: {:?} was handed out, then {:?} by a later \
                     acquisition (sent {} ms after the first one's reply)",
                    a.fence(),
                    b.fence(),
                    signed_ms(b.sent, a.replied.unwrap())
                ));
            }
        }
    }
    for token in reused_tokens(&spans(sections)) {
        r.failures
            .push(format!("two sections ran with fencing token {token}"));
    }
    for s in sections {
        if !acquires.contains_key(&s.fence) {
            r.failures.push(format!(
                "a section ran with fencing token {}, which the tap never saw handed out",
                s.fence
            ));
        }
    }
    acquires
}

/// The sections as the shared checker sees them.
fn spans(sections: &[&Section]) -> Vec<Span> {
    sections
        .iter()
        .map(|s| Span {
            token: s.fence,
            start: s.start,
            end: s.until(),
        })
        .collect()
}

/// Checks 1 and 2: every overlap has a fault that explains it, on the stale side.
fn check_overlaps(
    h: &History<'_>,
    sections: &[&Section],
    acquires: &HashMap<u64, &Record>,
    r: &mut Report,
) {
    let mut sorted: Vec<&Section> = sections.to_vec();
    sorted.sort_by_key(|s| s.start);
    let risky: Vec<&FaultEvent> = h.faults.iter().filter(|f| f.kind.may_overlap()).collect();
    for s in &sorted {
        let from = acquires.get(&s.fence).map_or(s.start, |a| a.sent);
        if !risky
            .iter()
            .any(|f| f.from <= s.until() && f.to + FAULT_SLOP >= from)
        {
            r.sections_in_safe_phases += 1;
        }
    }
    for (a, b) in overlaps(&spans(&sorted)) {
        explain_overlap(h, &risky, acquires, sorted[a], sorted[b], r);
    }
}

/// Counts the overlap of `a` and `b` under the fault that explains it, or fails: a
/// data loss, a clock jump or a pause of the stale holder's lockrun, from before the
/// stale holder's acquisition to the start of the overlap.
fn explain_overlap(
    h: &History<'_>,
    risky: &[&FaultEvent],
    acquires: &HashMap<u64, &Record>,
    a: &Section,
    b: &Section,
    r: &mut Report,
) {
    let (stale, newer) = if a.fence < b.fence { (a, b) } else { (b, a) };
    let overlap_start = a.start.max(b.start);
    let window_from = acquires
        .get(&stale.fence)
        .map_or(stale.start, |x| x.sent)
        .saturating_sub(FAULT_SLOP);
    let explains = |f: &&&FaultEvent| {
        f.from <= overlap_start
            && f.to >= window_from
            && (f.kind != Fault::PauseLockrun || f.pid == Some(stale.lockrun_pid))
    };
    if let Some(f) = risky.iter().find(explains) {
        *r.overlaps.entry(f.kind.name()).or_default() += 1;
        return;
    }
    let around: Vec<_> = h
        .faults
        .iter()
        .filter(|f| {
            f.to + Duration::from_secs(5) >= window_from
                && f.from <= overlap_start + Duration::from_secs(1)
        })
        .map(|f| {
            (
                f.kind.name(),
                ms(f.from),
                ms(f.to),
                f.pid,
                f.detail.as_str(),
            )
        })
        .collect();
    r.failures.push(format!(
        "critical sections overlapped with no pause, clock jump or data loss to explain \
         it: token {} (lockrun {}) ran {}..{} ms, token {} (lockrun {}) ran {}..{} ms \
         (test clock); faults around then: {around:?}",
        stale.fence,
        stale.lockrun_pid,
        ms(stale.start),
        ms(stale.until()),
        newer.fence,
        newer.lockrun_pid,
        ms(newer.start),
        ms(newer.until()),
    ));
}

/// The fenced store: accepted tokens never decrease, and every rejected write came from
/// a section that a newer holder overlapped.
fn check_store(h: &History<'_>, sections: &[&Section], r: &mut Report) {
    let mut high: Option<u64> = None;
    for line in h.store_log {
        let f: Vec<&str> = line.split(' ').collect();
        let (Some(ok), Some(fence)) = (f.first(), f.get(1).and_then(|t| t.parse::<u64>().ok()))
        else {
            r.failures.push(format!("bad store log line {line:?}"));
            continue;
        };
        if *ok == "1" {
            r.writes_accepted += 1;
            if high.is_some_and(|hi| fence < hi) {
                r.failures.push(format!(
                    "the store accepted token {fence} after token {high:?}"
                ));
            }
            high = Some(high.map_or(fence, |hi| hi.max(fence)));
        } else {
            r.stale_rejected += 1;
            let Some(s) = sections.iter().find(|s| s.fence == fence) else {
                continue;
            };
            let overlapped = sections
                .iter()
                .any(|o| o.fence > fence && o.start < s.until() && s.start < o.until());
            if !overlapped {
                r.failures.push(format!(
                    "the store rejected a write of token {fence}, but no section with a larger \
                     token ran at the same time: a later holder got a smaller token"
                ));
            }
        }
    }
}
