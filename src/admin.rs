//! `lockrun status` and `lockrun release --force`: look at a lock, or break it (every
//! slot of a semaphore). The holders are shown by [`crate::holder`]. Both refuse (125)
//! a lock whose holders were taken with another `--slots` than the one given, as a run
//! does: a plain `release --force` must not break one slot of a semaphore believing
//! it broke the whole lock.

mod list;

use std::time::Duration;

pub use list::list;

use crate::backend::{slots_conflict, Backend, Holder};
use crate::holder::{status_json, status_text, Known};
use crate::log::{emit, Event, Level};
use crate::outcome::Outcome;

/// The timeout of each request of these commands.
const TIMEOUT: Duration = Duration::from_secs(5);

/// `lockrun status`: prints who holds `name` (every holder, with `--slots N`) and how
/// its last run ended, where the backend keeps that;
/// [`Outcome::Held`] by at least one, [`Outcome::Free`], or [`Outcome::Failed`].
pub async fn status<B: Backend>(backend: &B, name: &str, slots: u32, as_json: bool) -> Outcome {
    let mut holders = match tokio::time::timeout(TIMEOUT, backend.inspect(name)).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return error(&e.to_string()),
        Err(_) => return error("the backend did not answer within 5s"),
    };
    if let Some(msg) = conflict(&holders, slots) {
        return error(&msg);
    }
    holders.sort_by_key(|h| h.slot);
    let last = match tokio::time::timeout(TIMEOUT, backend.last_run(name)).await {
        Ok(Ok(last)) => last,
        Ok(Err(e)) => return error(&e.to_string()),
        Err(_) => return error("the backend did not answer within 5s"),
    };
    let out = match as_json {
        true => status_json(name, slots, &holders, last.as_ref()).to_string(),
        false => status_text(name, slots, &holders, last.as_ref()),
    };
    let outcome = if holders.is_empty() {
        Outcome::Free
    } else {
        Outcome::Held
    };
    print_lines(&[out], outcome)
}

/// `lockrun release --force`: deletes `name` whoever holds it (every slot) and says
/// whose it was, one line per holder broken.
pub async fn force_release<B: Backend>(backend: &B, name: &str, slots: u32) -> Outcome {
    let holders = match tokio::time::timeout(TIMEOUT, backend.inspect(name)).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return error(&e.to_string()),
        Err(_) => return error("the backend did not answer within 5s"),
    };
    if let Some(msg) = conflict(&holders, slots) {
        return error(&format!("{msg}; nothing was broken"));
    }
    let mut broken = match tokio::time::timeout(TIMEOUT, backend.force_release(name)).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return error(&e.to_string()),
        Err(_) => return error("the backend did not answer within 5s"),
    };
    if broken.is_empty() {
        let msg = format!("lock {name:?} was not held; nothing to break");
        emit(Level::Warn, Event::ForceReleased, &msg, &[]);
    }
    broken.sort_by_key(|h| h.slot);
    for h in &broken {
        broke(name, h);
    }
    Outcome::ForceReleased
}

/// The line for one holder broken by `release --force`.
fn broke(name: &str, h: &Holder) {
    let known = Known::of(h);
    let which = match h.slots {
        1 => String::new(),
        _ => format!(" slot {}", h.slot),
    };
    emit(
        Level::Warn,
        Event::ForceReleased,
        &format!("broke lock {name:?}{which}, which was {}", known.summary()),
        &[
            ("holder_host", known.host.into()),
            ("holder_pid", known.pid.into()),
            ("fencing_token", known.fencing_token.into()),
            ("holder_slot", h.slot.into()),
        ],
    );
}

/// The refusal when a holder was taken with another N than `slots`.
fn conflict(holders: &[Holder], slots: u32) -> Option<String> {
    let other = holders.iter().find(|h| h.slots != slots)?;
    Some(slots_conflict(other.slots, slots).to_string())
}

/// Prints `lines` on stdout and returns `outcome`. A reader that has gone (`lockrun list
/// | head -1`, a closed pipe) only ends the printing: the outcome stays, and nothing is
/// said. Any other failure to write is an error (125), on one line.
fn print_lines(lines: &[String], outcome: Outcome) -> Outcome {
    use std::io::{ErrorKind, Write};
    let mut out = std::io::stdout().lock();
    let written = lines
        .iter()
        .try_for_each(|l| writeln!(out, "{l}"))
        .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() != ErrorKind::BrokenPipe => {
            error(&format!("cannot write to stdout: {e}"))
        }
        _ => outcome,
    }
}

/// Logs `msg` as an error: the command failed ([`Outcome::Failed`], 125).
fn error(msg: &str) -> Outcome {
    emit(Level::Error, Event::Error, msg, &[]);
    Outcome::Failed
}
