//! Starting the command from the guard straight into its cgroup: `clone3` with
//! `CLONE_INTO_CGROUP` (Linux 5.7). Part of [`super`]; depends on `nix`'s `libc` only.
//!
//! Why not std's spawn and a write to `cgroup.procs`: a process that *moves* into a
//! cgroup makes the kernel wait for an RCU grace period (about 5 ms here, tens of ms on
//! a loaded machine), which would more than double the cost of a short locked job. A
//! process *born* in the cgroup costs nothing more than a fork. Where `clone3` is
//! refused (an older kernel, a seccomp filter), the guard falls back to std's spawn
//! and the process tree alone.
//!
//! Between `clone3` and `execve` the child does what std's spawn does for lockrun:
//! parent-death signal, new process group, SIGPIPE back to its default (Rust ignores
//! it), no signal blocked, then the `PATH` search of `execvp`. Everything it needs is
//! built before the call: the child only makes async-signal-safe system calls.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nix::libc::{self, c_char};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::EnvChange;

/// `struct clone_args` of `clone3(2)`, up to `cgroup` (Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The command, ready for `execve`: the paths to try, its arguments and environment.
pub struct Exec {
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Exec {
    /// `argv` with lockrun's environment: made as soon as the guard knows the command,
    /// beside the acquire; the variables lockrun sets for the command come with the
    /// order to start it ([`Exec::change_env`]).
    pub fn new(argv: &[OsString]) -> io::Result<Exec> {
        let program = argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "empty command"))?;
        let candidates = if program.as_bytes().contains(&b'/') {
            vec![c_string(program.as_bytes())?]
        } else {
            let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
            let mut out = Vec::new();
            for dir in path.as_bytes().split(|&b| b == b':') {
                let mut full = if dir.is_empty() {
                    b".".to_vec()
                } else {
                    dir.to_vec()
                };
                full.push(b'/');
                full.extend_from_slice(program.as_bytes());
                out.push(c_string(&full)?);
            }
            out
        };
        let mut envp = Vec::new();
        for (k, v) in std::env::vars_os() {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            envp.push(c_string(&kv)?);
        }
        Ok(Exec {
            candidates,
            argv: argv
                .iter()
                .map(|a| c_string(a.as_bytes()))
                .collect::<io::Result<_>>()?,
            envp,
        })
    }

    /// Changes the command's environment by `env`, in order: a variable set replaces
    /// any of the same name, one removed is left out.
    pub fn change_env(&mut self, env: &[EnvChange]) -> io::Result<()> {
        for change in env {
            let (EnvChange::Set(name, _) | EnvChange::Remove(name)) = change;
            self.envp
                .retain(|kv| var_name(kv.as_bytes()) != name.as_bytes());
            if let EnvChange::Set(name, value) = change {
                self.envp
                    .push(c_string(format!("{name}={value}").as_bytes())?);
            }
        }
        Ok(())
    }
}

/// `bytes` as a C string; a NUL byte in them is the command's fault.
fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the command"))
}

/// The name in `NAME=value`, as std's `vars_os` reads it: up to the first `=` after
/// the first byte.
fn var_name(kv: &[u8]) -> &[u8] {
    match kv.iter().skip(1).position(|&b| b == b'=') {
        Some(i) => &kv[..=i],
        None => kv,
    }
}

/// Why [`spawn_into`] did not start the command.
#[derive(Debug)]
pub enum Refused {
    /// `clone3` itself was refused: start it another way.
    Clone,
    /// The command could not be executed (the errno of the last `execve`).
    Exec(io::Error),
}

/// Starts `exec` as a child of this process, born in the cgroup whose directory is
/// `cgroup`, leader of a new process group, with SIGKILL as its parent-death signal
/// (checked against `parent`, this process). Returns its pid once it has executed.
#[allow(unsafe_code)]
pub fn spawn_into(exec: &Exec, cgroup: BorrowedFd<'_>, parent: Pid) -> Result<Pid, Refused> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Refused::Clone);
    }
    // SAFETY: both descriptors were just made and belong to nobody else.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let argv: Vec<*const c_char> = exec
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const c_char> = exec
        .envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let ctx = ChildCtx {
        exec,
        argv: &argv,
        envp: &envp,
        report: write_end.as_raw_fd(),
        parent,
    };
    let pid = clone_into(cgroup, &ctx);
    if pid < 0 {
        return Err(Refused::Clone);
    }
    drop(write_end);
    exec_result(read_end, Pid::from_raw(pid as i32))
}

/// What the child needs between `clone3` and `execve`, all prepared before the call.
struct ChildCtx<'a> {
    exec: &'a Exec,
    argv: &'a [*const c_char],
    envp: &'a [*const c_char],
    /// The pipe's write end, closed at a successful exec.
    report: i32,
    parent: Pid,
}

/// The child's stack on x86_64 (see [`clone_into`]): the child makes system calls
/// only, with a few frames of its own.
#[cfg(target_arch = "x86_64")]
const CHILD_STACK: usize = 64 * 1024;

/// `clone3` into `cgroup`, the child running [`child`] on `ctx`; the child's pid, or
/// a negative number when `clone3` was refused.
///
/// On x86_64 the child shares this process's memory until it executes (`CLONE_VM |
/// CLONE_VFORK`, as `posix_spawn` does): no page table is copied for it and none torn
/// down at its exec, and this thread sleeps until it has executed or exited. It runs on
/// a stack of its own, entered in assembly straight from the system call, so that it
/// never returns through a frame this thread will use again. Elsewhere it is a fork.
fn clone_into(cgroup: BorrowedFd<'_>, ctx: &ChildCtx<'_>) -> i64 {
    let mut args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    #[cfg(target_arch = "x86_64")]
    return clone_sharing(&mut args, ctx);
    #[cfg(not(target_arch = "x86_64"))]
    return clone_forking(&mut args, ctx);
}

/// x86_64's `clone3` for [`clone_into`]: the child shares this process's memory, on a
/// stack of its own, until it executes.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn clone_sharing(args: &mut CloneArgs, ctx: &ChildCtx<'_>) -> i64 {
    // 16-byte units, so that the top of the stack is aligned as a call needs. Left
    // uninitialised: the child writes before it reads, and zeroing 64 KiB would fault in
    // all 16 pages for the one or two it uses.
    let mut stack: Vec<std::mem::MaybeUninit<u128>> = Vec::with_capacity(CHILD_STACK / 16);
    args.flags |= (libc::CLONE_VM | libc::CLONE_VFORK) as u64;
    args.stack = stack.as_mut_ptr() as u64;
    args.stack_size = CHILD_STACK as u64;
    let ret: i64;
    // SAFETY: clone3 with CLONE_VM | CLONE_VFORK and a stack of its own: the child
    // starts on `stack` right after the `syscall` instruction, calls `child_entry` with
    // `ctx` (r12 is kept across the system call) and never comes back; it writes
    // nothing but its own stack and makes async-signal-safe system calls. This thread
    // resumes once the child has executed or exited, with `stack` and `ctx` still
    // alive; its own stack is untouched (`nostack`).
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "and rsp, -16",
            "mov rdi, r12",
            "call {entry}",
            "ud2",
            "2:",
            entry = sym child_entry,
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") ctx as *const ChildCtx<'_>,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    drop(stack);
    ret
}

/// Other architectures' `clone3` for [`clone_into`]: a fork.
#[cfg(not(target_arch = "x86_64"))]
#[allow(unsafe_code)]
fn clone_forking(args: &mut CloneArgs, ctx: &ChildCtx<'_>) -> i64 {
    // SAFETY: clone3 without CLONE_VM is a fork: the child gets a copy of this
    // (single-threaded) process and runs only `child`, which makes async-signal-safe
    // calls on memory prepared before the call and never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid == 0 {
        // SAFETY: see above; the pointers stay valid (this is a copy of the memory).
        unsafe { child_entry(ctx) }
    }
    pid
}

/// The child's first Rust code after `clone3`: never returns.
#[allow(unsafe_code)]
unsafe extern "C" fn child_entry(ctx: *const ChildCtx<'_>) -> ! {
    // SAFETY: `ctx` points to the parent's `ChildCtx`, alive until the child executes
    // or exits (the parent waits for that, or this is a copy of its memory).
    unsafe {
        let ctx = &*ctx;
        child(ctx.exec, ctx.argv, ctx.envp, ctx.report, ctx.parent)
    }
}

/// Waits for the child's `execve`: the end of file on `read_end` (closed at a
/// successful exec) gives its pid; an errno written there means it could not execute,
/// and it is reaped.
#[allow(unsafe_code)]
fn exec_result(read_end: OwnedFd, pid: Pid) -> Result<Pid, Refused> {
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        // SAFETY: reads into the part of `errno` not filled yet.
        let n = unsafe {
            libc::read(
                read_end.as_raw_fd(),
                errno[got..].as_mut_ptr().cast(),
                errno.len() - got,
            )
        };
        match n {
            // End of file: the descriptor closed at a successful exec.
            0 => return Ok(pid),
            n if n > 0 => got += n as usize,
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    // It wrote why it could not execute, and exited: reap it.
    let _ = waitpid(pid, None);
    Err(Refused::Exec(io::Error::from_raw_os_error(
        i32::from_ne_bytes(errno),
    )))
}

/// The child between `clone3` and `execve`: never returns.
#[allow(unsafe_code)]
unsafe fn child(
    exec: &Exec,
    argv: &[*const c_char],
    envp: &[*const c_char],
    report: i32,
    parent: Pid,
) -> ! {
    // SAFETY (the whole body): async-signal-safe system calls only, on memory that was
    // ready before the clone; no allocation, no lock.
    unsafe {
        let fail = |errno: i32| -> ! {
            let bytes = errno.to_ne_bytes();
            libc::write(report, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127)
        };
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            fail(*libc::__errno_location());
        }
        if libc::getppid() != parent.as_raw() {
            // The guard is already gone: never run the command unguarded.
            fail(libc::ESRCH);
        }
        libc::setpgid(0, 0);
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // execvp's search: go on past a missing file, remember a refused one.
        let mut errno = libc::ENOENT;
        let mut refused = false;
        for path in &exec.candidates {
            libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
            match *libc::__errno_location() {
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                libc::EACCES => refused = true,
                other => {
                    errno = other;
                    break;
                }
            }
        }
        if refused && errno == libc::ENOENT {
            errno = libc::EACCES;
        }
        fail(errno)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(exec: &Exec) -> Vec<String> {
        exec.envp
            .iter()
            .map(|kv| kv.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_order_sets_and_removes_variables_once_each() {
        let mut exec = Exec::new(&["true".into()]).unwrap();
        let before = env_of(&exec);
        let path = before.iter().find(|kv| kv.starts_with("PATH=")).cloned();
        let set = |k: &str, v: &str| EnvChange::Set(k.into(), v.into());
        let changes = [
            set("LOCKRUN_T", "1"),
            set("LOCKRUN_T", "2"),
            EnvChange::Remove("PATH".into()),
            set("LOCKRUN_U", "a=b"),
        ];
        exec.change_env(&changes).unwrap();
        let after = env_of(&exec);
        assert_eq!(
            after
                .iter()
                .filter(|kv| kv.starts_with("LOCKRUN_T="))
                .count(),
            1
        );
        assert!(after.contains(&"LOCKRUN_T=2".to_owned()), "{after:?}");
        assert!(after.contains(&"LOCKRUN_U=a=b".to_owned()), "{after:?}");
        assert!(!after.iter().any(|kv| kv.starts_with("PATH=")), "{after:?}");
        // Nothing else changed.
        let kept: Vec<&String> = before
            .iter()
            .filter(|kv| Some(*kv) != path.as_ref())
            .collect();
        assert!(kept.iter().all(|kv| after.contains(kv)));
        assert_eq!(after.len(), kept.len() + 2);
    }

    #[test]
    fn a_name_is_read_as_std_reads_it() {
        assert_eq!(var_name(b"A=1"), b"A");
        assert_eq!(var_name(b"A=1=2"), b"A");
        assert_eq!(var_name(b"=A=1"), b"=A");
        assert_eq!(var_name(b"NOVALUE"), b"NOVALUE");
    }
}
