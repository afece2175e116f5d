//! The history checker of the soak. It takes what the sections reported, what the tap
//! recorded, what the nemesis did, how every lockrun ended and the fenced store's log,
//! and checks the safety properties of docs/guarantees.md; every violation becomes one
//! line of [`Report::failures`], and the figures go into the summary line.
//!
//! One checker for both phases: a plain lock is a semaphore of one slot
//! ([`History::slots`]). With N slots (property 9) it checks, in the same terms as for a
//! plain lock:
//! - every section ran on a slot in 0..N, the one its lockrun logged acquiring and the
//!   one the server's reply (as the tap saw it) named;
//! - two sections on one slot never overlapped, and no section started while N others
//!   were inside (support's `slot_overlaps` and `crowded`), unless a fault that may
//!   cause it (data loss, a clock jump, a pause of the stale holder's lockrun) explains
//!   it, exactly as an overlap of a plain lock is explained;
//! - fencing tokens are unique and strictly increase in happens-before order, over
//!   every slot: an acquisition whose request reached the server after another's reply
//!   had left it got the larger token (stronger than "a section that started after
//!   another ended has the larger token", which it implies, and which does not hold
//!   with N > 1: a holder may take its slot first and start its command late);
//! - every holder's own kill deadline, as for a plain lock (`deadlines`), and no job
//!   outliving its lockrun (a lockrun the nemesis SIGKILLed included);
//! - the fenced store keeps one high watermark per slot (a resource per slot: what a
//!   single watermark cannot be with N holders writing at once), so a stale holder's
//!   write is rejected once a newer holder of its slot wrote.
//!
//! A section is its whole job: it lasts until the last instant one of its processes
//! (the child some sections leave running, even in a session of its own) was seen
//! running, so a leftover that runs beside the next holder is an overlap.
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
use crate::support::{
    crowded, most_inside, overlaps, reused_tokens, slot_overlaps, SlotSpan, Span,
};

/// Faults whose effect reaches a little before the instant recorded for them: the test
/// notes the time, then acts.
const FAULT_SLOP: Duration = Duration::from_millis(100);

/// Exit statuses the contract allows here (README, "Exit status"): the command's own (the
/// section exits 0), 75 (busy after --wait), 124 (lock lost), 125 (backend unreachable,
/// command not started); and death by SIGKILL for a lockrun the nemesis killed.
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
    /// Pairs of sections that overlapped in time on one slot, by the fault that
    /// explains them.
    pub overlaps: BTreeMap<&'static str, usize>,
    /// The slots of the lock (1: a plain lock).
    pub slots: u32,
    /// Sections that started while `slots` others were inside, by the fault that
    /// explains them (semaphores only).
    pub crowds: BTreeMap<&'static str, usize>,
    /// The most sections inside at once.
    pub most_inside: usize,
    /// Sections by the slot they ran on.
    pub by_slot: BTreeMap<u32, usize>,
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
        let slots = if self.slots > 1 {
            let by_slot: Vec<String> = self
                .by_slot
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            format!(
                " | slots={}: most inside at once={}, sections by slot {{{}}}, started with \
                 {} inside={} {{{}}}",
                self.slots,
                self.most_inside,
                by_slot.join(" "),
                self.slots,
                self.crowds.values().sum::<usize>(),
                kv(&self.crowds),
            )
        } else {
            String::new()
        };
        format!(
            "sections={} (in safe phases {}) runs by status {{{}}} stopped-on-loss={} | faults: {} \
             (total {}) | overlaps={} {{{}}} | store writes accepted={} stale writes rejected={} | \
             kill lateness max={} (vs. the deadline lockrun could know) | kill after resume max={}{slots}",
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
    /// The slots every lockrun was given (`--slots`; 1: a plain lock).
    pub slots: u32,
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
    slot: Option<u64>,
    events: Vec<String>,
}

fn parse_log(run: &Run, failures: &mut Vec<String>) -> Parsed {
    let mut p = Parsed {
        fence: None,
        slot: None,
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
            p.slot = v["slot"].as_u64();
        }
        p.events.push(event);
    }
    p
}

/// Runs every check.
pub fn check(h: &History<'_>) -> Report {
    let mut r = Report {
        slots: h.slots,
        ..Report::default()
    };
    for f in h.faults {
        *r.faults.entry(f.kind.name()).or_default() += 1;
    }
    let (runs, logged_slots) = check_runs(h, &mut r);
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
    check_slots(h, &sections, &logged_slots, &acquires, &mut r);
    check_overlaps(h, &sections, &acquires, &mut r);
    check_store(h, &sections, &mut r);
    check_deadlines(h, &sections, &runs, &acquires, &mut r);
    r
}

/// Exit statuses, explanations and JSON lines (check 4); returns runs by fencing token,
/// and the slot each logged acquiring by fencing token.
fn check_runs<'a>(h: &History<'a>, r: &mut Report) -> (HashMap<u64, &'a Run>, HashMap<u64, u64>) {
    let mut by_fence = HashMap::new();
    let mut slots = HashMap::new();
    let by_nemesis = |kind: Fault, run: &Run| {
        h.faults
            .iter()
            .any(|f| f.kind == kind && f.pid == Some(run.pid))
    };
    for run in h.runs {
        let log = parse_log(run, &mut r.failures);
        // Killed by a signal: the nemesis' SIGKILL (counted as 137, as a shell shows it),
        // else a bug.
        let killed = run.code.is_none()
            && (by_nemesis(Fault::KillLockrun, run) || by_nemesis(Fault::StopGuard, run));
        let code = run.code.unwrap_or(if killed { 137 } else { -1 });
        *r.codes.entry(code).or_default() += 1;
        if run.hung {
            r.failures.push(format!(
                "lockrun {} did not end within its time and was killed; its log:\n{}",
                run.pid, run.stderr
            ));
        }
        if !ALLOWED_CODES.contains(&code) && !killed {
            r.failures.push(format!(
                "lockrun {} ended with status {:?}, not an allowed one here; its log:\n{}",
                run.pid, run.code, run.stderr
            ));
        }
        let why = match code {
            124 => Some("lost"),
            75 => Some("busy"),
            125 => Some("error"),
            _ => None,
        };
        // A line written while stderr was blocked may be lost (docs/guarantees.md: lines, never a
        // deadline).
        let blocked = by_nemesis(Fault::StderrBlocked, run);
        // A guard the nemesis stopped twice in a row may have had lockrun stop the job
        // for that (124, `guard_stopped`) rather than for a loss.
        let guard_held = code == 124
            && by_nemesis(Fault::StopGuard, run)
            && log.events.iter().any(|e| e == "guard_stopped");
        if let Some(event) = why.filter(|_| !blocked && !guard_held) {
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
            if let Some(slot) = log.slot {
                slots.insert(f, slot);
            }
        }
    }
    (by_fence, slots)
}

/// Property 9's slots: every section ran on a slot in 0..N, the one its lockrun logged
/// acquiring and the one the server's reply named (when it names one); the figures by
/// slot.
fn check_slots(
    h: &History<'_>,
    sections: &[&Section],
    logged: &HashMap<u64, u64>,
    acquires: &HashMap<u64, &Record>,
    r: &mut Report,
) {
    for s in sections {
        *r.by_slot.entry(s.slot).or_default() += 1;
        if s.slot >= h.slots {
            r.failures.push(format!(
                "the section with token {} (lockrun {}) ran on slot {} of {}",
                s.fence, s.lockrun_pid, s.slot, h.slots
            ));
        }
        match logged.get(&s.fence) {
            Some(&l) if l == u64::from(s.slot) => {}
            Some(l) => r.failures.push(format!(
                "the section with token {} got LOCKRUN_SLOT={} but its lockrun {} logged \
                 acquiring slot {l}",
                s.fence, s.slot, s.lockrun_pid
            )),
            // A token no lockrun logged is reported by the deadline check.
            None => {}
        }
        let given = acquires.get(&s.fence).and_then(|a| a.slot());
        if given.is_some_and(|g| g != s.slot) {
            r.failures.push(format!(
                "the section with token {} got LOCKRUN_SLOT={} but the server handed out \
                 slot {given:?} with that token",
                s.fence, s.slot
            ));
        }
    }
    r.most_inside = most_inside(&slot_spans(sections));
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
            // A waiter that did not use its grant (its message lost, or too late) takes
            // the same lock at its next attempt: the same token and fencing token
            // again, one acquisition, the first record of it kept.
            if let Some(other) = acquires.get(&f).filter(|o| o.token == rec.token) {
                if other.sent > rec.sent {
                    acquires.insert(f, rec);
                }
                continue;
            }
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

/// The sections as the shared semaphore checker sees them.
fn slot_spans(sections: &[&Section]) -> Vec<SlotSpan> {
    sections
        .iter()
        .map(|s| SlotSpan {
            token: s.fence,
            slot: s.slot,
            start: s.start,
            end: s.until(),
            // The soak checks the order of tokens by the tap's record instead.
            asked: Duration::ZERO,
        })
        .collect()
}

/// Checks 1 and 2: every overlap on one slot (any overlap, of a plain lock), and every
/// section that started while all the slots were taken, has a fault that explains it,
/// on the stale side.
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
    let pairs = if h.slots == 1 {
        overlaps(&spans(&sorted))
    } else {
        slot_overlaps(&slot_spans(&sorted))
    };
    for (a, b) in pairs {
        let (a, b) = (sorted[a], sorted[b]);
        if let Some(f) = explanation(&risky, acquires, a, b) {
            *r.overlaps.entry(f.kind.name()).or_default() += 1;
            continue;
        }
        let (stale, newer) = if a.fence < b.fence { (a, b) } else { (b, a) };
        let on = if h.slots == 1 {
            String::new()
        } else {
            format!(" on slot {}", a.slot)
        };
        r.failures.push(format!(
            "critical sections overlapped{on} with no pause, clock jump or data loss to \
             explain it: {}, {} (test clock); faults around then: {:?}",
            ran(stale),
            ran(newer),
            faults_around(h, acquires, a, b),
        ));
    }
    if h.slots == 1 {
        return;
    }
    for (b, inside) in crowded(&slot_spans(&sorted), h.slots) {
        let b = sorted[b];
        let inside: Vec<&Section> = inside.iter().map(|&a| sorted[a]).collect();
        if let Some(f) = inside
            .iter()
            .find_map(|a| explanation(&risky, acquires, a, b))
        {
            *r.crowds.entry(f.kind.name()).or_default() += 1;
            continue;
        }
        let around: Vec<_> = inside
            .iter()
            .flat_map(|a| faults_around(h, acquires, a, b))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        r.failures.push(format!(
            "{} sections were inside at once with {} slots, with no pause, clock jump or \
             data loss to explain it: {} started while {} were inside (test clock); faults \
             around then: {around:?}",
            inside.len() + 1,
            h.slots,
            ran(b),
            inside.iter().map(|a| ran(a)).collect::<Vec<_>>().join(", "),
        ));
    }
}

/// A section for a failure line.
fn ran(s: &Section) -> String {
    format!(
        "token {} (lockrun {}, slot {}) ran {}..{} ms",
        s.fence,
        s.lockrun_pid,
        s.slot,
        ms(s.start),
        ms(s.until())
    )
}

/// When the overlap of `a` and `b` may have been caused: from just before the stale
/// holder's (the smaller token's) acquisition to the start of the overlap.
fn overlap_window(
    acquires: &HashMap<u64, &Record>,
    a: &Section,
    b: &Section,
) -> (Duration, Duration) {
    let stale = if a.fence < b.fence { a } else { b };
    let from = acquires
        .get(&stale.fence)
        .map_or(stale.start, |x| x.sent)
        .saturating_sub(FAULT_SLOP);
    (from, a.start.max(b.start))
}

/// The fault that explains why `a` and `b` overlapped: a data loss, a clock jump or a
/// pause of the stale holder's lockrun, from before the stale holder's acquisition to
/// the start of the overlap.
fn explanation<'f>(
    risky: &[&'f FaultEvent],
    acquires: &HashMap<u64, &Record>,
    a: &Section,
    b: &Section,
) -> Option<&'f FaultEvent> {
    let stale = if a.fence < b.fence { a } else { b };
    let (from, overlap_start) = overlap_window(acquires, a, b);
    risky.iter().copied().find(|f| {
        f.from <= overlap_start
            && f.to >= from
            && (f.kind != Fault::PauseLockrun || f.pid == Some(stale.lockrun_pid))
    })
}

/// The faults around the overlap of `a` and `b`, for a failure line: (kind, from, to,
/// pid, detail).
fn faults_around(
    h: &History<'_>,
    acquires: &HashMap<u64, &Record>,
    a: &Section,
    b: &Section,
) -> Vec<(&'static str, i64, i64, Option<i32>, String)> {
    let (from, overlap_start) = overlap_window(acquires, a, b);
    h.faults
        .iter()
        .filter(|f| {
            f.to + Duration::from_secs(5) >= from
                && f.from <= overlap_start + Duration::from_secs(1)
        })
        .map(|f| (f.kind.name(), ms(f.from), ms(f.to), f.pid, f.detail.clone()))
        .collect()
}

/// The fenced store, one high watermark per slot: accepted tokens of a slot never
/// decrease, and every rejected write came from a section that a newer holder of its
/// slot overlapped. (A log line without a slot is of slot 0.)
fn check_store(h: &History<'_>, sections: &[&Section], r: &mut Report) {
    let mut high: HashMap<u32, u64> = HashMap::new();
    for line in h.store_log {
        let f: Vec<&str> = line.split(' ').collect();
        let slot = f.get(2).map_or(Some(0), |s| s.parse::<u32>().ok());
        let (Some(ok), Some(fence), Some(slot)) = (
            f.first(),
            f.get(1).and_then(|t| t.parse::<u64>().ok()),
            slot,
        ) else {
            r.failures.push(format!("bad store log line {line:?}"));
            continue;
        };
        if *ok == "1" {
            r.writes_accepted += 1;
            let hi = high.entry(slot).or_insert(fence);
            if fence < *hi {
                r.failures.push(format!(
                    "the store accepted token {fence} on slot {slot} after token {hi}"
                ));
            }
            *hi = fence.max(*hi);
        } else {
            r.stale_rejected += 1;
            let Some(s) = sections.iter().find(|s| s.fence == fence) else {
                continue;
            };
            let overlapped = sections.iter().any(|o| {
                o.fence > fence && o.slot == s.slot && o.start < s.until() && s.start < o.until()
            });
            if !overlapped {
                r.failures.push(format!(
                    "the store rejected a write of token {fence} on slot {slot}, but no section \
                     of that slot with a larger token ran at the same time: a later holder got \
                     a smaller token"
                ));
            }
        }
    }
}
