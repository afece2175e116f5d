//! Check 3 of the soak's checker: no section ran past the deadline its lockrun could
//! know (the last request that took or renewed the lease and whose answer reached
//! lockrun, as it reached the tap, plus the TTL), or past its lockrun's resumption if
//! that lockrun was paused; and every section's processes were gone before its lockrun
//! exited.

use std::collections::HashMap;
use std::time::Duration;

use super::check::{ms, signed_ms, History, Report};
use super::report::{Fault, FaultEvent, Run, Section};
use super::tap::Record;

/// How long a lockrun that was paused past its deadline may take, once resumed, until
/// its command's group is dead (docs/guarantees.md, property 3, "the moment it runs
/// again"). Generous: the machine is small and busy, and the section's own instants are
/// what is checked.
const RESUME_SLACK: Duration = Duration::from_millis(1000);

/// How late after the known deadline the *test* may notice a section's death (its
/// socket closing): the kernel closes it when the process dies, but the listener thread
/// must run to see it. The strict check is on the section's own instants; this one
/// catches a command that lives on silently.
const NOTICE_SLACK: Duration = Duration::from_millis(250);

/// Check 3, for every section.
pub(super) fn check_deadlines(
    h: &History<'_>,
    sections: &[&Section],
    runs: &HashMap<u64, &Run>,
    acquires: &HashMap<u64, &Record>,
    r: &mut Report,
) {
    let mut renewals: HashMap<&str, Vec<&Record>> = HashMap::new();
    for rec in h.records {
        if rec.succeeded() && rec.delivered {
            renewals.entry(rec.token.as_str()).or_default().push(rec);
        }
    }
    for s in sections {
        let Some(run) = runs.get(&s.fence) else {
            r.failures.push(format!(
                "no lockrun logged acquiring token {} of a section that ran",
                s.fence
            ));
            continue;
        };
        let Some(gone) = s.gone else {
            r.failures.push(format!(
                "the processes of the section with token {} (pids {:?}) never went away",
                s.fence, s.pids
            ));
            continue;
        };
        if gone > run.ended + Duration::from_secs(1) {
            r.failures.push(format!(
                "the section with token {} outlived its lockrun {} by {} ms",
                s.fence,
                run.pid,
                ms(gone - run.ended)
            ));
        }
        if let Some(acq) = acquires.get(&s.fence) {
            let last_ok = renewals
                .get(acq.token.as_str())
                .and_then(|v| v.iter().map(|x| x.sent).max())
                .unwrap_or(acq.sent);
            let pauses = pauses_of(h, run, acq.sent, gone);
            check_section(s, run, gone, last_ok + h.ttl, &pauses, r);
        }
    }
}

/// The pauses of `run`'s lockrun between its acquisition and its section's end.
fn pauses_of<'a>(
    h: &History<'a>,
    run: &Run,
    acquired: Duration,
    gone: Duration,
) -> Vec<&'a FaultEvent> {
    h.faults
        .iter()
        .filter(|f| {
            f.kind == Fault::PauseLockrun
                && f.pid == Some(run.pid)
                && f.from <= gone
                && f.to >= acquired
        })
        .collect()
}

/// Check 3 for one section that was `gone` at that instant, whose lockrun could know
/// `deadline`, and whose lockrun was paused by `pauses`.
fn check_section(
    s: &Section,
    run: &Run,
    gone: Duration,
    deadline: Duration,
    pauses: &[&FaultEvent],
    r: &mut Report,
) {
    let resumed = pauses.iter().map(|f| f.to).max();
    let allowed = match resumed {
        Some(c) => deadline.max(c + RESUME_SLACK),
        None => deadline,
    };
    if s.last_seen > allowed {
        r.failures.push(format!(
            "the section with token {} (lockrun {}, exit {:?}) was still running {} ms \
             after the deadline lockrun could know (last renewal that reached the server \
             + TTL){}",
            s.fence,
            run.pid,
            run.code,
            ms(s.last_seen - deadline),
            resumed.map_or(String::new(), |c| format!(
                ", and {} ms after its paused lockrun resumed",
                signed_ms(s.last_seen, c)
            ))
        ));
    }
    if gone > allowed + NOTICE_SLACK {
        r.failures.push(format!(
            "the section with token {} (lockrun {}, exit {:?}) died {} ms after the \
             deadline lockrun could know{}",
            s.fence,
            run.pid,
            run.code,
            signed_ms(gone, deadline),
            resumed.map_or(String::new(), |c| format!(
                " ({} ms after its paused lockrun resumed)",
                signed_ms(gone, c)
            ))
        ));
    }
    if run.code == Some(124) {
        kill_figures(s, gone, deadline, pauses, r);
    }
}

/// The figures of a section stopped on loss: how late (or early) after the deadline it
/// died, or, if its lockrun was paused across the deadline, how long after the SIGCONT.
fn kill_figures(
    s: &Section,
    gone: Duration,
    deadline: Duration,
    pauses: &[&FaultEvent],
    r: &mut Report,
) {
    let resumed = pauses.iter().map(|f| f.to).max();
    // Paused across its deadline, with its command still running at the pause.
    let paused_past = pauses
        .iter()
        .filter(|f| f.from <= deadline && f.to >= deadline && s.last_seen >= f.from)
        .map(|f| f.to)
        .max();
    let max = |m: Option<i64>, v: i64| Some(m.map_or(v, |m: i64| m.max(v)));
    match (resumed, paused_past) {
        (None, _) => {
            r.max_kill_lateness_ms = max(r.max_kill_lateness_ms, signed_ms(gone, deadline))
        }
        // (A command that died during the pause was stopped before it.)
        (Some(_), Some(c)) if gone >= c => {
            r.max_resume_kill_ms = max(r.max_resume_kill_ms, signed_ms(gone, c))
        }
        (Some(_), _) => {}
    }
}
