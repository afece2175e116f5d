//! Which CPUs the guard runs on while lockrun parses its command line and takes the
//! lock. Part of [`super`]; depends on `nix` only.
//!
//! A forked child is queued on its parent's CPU, and while the parent keeps that CPU
//! busy the scheduler leaves the child waiting there, however idle the other CPUs are:
//! on a 2-CPU machine the guard's first instruction came 425 µs after the fork, at the
//! moment lockrun first blocked (`.ci/bench`'s timeline), so the job's cgroup was made
//! after the parsing instead of beside it. lockrun therefore asks the kernel, right
//! after the fork, to run the guard on its other CPUs (its own affinity less the CPU it
//! is on), and the guard puts back the affinity it was forked with before it starts the
//! command: the command gets lockrun's affinity (`taskset`, a container's cpuset), as
//! if lockrun had started it itself. The order is sure: lockrun asks before it sends
//! the guard anything, and the guard puts the affinity back only on lockrun's order to
//! start the command.
//!
//! Only a hint: with one CPU allowed, or where the kernel refuses, nothing changes.

use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// A process's CPU affinity, read before the guard's fork.
pub struct Affinity(Option<CpuSet>);

impl Affinity {
    /// This process's affinity now (`None` inside: more CPUs than a `CpuSet` holds).
    pub fn now() -> Affinity {
        Affinity(sched_getaffinity(Pid::from_raw(0)).ok())
    }

    /// lockrun, just after the fork: asks for `guard` to run on the CPUs of this
    /// affinity other than the one lockrun is on, if there are any.
    pub fn send_away(&self, guard: Pid) {
        let (Some(all), Ok(here)) = (&self.0, sched_getcpu()) else {
            return;
        };
        if let Some(others) = others(all, here) {
            let _ = sched_setaffinity(guard, &others);
        }
    }

    /// The guard, before it starts the command: this affinity again.
    pub fn put_back(&self) {
        if let Some(all) = &self.0 {
            let _ = sched_setaffinity(Pid::from_raw(0), all);
        }
    }
}

/// The CPUs of `all` but `here`; `None` if there is no other.
fn others(all: &CpuSet, here: usize) -> Option<CpuSet> {
    let mut others = *all;
    others.unset(here).ok()?;
    (0..CpuSet::count())
        .any(|cpu| others.is_set(cpu).unwrap_or(false))
        .then_some(others)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[usize]) -> CpuSet {
        let mut s = CpuSet::new();
        for &c in cpus {
            s.set(c).unwrap();
        }
        s
    }

    #[test]
    fn the_others_are_all_but_the_cpu_lockrun_is_on_and_none_when_it_is_alone() {
        assert_eq!(others(&set(&[0, 1]), 0), Some(set(&[1])));
        assert_eq!(others(&set(&[0, 2, 5]), 2), Some(set(&[0, 5])));
        // On a CPU outside the set (the affinity changed since it was read): all of it.
        assert_eq!(others(&set(&[1, 2]), 0), Some(set(&[1, 2])));
        assert_eq!(others(&set(&[3]), 3), None);
        assert_eq!(others(&set(&[]), 0), None);
    }

    #[test]
    fn sent_away_and_put_back_the_affinity_is_as_it_was() {
        // On this thread itself (a guard's view of its own affinity).
        let before = Affinity::now();
        let tid = nix::unistd::gettid();
        before.send_away(tid);
        before.put_back();
        assert_eq!(Affinity::now().0, before.0);
    }
}
