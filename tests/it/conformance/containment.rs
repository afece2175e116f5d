//! Containment on every backend (docs/guarantees.md, property 10): a holder whose job has
//! a child in a session of its own and a child that ignores SIGTERM is SIGKILLed; a
//! waiter takes the lock over, and when its command starts none of the earlier job's
//! processes runs.

use std::time::Instant;

use nix::sys::signal::Signal;

use super::{Start, TTL_ARG};
use crate::support::*;

pub(super) fn next_holder_starts_after_the_killed_holders_job_is_gone(start: Start) {
    let b = start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::new(Shape::All, &s, "job");
    let mut cmd = b.run("job", &["--ttl", TTL_ARG], &job.command());
    job.env(&mut cmd);
    let mut holder = spawn(cmd);
    reaper.add(holder.pid());
    let procs = job.wait_started(&reaper);
    let waiter = b.run("job", &["--wait", "30s"], &next_holder_command());
    let mut waiter = NextHolder::spawn(waiter, &s, "next", &procs);
    holder.signal(Signal::SIGKILL);
    holder.wait();
    let dead = Instant::now();
    let deaths = watch_deaths(&procs, dead, WAIT);
    waiter.assert_no_survivors("the holder SIGKILLed");
    deaths.assert_within(CONTAINED_WITHIN, "the holder SIGKILLed");
}
