//! The guard: a small process that outlives lockrun just long enough to kill the job.
//! Part of [`super`]; depends on `nix`, [`super::tree`], [`super::cgroup`],
//! [`super::cpus`] and [`super::wire`]. This file is lockrun's end; `guardian.rs` is the
//! guard's own life.
//!
//! **Why**: a job must never run without the lock, and lockrun can die without warning
//! (SIGKILL, the OOM killer, a CI runner's cancel). The parent-death signal reaches the
//! command's first process only; whatever it started (in its group, in a session of its
//! own, re-parented by a double fork) would run on beside the next holder.
//!
//! **Shape**: lockrun forks the guard first thing in a run, while it still has one thread
//! (before it parses the command line, so that the guard's start and the job's cgroup
//! run beside the parsing and the acquire, on another CPU where there is one:
//! [`super::cpus`]; the guard is told later which of its copy
//! of the arguments are the command), so the guard runs ordinary code without
//! inheriting another thread's locks. The guard:
//! - puts itself in a process group of its own (a `kill -9 -PGID` of lockrun's group, a
//!   terminal's ^C, do not reach it) and blocks the six forwarded signals (a
//!   `pkill lockrun` reaches lockrun, which forwards; the guard must not die of it),
//!   names itself `lockrun-guard`, and becomes a child subreaper;
//! - starts the command when lockrun asks (after the lock is taken), as its own child:
//!   so every orphan of the job is re-parented to the guard, never past it, and the job
//!   is exactly the guard's descendants. Where lockrun may make a cgroup v2
//!   ([`super::cgroup`]) the command joins it before exec, and everything it forks stays
//!   in it;
//! - holds the file backend's lock too: lockrun hands it the lock file's descriptors, so
//!   the kernel keeps the lock taken while the guard lives, and the guard lives until the
//!   job is dead;
//! - reports to lockrun the command's exit status and the moment the job is empty (it
//!   has no child left: nothing below it can exist without a living parent or it);
//! - watches lockrun through the socket between them: when lockrun dies, for whatever
//!   reason, the kernel closes lockrun's end, the guard's `poll` wakes, and the guard
//!   SIGKILLs the whole job (`cgroup.kill`, and every process of the tree, again until
//!   none is left), reaps it, removes the cgroup and exits, letting go of the file lock.
//!
//! lockrun itself stays the child subreaper above the guard: if the guard is killed, the
//! command dies of its parent-death signal and the rest of the job is re-parented to
//! lockrun, which kills it (exit status 124) before it releases the lock.
//!
//! **Stops** (issue 39). A stopped process acts on nothing, so neither may stay stopped
//! past what it guards:
//! - the guard's parent-death signal is SIGCONT: when lockrun dies, the kernel continues
//!   a stopped guard (the orphaned-process-group rule would not where the guard's new
//!   parent is in lockrun's session: a subreaper, a PID namespace's init shell), and it
//!   finds lockrun's end of the socket closed;
//! - each process keeps a POSIX timer that sends itself SIGCONT at the lease deadline
//!   ([`crate::clock::ContinueAt`]): a stopped guard then kills the job, a stopped lockrun
//!   kills it too, even when its guard was killed meanwhile and the job is its own;
//! - lockrun sees its guard stop (SIGCHLD, `WUNTRACED`) and continues it at once, with a
//!   warning (`guard_stopped`): the job can stop it (`kill -STOP $PPID`). A guard still
//!   stopped after that (a tracer holds it) or stopped again within a second is given up
//!   as lost: lockrun SIGKILLs the job and the guard with it (124, `guard_stopped`).
//!
//! The guard writes no log line: a blocked stderr must never keep it from its work.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::unistd::{fork, getpid, ForkResult, Pid};

use super::cgroup::Cgroup;
use super::cpus::Affinity;
use super::wire::{self, FromGuard, ToGuard};
use super::{tree, EnvChange, SpawnError};

/// lockrun's end of the guard: its pid and the socket to it.
#[derive(Debug)]
pub struct Guard {
    pid: Pid,
    sock: OwnedFd,
}

/// Where the job is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Boundary {
    /// In a cgroup of its own (and below the guard).
    Cgroup(Cgroup),
    /// Below the guard, a child subreaper.
    Tree,
}

/// The command, started by the guard.
#[derive(Debug)]
pub struct Spawned {
    /// The command's pid (its process group too).
    pub leader: Pid,
    /// Where the job is held.
    pub boundary: Boundary,
}

impl Guard {
    /// Forks the guard with `line`, the command line, whose last arguments
    /// [`Guard::command`] later names as the command it runs when asked. Call it while
    /// this process has a single thread: the guard runs Rust code after the fork.
    #[allow(unsafe_code)]
    pub fn start(line: Vec<OsString>) -> io::Result<Guard> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let lockrun = getpid();
        let affinity = Affinity::now();
        // SAFETY: this process has one thread (the caller's promise), so the child may
        // run any code: no lock can be held by a thread that does not exist there.
        match unsafe { fork() }? {
            ForkResult::Child => {
                drop(ours);
                super::guardian::main(theirs, line, lockrun, affinity)
            }
            ForkResult::Parent { child } => {
                drop(theirs);
                // Beside lockrun, not behind it (`cpus.rs`).
                affinity.send_away(child);
                Ok(Guard {
                    pid: child,
                    sock: ours,
                })
            }
        }
    }

    /// Tells the guard that the command is the last `n` arguments of the line it was
    /// started with.
    pub fn command(&self, n: usize) -> io::Result<()> {
        let n = u32::try_from(n).map_err(io::Error::other)?;
        wire::send(self.sock.as_fd(), &ToGuard::Command(n), &[])
    }

    /// The guard's pid.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The socket to the guard (readable when it reports; end of file when it died).
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Asks the guard to start the command with lockrun's environment changed by `env`,
    /// keeping `hold` (descriptors whose open files hold the lock) open while the job
    /// lives. Waits at most `timeout` for the answer; a guard that does not answer is
    /// killed, with whatever it may have started.
    pub fn spawn(
        &self,
        env: &[EnvChange],
        hold: &[RawFd],
        timeout: Duration,
    ) -> Result<Spawned, SpawnError> {
        let lost =
            |what: &str| SpawnError::Guard(io::Error::other(format!("the guard process {what}")));
        // Stopped while lockrun took the lock, it would not answer: continue it first.
        let _ = kill(self.pid, Signal::SIGCONT);
        wire::send(self.sock.as_fd(), &ToGuard::Spawn(env.to_vec()), hold)
            .map_err(|e| lost(&format!("could not be asked to start the command ({e})")))?;
        let answer = if self.answers_within(timeout) {
            wire::recv_from_guard(self.sock.as_fd())
        } else {
            Ok(None)
        };
        match answer {
            Ok(Some(FromGuard::Spawned { pid, cgroup })) => Ok(Spawned {
                leader: Pid::from_raw(pid),
                boundary: match cgroup {
                    Some((dir, path)) => Boundary::Cgroup(Cgroup::at(dir.into(), path)),
                    None => Boundary::Tree,
                },
            }),
            Ok(Some(FromGuard::NotFound(errno))) => {
                Err(SpawnError::NotFound(io::Error::from_raw_os_error(errno)))
            }
            Ok(Some(FromGuard::CannotExecute(errno))) => Err(SpawnError::CannotExecute(
                io::Error::from_raw_os_error(errno),
            )),
            other => {
                // No answer, a wrong one, or a dead guard: it may have started the
                // command; nothing of it may run without the lock. lockrun is the
                // subreaper of whatever the guard leaves.
                let _ = kill(self.pid, Signal::SIGKILL);
                let gone = kill_left_by_guard(self.pid);
                let what = match other {
                    Err(_) | Ok(None) => "died or did not answer as it started the command",
                    Ok(Some(_)) => "answered out of turn as it started the command",
                };
                Err(SpawnError::GuardLost {
                    why: what.into(),
                    job_gone: gone,
                })
            }
        }
    }

    /// Gives the guard the lease's deadline (see [`super::Job::set_deadline`]).
    pub fn deadline(&self, since_boot: Duration) {
        let _ = wire::send_now(self.sock.as_fd(), &ToGuard::Deadline(since_boot));
    }

    /// Waits at most `timeout` for the guard's socket to be readable (an answer, or
    /// the end of file of a dead guard). A signal lockrun receives meanwhile (its
    /// handler only notes it for the runtime) does not cut the wait short.
    /// A guard stopped meanwhile (by the command it just started: it is its parent) is
    /// continued, so that it can answer.
    fn answers_within(&self, timeout: Duration) -> bool {
        let until = std::time::Instant::now() + timeout;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let ms = u16::try_from(left.min(LOOK_AGAIN).as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(n) if n > 0 => return true,
                Ok(_) | Err(nix::errno::Errno::EINTR) if !left.is_zero() => {
                    if tree::stat(self.pid.as_raw()).is_some_and(|p| p.stopped) {
                        let _ = kill(self.pid, Signal::SIGCONT);
                    }
                }
                Ok(_) | Err(_) => return false,
            }
        }
    }

    /// Tells the guard the run is over: it removes the cgroup, closes every descriptor
    /// (the lock's among them) and exits. Never waits: [`Guard::let_go_within`] waits
    /// for it to have let go. False if the guard is gone already (nothing to wait for).
    pub fn done(&self) -> bool {
        wire::send(self.sock.as_fd(), &ToGuard::Done, &[]).is_ok()
    }

    /// After [`Guard::done`]: waits at most `limit` for the guard to have let go of
    /// everything (its end of the socket closed); true if it has. Its exit may still be
    /// under way then: it holds nothing, and lockrun does not wait for it.
    pub fn let_go_within(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            match self.try_report() {
                Err(_) => return true,
                Ok(Some(_)) => continue,
                Ok(None) => {}
            }
            if !self.answers_within(until.saturating_duration_since(Instant::now())) {
                return false;
            }
        }
    }

    /// The next report, if one is waiting (`Ok(None)`: none yet); `Err` when the guard
    /// is gone (end of file).
    pub fn try_report(&self) -> io::Result<Option<FromGuard>> {
        wire::try_recv_from_guard(self.sock.as_fd())
    }
}

/// How often lockrun looks whether its guard is stopped while it waits for an answer.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// How long lockrun keeps killing what a lost guard left before it gives up (and then
/// leaves the lock to expire rather than release it).
const SETTLE: Duration = Duration::from_secs(5);

/// SIGKILLs every process below lockrun (what a guard that died as it started the
/// command may have left: lockrun is their subreaper), through the job's cgroup too,
/// again until none is left or [`SETTLE`] passed; then removes that cgroup, which
/// lockrun was not told of, reaping what was re-parented to it meanwhile. True when no
/// process is left.
fn kill_left_by_guard(guard: Pid) -> bool {
    let until = Instant::now() + SETTLE;
    let pids: Vec<i32> = tree::live_descendants(getpid().as_raw())
        .iter()
        .map(|p| p.pid)
        .collect();
    let cgroups = Cgroup::of_job(&pids);
    let gone = tree::kill_all(getpid().as_raw(), Some(until), || {
        cgroups.iter().for_each(|c| {
            let _ = c.kill();
        })
    });
    for c in &cgroups {
        while !c.remove() && Instant::now() < until {
            super::reap(guard, Pid::from_raw(0));
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    gone
}
