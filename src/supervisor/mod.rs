//! The command's job: spawn (through the guard), signal, reap.
//!
//! The job is every process descended from the command, not only its process group: a
//! process may leave the group (`setpgid`, as GNU `timeout` does), start a session of
//! its own (`setsid`) or double-fork, and it is still the job. Three pieces hold it:
//!
//! - [`guard`]: a small process forked at start that starts the command as its own
//!   child and is a child subreaper, so the job is exactly the guard's descendants. It
//!   SIGKILLs the whole job when lockrun dies, for any reason, SIGKILL included, and
//!   holds the file backend's lock until the job is dead;
//! - [`cgroup`]: where lockrun may make a cgroup v2 of its own, the command joins it
//!   before exec, and `cgroup.kill` reaches everything forked in it at once;
//! - [`tree`]: the descendants of a pid read from `/proc`, signalled one by one (the
//!   command's own group first, with `killpg`).
//!
//! [`cpus`]: the guard runs on lockrun's other CPUs until it starts the command, which
//! gets lockrun's CPU affinity.
//!
//! [`trim`]: once the command has run a while, lockrun and its guard give back the
//! pages of the program that start-up mapped.
//!
//! lockrun makes itself a child subreaper too: if the guard dies, the command dies of
//! its parent-death signal (SIGKILL, tied to the guard) and the rest of the job is
//! re-parented to lockrun, which kills it and exits 124. A stopped guard is continued
//! ([`Job::guard_stopped`]; `guard.rs`, "Stops", has the whole story).
//!
//! Every `waitpid` of lockrun happens here, with `-1`: as PID 1 (a container) or
//! subreaper, lockrun reaps every orphan. ESRCH from a signal means the target is
//! already gone and is not an error.
//!
//! A forwarded signal that was ignored when lockrun started (`nohup` ignores SIGHUP,
//! `trap '' INT` SIGINT) gets no handler: lockrun neither forwards it nor dies of it,
//! and since exec keeps an ignored disposition (only handled signals are reset), the
//! command inherits it ignored too, as it would without lockrun in between.

mod cgroup;
mod cpus;
mod guard;
mod guardian;
mod spawn;
mod tree;
mod trim;
mod wire;

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpid, getppid, Pid};
use tokio::signal::unix::{signal, Signal as SignalStream, SignalKind};

pub use guard::{Boundary, Guard};
pub use trim::{give_back_program_pages, TRIM_AFTER};
pub use wire::FromGuard;

/// How the command's leader process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    /// Exited with this status.
    Code(u8),
    /// Killed by this signal number.
    Signal(i32),
}

/// Why the command could not be started.
#[derive(Debug)]
pub enum SpawnError {
    /// No such file (exit status 127).
    NotFound(io::Error),
    /// Found but not executable (exit status 126).
    CannotExecute(io::Error),
    /// The guard could not be asked to start it (exit status 125): nothing ran.
    Guard(io::Error),
    /// The guard died (or did not answer) while starting it (exit status 124): the
    /// command may have run for a moment; whatever it started was killed.
    GuardLost {
        /// What went wrong.
        why: String,
        /// Every process below lockrun is gone (else the lock is left to expire).
        job_gone: bool,
    },
}

/// A change lockrun makes to its own environment for the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvChange {
    /// Set this variable to this value.
    Set(String, String),
    /// Leave this variable out.
    Remove(String),
}

/// Makes lockrun the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`).
pub fn become_subreaper() -> nix::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// The running job: the command (leader of its own process group), everything it
/// started, and the guard above them.
#[derive(Debug)]
pub struct Job {
    guard: Guard,
    leader: Pid,
    boundary: Boundary,
    guard_gone: bool,
    /// When lockrun last continued its stopped guard.
    guard_continued: Option<Instant>,
    /// The last tracer of the guard lockrun saw.
    guard_tracer: Option<i32>,
    /// [`Job::done`] reached the guard: [`Job::finish`] waits for it to let go.
    told_done: bool,
}

/// What lockrun made of its guard found stopped (see [`Job::guard_stopped`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardStop {
    /// Continued: it runs again.
    Continued,
    /// It cannot be kept running: still stopped after lockrun's SIGCONT (a tracer
    /// holds it), or stopped again within [`RESTOPPED`] of the last SIGCONT (the job
    /// stopping its parent again and again, say). The job must be stopped: should
    /// lockrun die while the guard is held, nothing would stop it.
    Held,
}

/// A guard stopped again this soon after lockrun continued it is held stopped.
pub const RESTOPPED: Duration = Duration::from_secs(1);

impl Job {
    /// Has `guard` start the command with lockrun's environment changed by `env`,
    /// handing it `hold` (descriptors that hold the lock) to keep while the job lives.
    pub fn start(
        guard: Guard,
        env: &[EnvChange],
        hold: &[RawFd],
        timeout: Duration,
    ) -> Result<Job, SpawnError> {
        let spawned = guard.spawn(env, hold, timeout)?;
        Ok(Job {
            guard,
            leader: spawned.leader,
            boundary: spawned.boundary,
            guard_gone: false,
            guard_continued: None,
            guard_tracer: None,
            told_done: false,
        })
    }

    /// The command's pid, which is also its process group id.
    pub fn leader(&self) -> Pid {
        self.leader
    }

    /// The guard's pid.
    pub fn guard_pid(&self) -> Pid {
        self.guard.pid()
    }

    /// Where the job is held.
    pub fn boundary(&self) -> &Boundary {
        &self.boundary
    }

    /// The socket to the guard: readable when it reports, at end of file when it died.
    pub fn guard_socket(&self) -> BorrowedFd<'_> {
        self.guard.socket()
    }

    /// The guard's next report, if one is there; `Err` once the guard is gone.
    pub fn report(&self) -> io::Result<Option<FromGuard>> {
        self.guard.try_report()
    }

    /// The guard died (or is given up, held stopped): from now on the job is lockrun's
    /// own descendants (lockrun is their subreaper), a living guard among them.
    pub fn guard_lost(&mut self) {
        self.guard_gone = true;
    }

    /// lockrun saw its guard stopped (SIGSTOP by an operator, or by the job: the guard
    /// is the command's parent). A stopped guard kills nothing, neither at the deadline
    /// nor when lockrun dies, so lockrun continues it at once, and says whether it runs
    /// again. Waits on nothing.
    pub fn guard_stopped(&mut self) -> GuardStop {
        let again = self
            .guard_continued
            .is_some_and(|t| t.elapsed() < RESTOPPED);
        let guard = self.guard.pid();
        let _ = nix::sys::signal::kill(guard, Signal::SIGCONT);
        self.guard_continued = Some(Instant::now());
        // SIGCONT takes effect as it is sent: a guard still stopped now is traced.
        let still = tree::stat(guard.as_raw()).is_some_and(|p| p.stopped);
        if again || still {
            GuardStop::Held
        } else {
            GuardStop::Continued
        }
    }

    /// The guard's tracer (`TracerPid` of `/proc/PID/status`), if it has one that
    /// lockrun has not seen before: a tracer can hold the guard where lockrun sees no
    /// stop (at a breakpoint).
    pub fn new_guard_tracer(&mut self) -> Option<i32> {
        if self.guard_gone {
            return None;
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.guard.pid()));
        let tracer = status
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|t| t.trim().parse::<i32>().ok())
            .filter(|&t| t != 0);
        let new = tracer.filter(|&t| self.guard_tracer != Some(t));
        self.guard_tracer = tracer;
        new
    }

    /// True once the guard died.
    pub fn is_guard_lost(&self) -> bool {
        self.guard_gone
    }

    /// Whose descendants the job is.
    fn root(&self) -> i32 {
        if self.guard_gone {
            getpid().as_raw()
        } else {
            self.guard.pid().as_raw()
        }
    }

    /// Sends `sig` to every process of the job: the command's group at once, then every
    /// other descendant; SIGKILL through the cgroup too. Waits on nothing.
    pub fn signal(&self, sig: Signal) {
        match killpg(self.leader, sig) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => crate::log::emit(
                crate::log::Level::Warn,
                crate::log::Event::SignalFailed,
                &format!("could not send {sig} to the command's process group: {e}"),
                &[],
            ),
        }
        if sig == Signal::SIGKILL {
            if let Boundary::Cgroup(c) = &self.boundary {
                let _ = c.kill();
            }
        }
        tree::signal(self.root(), sig, Some(self.leader.as_raw()));
    }

    /// True when no process of the job runs any more (zombies do not count; nor does a
    /// lost guard that lingers below lockrun). The tree is read one process at a time,
    /// so one read can miss a process re-parented while it runs (from a dying guard to
    /// lockrun, say): it takes two reads in a row that find nothing, and a cgroup with
    /// no process in it, which the kernel counts at once.
    pub fn is_empty(&self) -> bool {
        let guard = self.guard.pid().as_raw();
        let tree_empty = || {
            tree::live_descendants(self.root())
                .iter()
                .all(|p| p.pid == guard)
        };
        let cgroup_empty = match &self.boundary {
            Boundary::Cgroup(c) => c.pids().iter().all(|&p| p == guard),
            Boundary::Tree => true,
        };
        tree_empty() && tree_empty() && cgroup_empty
    }

    /// Tells the guard the lease's deadline (time since boot on `CLOCK_BOOTTIME`): if
    /// lockrun has not sent a later one by then, the guard SIGKILLs the job itself, so a
    /// stopped or stuck lockrun cannot let the job outlive the lease. Never waits.
    pub fn set_deadline(&self, since_boot: Duration) {
        if !self.guard_gone {
            self.guard.deadline(since_boot);
        }
    }

    /// Tells the guard the job is over (lockrun saw it gone): it removes the cgroup,
    /// closes every descriptor (the lock's among them) and exits. Never waits, so that
    /// lockrun's release runs beside the guard's end; [`Job::finish`] then waits for it.
    pub fn done(&mut self) {
        if !self.guard_gone {
            // A guard stopped at this moment would make lockrun wait out GUARD_EXIT.
            let _ = nix::sys::signal::kill(self.guard.pid(), Signal::SIGCONT);
            self.told_done = self.guard.done();
        }
    }

    /// After [`Job::done`] (and the release): waits at most [`GUARD_EXIT`] for the
    /// guard to have let go (not for its exit), so that a lock held through the guard's
    /// descriptors (`file://`) is free when lockrun exits; then removes the cgroup
    /// itself if it is still there (the guard lost, or slow to end). A cgroup still
    /// holding a zombie (an orphan of the job re-parented to lockrun that it has not
    /// reaped yet) cannot be removed: lockrun reaps and tries again.
    pub fn finish(self) {
        let until = Instant::now() + GUARD_EXIT;
        if self.told_done {
            self.guard.let_go_within(GUARD_EXIT);
        }
        if let Boundary::Cgroup(c) = &self.boundary {
            while !c.remove() && Instant::now() < until {
                reap(self.guard.pid(), self.leader);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// How long lockrun waits, once the job is gone, for the guard to let go of everything
/// before it releases the lock: the guard has nothing left to do but reap, remove the
/// cgroup and close its descriptors, which takes well under a millisecond on an idle
/// machine. A guard still exiting after that is reaped like any orphan.
const GUARD_EXIT: Duration = Duration::from_secs(2);

/// Between fork and exec of the command (in the guard, when it is not born in a
/// cgroup, see `spawn.rs`): ask for SIGKILL when the guard dies, never run if it is
/// gone already, and start with no signal blocked.
#[allow(unsafe_code)]
fn prepare_child(cmd: &mut Command, parent: Pid) {
    // SAFETY: the closure runs in the forked child before exec. It makes only
    // async-signal-safe system calls (prctl, getppid, sigprocmask) and does not
    // allocate or take locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if getppid() != parent {
                // The guard is already gone: never run the command unguarded.
                return Err(io::Error::from(Errno::ESRCH));
            }
            nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
                .map_err(io::Error::from)?;
            Ok(())
        });
    }
}

/// What lockrun's own reaping found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    /// The guard ended.
    pub guard: bool,
    /// The command ended (seen by lockrun only once the guard is gone).
    pub leader: Option<ChildExit>,
    /// The guard was stopped (see [`Job::guard_stopped`]).
    pub guard_stopped: bool,
}

/// Reaps every child of lockrun that has ended: the guard, orphans re-parented to
/// lockrun (after the guard's death, or any zombie when lockrun is PID 1); and says
/// whether the guard was stopped.
pub fn reap(guard: Pid, leader: Pid) -> Reaped {
    let mut found = Reaped::default();
    loop {
        match waitpid(
            Pid::from_raw(-1),
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED),
        ) {
            Ok(WaitStatus::Stopped(pid, _)) if pid == guard => found.guard_stopped = true,
            Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)) if pid == guard => {
                found.guard = true;
            }
            Ok(WaitStatus::Exited(pid, code)) if pid == leader => {
                found.leader = Some(ChildExit::Code(u8::try_from(code).unwrap_or(255)));
            }
            Ok(WaitStatus::Signaled(pid, sig, _core)) if pid == leader => {
                found.leader = Some(ChildExit::Signal(sig as i32));
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return found,
            Ok(_) => {}
        }
    }
}

/// A signal lockrun received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// One to forward to the command's group (TERM, INT, HUP, QUIT, USR1, USR2).
    Forward(Signal),
    /// SIGCHLD: some child changed state; call [`reap`].
    Child,
}

/// lockrun's signal handlers, installed before the lock is taken so that no signal
/// is lost or takes its default action (death without release) at any point.
pub struct Signals {
    forward: Vec<(Signal, SignalStream)>,
    child: SignalStream,
    ignored: Vec<Signal>,
}

/// The signals forwarded to the command's group.
pub const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

impl Signals {
    /// Installs the handlers: one for SIGCHLD, and one for each of [`FORWARDED`]
    /// except those ignored when lockrun started, which stay ignored.
    pub fn install() -> io::Result<Signals> {
        let mut forward = Vec::with_capacity(FORWARDED.len());
        let mut ignored = Vec::new();
        for sig in FORWARDED {
            if is_ignored(sig) {
                ignored.push(sig);
            } else {
                forward.push((sig, signal(SignalKind::from_raw(sig as i32))?));
            }
        }
        Ok(Signals {
            forward,
            child: signal(SignalKind::child())?,
            ignored,
        })
    }

    /// The forwarded signals that were ignored when lockrun started (and stay so).
    pub fn ignored(&self) -> &[Signal] {
        &self.ignored
    }

    /// Waits for the next signal.
    pub async fn recv(&mut self) -> Received {
        let forward = std::future::poll_fn(|cx| {
            for (sig, stream) in self.forward.iter_mut() {
                if stream.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        });
        tokio::select! {
            biased;
            _ = self.child.recv() => Received::Child,
            sig = forward => Received::Forward(sig),
        }
    }

    /// Waits for the next signal to forward, ignoring SIGCHLD (before the command
    /// exists there is nothing to reap).
    pub async fn recv_forwardable(&mut self) -> Signal {
        loop {
            if let Received::Forward(sig) = self.recv().await {
                return sig;
            }
        }
    }
}

/// True if `sig`'s disposition is "ignore" (`SIG_IGN`), as inherited from the caller.
#[allow(unsafe_code)]
fn is_ignored(sig: Signal) -> bool {
    use nix::libc;
    let mut current = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: with a null new action, sigaction(2) changes nothing and only writes the
    // current action into `current`, which is valid for writes; it is read only after
    // that call succeeded (and it was zeroed before, so it is initialised either way).
    unsafe {
        libc::sigaction(sig as libc::c_int, std::ptr::null(), current.as_mut_ptr()) == 0
            && current.assume_init().sa_sigaction == libc::SIG_IGN
    }
}
