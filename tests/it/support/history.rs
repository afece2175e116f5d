//! The one mutual-exclusion and fencing checker (SPEC properties 1 and 5). A history is
//! a list of critical sections, each with the fencing token it ran with and when it
//! started and ended on a clock all processes share; the checker finds the sections that
//! overlapped, the tokens handed to two sections, and the tokens that did not increase
//! in the order the sections ran. The conformance suite and the contention tests use it
//! as is ([`Sections`] records the history of a shell command); the soak gives it the
//! sections its commands reported and explains the overlaps its faults may cause.

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
