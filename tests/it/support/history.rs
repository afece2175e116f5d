//! The one mutual-exclusion and fencing checker (docs/guarantees.md, properties 1 and 5).
//! A history is a list of critical sections, each with the fencing token it ran with and
//! when it started and ended on a clock all processes share; the checker finds the
//! sections that overlapped, the tokens handed to two sections, and the tokens that did
//! not increase in the order the sections ran. The conformance suite and the contention
//! tests use it as is ([`Sections`] records the history of a shell command); the soak
//! gives it the sections its commands reported and explains the overlaps its faults may
//! cause.
//!
//! Semaphores (property 9) have theirs: [`SlotSpan`]s, with [`semaphore_violations`]
//! for a history that must be clean ([`SlotSections`]), and its parts for a checker
//! that explains what it finds (the soak): [`slot_overlaps`] (two sections on one slot
//! at once), [`crowded`] (a section that started while N others were inside) and
//! [`most_inside`].

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use super::{parse_token, Scratch};

/// One critical section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The fencing token it ran with.
    pub token: u64,
    /// When it started.
    pub start: Duration,
    /// When it ended (or was last seen running).
    pub end: Duration,
}

/// The pairs of sections that overlapped in time, as indexes into `spans`, the one that
/// started first (or, at the same instant, comes first in `spans`) on the left.
pub fn overlaps(spans: &[Span]) -> Vec<(usize, usize)> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| (spans[i].start, i));
    let mut pairs = Vec::new();
    for (n, &a) in order.iter().enumerate() {
        for &b in &order[n + 1..] {
            if spans[b].start >= spans[a].end {
                // Every later one starts later still.
                break;
            }
            pairs.push((a, b));
        }
    }
    pairs
}

/// The tokens that more than one section ran with, in increasing order.
pub fn reused_tokens(spans: &[Span]) -> Vec<u64> {
    let mut count: HashMap<u64, usize> = HashMap::new();
    for s in spans {
        *count.entry(s.token).or_default() += 1;
    }
    let mut reused: Vec<u64> = count
        .into_iter()
        .filter(|&(_, n)| n > 1)
        .map(|(t, _)| t)
        .collect();
    reused.sort_unstable();
    reused
}

/// Everything wrong with a history that must be strictly sequential, one line each:
/// overlaps, tokens used twice, and a later section with a token not above an earlier
/// one's.
pub fn violations(spans: &[Span]) -> Vec<String> {
    let mut found: Vec<String> = overlaps(spans)
        .into_iter()
        .map(|(a, b)| {
            let (a, b) = (spans[a], spans[b]);
            format!(
                "sections overlap: token {} ran {:?}..{:?}, token {} ran {:?}..{:?}",
                a.token, a.start, a.end, b.token, b.start, b.end
            )
        })
        .collect();
    found.extend(
        reused_tokens(spans)
            .into_iter()
            .map(|t| format!("token {t} was handed to two sections")),
    );
    let mut by_start: Vec<&Span> = spans.iter().collect();
    by_start.sort_by_key(|s| s.start);
    for w in by_start.windows(2) {
        if w[1].token <= w[0].token {
            found.push(format!(
                "tokens not increasing in start order: {} started before {}",
                w[0].token, w[1].token
            ));
        }
    }
    found
}

/// Panics, listing what is wrong, unless `spans` holds `expected` sections that ran one
/// after the other with increasing tokens.
pub fn assert_sequential(spans: &[Span], expected: usize) {
    assert_eq!(spans.len(), expected, "number of critical sections");
    let found = violations(spans);
    assert!(
        found.is_empty(),
        "mutual exclusion or fencing violated:\n{}",
        found.join("\n")
    );
}

/// The critical section that [`Sections`] gives a command to run: it claims a directory
/// (mkdir fails if another section is inside), logs its start and end (wall clock, ns)
/// with its fencing token, and holds for `$HOLD` seconds in between.
const SECTION: &str = r#"
    mkdir "$INSIDE" 2>/dev/null || echo "overlap at start of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
    echo "S $(date +%s%N) $LOCKRUN_FENCING_TOKEN" >> "$HIST"
    sleep "$HOLD"
    echo "E $(date +%s%N) $LOCKRUN_FENCING_TOKEN" >> "$HIST"
    rmdir "$INSIDE" 2>/dev/null || echo "overlap at end of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
"#;

/// The history of critical sections run by shell commands under lockrun, kept in a
/// scratch directory.
pub struct Sections {
    scratch: Scratch,
    hold: String,
}

impl Sections {
    /// A history whose sections each hold for `hold`.
    pub fn new(hold: Duration) -> Sections {
        Sections {
            scratch: Scratch::new(),
            hold: format!("{:.3}", hold.as_secs_f64()),
        }
    }

    /// The command to give lockrun: `sh -c SECTION`.
    pub fn command() -> Vec<&'static str> {
        vec!["sh", "-c", SECTION]
    }

    /// Gives `cmd` (a lockrun running [`Sections::command`]) the section's environment.
    pub fn env(&self, cmd: &mut Command) {
        cmd.env("INSIDE", self.scratch.path("inside"))
            .env("BAD", self.scratch.path("bad"))
            .env("HIST", self.scratch.path("hist"))
            .env("HOLD", &self.hold);
    }

    /// The sections recorded so far.
    pub fn spans(&self) -> Vec<Span> {
        let mut starts: HashMap<u64, Duration> = HashMap::new();
        let mut spans = Vec::new();
        for line in self.scratch.read("hist").lines() {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 3, "bad history line {line:?}");
            let at = Duration::from_nanos(f[1].parse().expect("a time in ns"));
            let token = u64::try_from(parse_token(f[2])).expect("a token that fits u64");
            match f[0] {
                "S" => {
                    assert!(starts.insert(token, at).is_none(), "token {token} twice");
                }
                _ => spans.push(Span {
                    token,
                    start: starts.remove(&token).expect("an end without a start"),
                    end: at,
                }),
            }
        }
        assert!(starts.is_empty(), "sections that never ended: {starts:?}");
        spans
    }

    /// Panics unless `expected` sections ran, never two at once (neither by their
    /// clock nor by their claim on the directory), with increasing tokens.
    pub fn assert_sequential(&self, expected: usize) {
        assert_eq!(
            self.scratch.read("bad"),
            "",
            "two commands were inside at once"
        );
        assert_sequential(&self.spans(), expected);
    }
}

/// One critical section of a semaphore's holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotSpan {
    /// The fencing token it ran with.
    pub token: u64,
    /// The slot it held (`LOCKRUN_SLOT`).
    pub slot: u32,
    /// When it started.
    pub start: Duration,
    /// When it ended.
    pub end: Duration,
    /// When its lockrun was started, before it asked for a slot (zero: not known).
    /// Tokens follow the order of acquisitions, which across slots is not the order in
    /// which sections start (a holder whose command is slow to start may begin after a
    /// later holder's whole section): a section that ended before another's lockrun
    /// was even started is the order that the tokens must follow.
    pub asked: Duration,
}

/// The most sections of `spans` that were inside at one instant.
pub fn most_inside(spans: &[SlotSpan]) -> usize {
    // +1 at each start, -1 at each end; at one instant, ends first (touching
    // sections do not overlap).
    let mut edges: Vec<(Duration, i32)> = spans
        .iter()
        .flat_map(|s| [(s.start, 1), (s.end, -1)])
        .collect();
    edges.sort();
    let (mut inside, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        inside += step;
        most = most.max(inside);
    }
    most as usize
}

/// The sections of `spans` as [`Span`]s (their slots left out).
fn plain(spans: &[SlotSpan]) -> Vec<Span> {
    spans
        .iter()
        .map(|s| Span {
            token: s.token,
            start: s.start,
            end: s.end,
        })
        .collect()
}

/// The pairs of sections that overlapped in time on one slot, as indexes into `spans`,
/// the one that started first on the left.
pub fn slot_overlaps(spans: &[SlotSpan]) -> Vec<(usize, usize)> {
    overlaps(&plain(spans))
        .into_iter()
        .filter(|&(a, b)| spans[a].slot == spans[b].slot)
        .collect()
}

/// Every section that started while `slots` or more others were inside (so that more
/// than `slots` were inside at once), as its index into `spans` with the indexes of
/// those others. Of sections that start at one instant, each counts the ones before it
/// in `spans` as already inside; a section that ends at the instant another starts is
/// no longer inside (as in [`most_inside`]).
pub fn crowded(spans: &[SlotSpan], slots: u32) -> Vec<(usize, Vec<usize>)> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| (spans[i].start, i));
    let mut inside: Vec<usize> = Vec::new();
    let mut found = Vec::new();
    for b in order {
        let start = spans[b].start;
        inside.retain(|&a| spans[a].end > start);
        if inside.len() >= slots as usize {
            found.push((b, inside.clone()));
        }
        inside.push(b);
    }
    found
}

/// Everything wrong with the history of a semaphore of `slots` slots, one line each:
/// more than `slots` inside at once, a slot out of range, two overlapping sections on
/// one slot, a token used twice, and a section with a token not above that of one
/// that ended before its lockrun was started ([`SlotSpan::asked`]).
pub fn semaphore_violations(spans: &[SlotSpan], slots: u32) -> Vec<String> {
    let mut found = Vec::new();
    let most = most_inside(spans);
    if most > slots as usize {
        found.push(format!(
            "{most} sections were inside at once, with {slots} slots"
        ));
    }
    for s in spans.iter().filter(|s| s.slot >= slots) {
        found.push(format!(
            "token {} ran on slot {} of {slots}",
            s.token, s.slot
        ));
    }
    for (a, b) in slot_overlaps(spans) {
        let (a, b) = (spans[a], spans[b]);
        found.push(format!(
            "slot {} held twice at once: token {} ran {:?}..{:?}, token {} ran {:?}..{:?}",
            a.slot, a.token, a.start, a.end, b.token, b.start, b.end
        ));
    }
    for a in spans {
        for b in spans {
            if a.end <= b.asked && b.token <= a.token {
                found.push(format!(
                    "token {} ended before the lockrun of token {} was started",
                    a.token, b.token
                ));
            }
        }
    }
    found.extend(
        reused_tokens(&plain(spans))
            .into_iter()
            .map(|t| format!("token {t} was handed to two sections")),
    );
    found
}

/// The section [`SlotSections`] gives a command: [`SECTION`] with the slot, claiming
/// the slot's directory (mkdir fails if another section holds the same slot).
const SLOT_SECTION: &str = r#"
    mkdir "$INSIDE.$LOCKRUN_SLOT" 2>/dev/null || echo "slot $LOCKRUN_SLOT taken at start of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
    echo "S $(date +%s%N) $LOCKRUN_FENCING_TOKEN $LOCKRUN_SLOT $ASKED" >> "$HIST"
    sleep "$HOLD"
    echo "E $(date +%s%N) $LOCKRUN_FENCING_TOKEN $LOCKRUN_SLOT $ASKED" >> "$HIST"
    rmdir "$INSIDE.$LOCKRUN_SLOT" 2>/dev/null || echo "slot $LOCKRUN_SLOT taken at end of $LOCKRUN_FENCING_TOKEN" >> "$BAD"
"#;

/// The history of a semaphore's sections run by shell commands under lockrun.
pub struct SlotSections(Sections);

impl SlotSections {
    /// A history whose sections each hold for `hold`.
    pub fn new(hold: Duration) -> SlotSections {
        SlotSections(Sections::new(hold))
    }

    /// The command to give lockrun: `sh -c SLOT_SECTION`.
    pub fn command() -> Vec<&'static str> {
        vec!["sh", "-c", SLOT_SECTION]
    }

    /// Gives `cmd` the section's environment, with the time now (wall clock, as
    /// `date +%s%N` reads it) as when its lockrun was started: call it right before
    /// spawning `cmd`.
    pub fn env(&self, cmd: &mut Command) {
        self.0.env(cmd);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970");
        cmd.env("ASKED", now.as_nanos().to_string());
    }

    /// The sections recorded so far.
    pub fn spans(&self) -> Vec<SlotSpan> {
        let mut starts: HashMap<u64, (Duration, u32)> = HashMap::new();
        let mut spans = Vec::new();
        for line in self.0.scratch.read("hist").lines() {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 5, "bad history line {line:?}");
            let asked = Duration::from_nanos(f[4].parse().expect("a time in ns"));
            let at = Duration::from_nanos(f[1].parse().expect("a time in ns"));
            let token = u64::try_from(parse_token(f[2])).expect("a token that fits u64");
            let slot: u32 = f[3].parse().expect("LOCKRUN_SLOT is a number");
            match f[0] {
                "S" => {
                    assert!(
                        starts.insert(token, (at, slot)).is_none(),
                        "token {token} twice"
                    );
                }
                _ => {
                    let (start, at_start) = starts.remove(&token).expect("an end without a start");
                    assert_eq!(slot, at_start, "LOCKRUN_SLOT changed during a section");
                    spans.push(SlotSpan {
                        token,
                        slot,
                        start,
                        end: at,
                        asked,
                    });
                }
            }
        }
        assert!(starts.is_empty(), "sections that never ended: {starts:?}");
        spans
    }

    /// Panics unless `expected` sections ran, never more than `slots` at once and
    /// never two on one slot (neither by their clock nor by their claim on the slot's
    /// directory), with tokens that increase; returns the most that were inside at once.
    pub fn assert_within(&self, slots: u32, expected: usize) -> usize {
        assert_eq!(
            self.0.scratch.read("bad"),
            "",
            "two sections held one slot at once"
        );
        let spans = self.spans();
        assert_eq!(spans.len(), expected, "number of critical sections");
        let found = semaphore_violations(&spans, slots);
        assert!(
            found.is_empty(),
            "semaphore violated:\n{}",
            found.join("\n")
        );
        most_inside(&spans)
    }
}

/// The semaphore checker finds each kind of violation, and only those.
#[cfg(test)]
mod semaphore_checker {
    use super::*;

    /// A section whose lockrun was started 1 ms before it.
    fn span(token: u64, slot: u32, start_ms: u64, end_ms: u64) -> SlotSpan {
        SlotSpan {
            token,
            slot,
            start: Duration::from_millis(start_ms),
            end: Duration::from_millis(end_ms),
            asked: Duration::from_millis(start_ms.saturating_sub(1)),
        }
    }

    #[test]
    fn a_good_history_passes() {
        let ok = [
            span(1, 0, 0, 100),
            span(2, 1, 10, 120),
            span(3, 2, 20, 100),
            span(4, 0, 100, 200),
            span(5, 2, 150, 160),
        ];
        assert_eq!(semaphore_violations(&ok, 3), Vec::<String>::new());
        assert_eq!(most_inside(&ok), 3);
    }

    #[test]
    fn crowds_and_slot_overlaps_name_the_sections() {
        // 0..100 on slots 0, 1, 2; a fourth starts at 50 on slot 1; one at 100 (after
        // the first three ended) is not crowded.
        let spans = [
            span(1, 0, 0, 100),
            span(2, 1, 0, 100),
            span(3, 2, 10, 100),
            span(4, 1, 50, 150),
            span(5, 0, 100, 200),
        ];
        assert_eq!(crowded(&spans, 3), vec![(3, vec![0, 1, 2])]);
        assert_eq!(crowded(&spans, 4), vec![]);
        assert_eq!(slot_overlaps(&spans), vec![(1, 3)]);
        // Starting at one instant: the later one in `spans` sees the earlier inside.
        let same = [span(1, 0, 0, 100), span(2, 1, 0, 100)];
        assert_eq!(crowded(&same, 1), vec![(1, vec![0])]);
    }

    #[test]
    fn every_violation_is_found() {
        let too_many = [span(1, 0, 0, 100), span(2, 1, 10, 100), span(3, 2, 20, 100)];
        assert!(semaphore_violations(&too_many, 2)
            .iter()
            .any(|v| v.contains("3 sections were inside at once")));
        let same_slot = [span(1, 0, 0, 100), span(2, 0, 50, 150)];
        assert!(semaphore_violations(&same_slot, 2)[0].contains("slot 0 held twice"));
        let out_of_range = [span(1, 2, 0, 100)];
        assert!(semaphore_violations(&out_of_range, 2)[0].contains("slot 2 of 2"));
        let backwards = [span(5, 0, 0, 100), span(4, 1, 101, 200)];
        assert!(semaphore_violations(&backwards, 2)[0]
            .contains("token 5 ended before the lockrun of token 4 was started"));
        // A holder whose command started late, after a later holder's whole section,
        // is not out of order: its lockrun was started (and asked) first.
        let late_start = SlotSpan {
            asked: Duration::ZERO,
            ..span(4, 1, 150, 200)
        };
        assert_eq!(
            semaphore_violations(&[span(5, 0, 10, 100), late_start], 2),
            Vec::<String>::new()
        );
        let reused = [span(5, 0, 0, 100), span(5, 1, 0, 100)];
        assert!(semaphore_violations(&reused, 2)
            .iter()
            .any(|v| v.contains("token 5 was handed to two")));
    }
}
