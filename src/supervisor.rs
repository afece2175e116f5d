//! The command's process group: spawn, signal, reap.
//!
//! The command runs as the leader of a new process group, so one `killpg` reaches
//! its grandchildren too. lockrun makes itself a child subreaper, so whatever the
//! command leaves behind is re-parented to lockrun: lockrun reaps it and can tell
//! when the group is really empty, instead of relying on the machine's PID 1. The
//! child gets `PR_SET_PDEATHSIG(SIGKILL)` so that it dies with lockrun, even when
//! lockrun is SIGKILLed. Linux ties that signal to the *thread* that forked, so the
//! spawn must happen on a thread that lives as long as lockrun: the main thread of
//! the current-thread runtime.
//!
//! Every `waitpid` in the process happens here, with `-1`: as PID 1 (a container) or
//! subreaper, lockrun reaps every orphan, and the leader's own status is recognised
//! by its pid. Nothing else in lockrun may wait for children. ESRCH from a signal
//! means the target is already gone and is not an error.
//!
//! A forwarded signal that was ignored when lockrun started (`nohup` ignores SIGHUP,
//! `trap '' INT` SIGINT) gets no handler: lockrun neither forwards it nor dies of it,
//! and since exec keeps an ignored disposition (only handled signals are reset), the
//! command inherits it ignored too, as it would without lockrun in between.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::errno::Errno;
use nix::sys::signal::{killpg, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpid, getppid, Pid};
use tokio::signal::unix::{signal, Signal as SignalStream, SignalKind};

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
}

/// A change lockrun makes to its own environment for the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvChange {
    /// Set this variable to this value.
    Set(&'static str, String),
    /// Leave this variable out.
    Remove(&'static str),
}

/// Makes lockrun the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`).
pub fn become_subreaper() -> nix::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// A running command: the leader of its own process group.
#[derive(Debug)]
pub struct Group {
    leader: Pid,
}

impl Group {
    /// Starts `argv` in a new process group with lockrun's environment changed by
    /// `env`, stdio inherited, and SIGKILL as its parent-death signal.
    pub fn spawn(argv: &[OsString], env: &[EnvChange]) -> Result<Group, SpawnError> {
        let (program, args) = argv.split_first().ok_or_else(|| {
            SpawnError::NotFound(io::Error::new(io::ErrorKind::NotFound, "empty command"))
        })?;
        let mut cmd = Command::new(program);
        cmd.args(args).process_group(0);
        for change in env {
            match change {
                EnvChange::Set(k, v) => cmd.env(k, v),
                EnvChange::Remove(k) => cmd.env_remove(k),
            };
        }
        set_death_signal(&mut cmd, getpid());
        match cmd.spawn() {
            // The std Child handle is dropped without waiting: reaping happens in
            // [`reap`], for every child at once.
            Ok(child) => Ok(Group {
                leader: Pid::from_raw(child.id() as i32),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(SpawnError::NotFound(e)),
            Err(e) => Err(SpawnError::CannotExecute(e)),
        }
    }

    /// The leader's pid, which is also the process group id.
    pub fn leader(&self) -> Pid {
        self.leader
    }

    /// Sends `sig` to every process of the group. A group already gone is fine.
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
    }

    /// True when no process of the group is left (zombies of lockrun's own must have
    /// been reaped first, see [`reap`]).
    pub fn is_empty(&self) -> bool {
        killpg(self.leader, None) == Err(Errno::ESRCH)
    }
}

/// Between fork and exec: ask for SIGKILL when lockrun dies, and close the race where
/// lockrun died before the request was made.
#[allow(unsafe_code)]
fn set_death_signal(cmd: &mut Command, parent: Pid) {
    // SAFETY: the closure runs in the forked child before exec. It makes only
    // async-signal-safe system calls (prctl, getppid, sigprocmask) and does not
    // allocate or take locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if getppid() != parent {
                // lockrun is already gone: never run the command without the lock.
                return Err(io::Error::from(Errno::ESRCH));
            }
            nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
                .map_err(io::Error::from)?;
            Ok(())
        });
    }
}

/// Reaps every child that has ended (the leader, orphans re-parented to lockrun, any
/// zombie when lockrun is PID 1) and returns the leader's exit if it was among them.
pub fn reap(leader: Pid) -> Option<ChildExit> {
    let mut found = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == leader => {
                found = Some(ChildExit::Code(u8::try_from(code).unwrap_or(255)));
            }
            Ok(WaitStatus::Signaled(pid, sig, _core)) if pid == leader => {
                found = Some(ChildExit::Signal(sig as i32));
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
