//! Processes: the real `lockrun` binary run with a clean environment and its output
//! captured, waiting for it with a deadline, and looking at processes (state, death,
//! signals) through `/proc`.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use lockrun::supervisor::FORWARDED;
use nix::sys::signal::{kill, killpg, signal, SigHandler, Signal};
use nix::unistd::Pid;

use super::{serial, wait_line, wait_pid, Scratch, POLL, WAIT};

/// The lockrun binary under test: this build's, unless `LOCKRUN_TEST_BINARY` points
/// the suite at another build of the same sources (such as the static release binary
/// that the packages ship).
pub fn lockrun_binary() -> String {
    std::env::var("LOCKRUN_TEST_BINARY")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_lockrun").to_owned())
}

/// Polls `cond` until it holds and returns how long that took; panics naming `what` after
/// `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting until {what}");
        }
        thread::sleep(POLL);
    }
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T`, `Z`, ...), or `None` if no such process.
pub fn proc_state(pid: i32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: the state follows the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.trim_start().chars().next()
}

/// True when the process no longer runs: gone, or a zombie waiting to be reaped.
pub fn is_dead(pid: i32) -> bool {
    matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// True when the process exists and is not a zombie.
pub fn is_alive(pid: i32) -> bool {
    !is_dead(pid)
}

/// Sends `sig` to `pid`, ignoring "no such process".
pub fn signal_pid(pid: i32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid), sig);
}

/// This machine's host name, as lockrun should record it.
pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("read hostname")
        .trim()
        .to_string()
}

/// Asserts that `pid` is dead (gone or a zombie) by `deadline` at the latest, polling
/// until then; returns how long after `fault_at` it was first seen dead. `what` names the
/// fault in the failure message.
pub fn assert_dead_by(pid: i32, fault_at: Instant, deadline: Instant, what: &str) -> Duration {
    loop {
        let now = Instant::now();
        if is_dead(pid) {
            return now - fault_at;
        }
        if now >= deadline {
            // One last look: the process may have died between the two checks.
            assert!(
                is_dead(pid),
                "{what}: the command (pid {pid}, state {:?}) was still alive {:?} after the \
                 fault, when the lease may already have expired",
                proc_state(pid),
                now - fault_at
            );
            return now - fault_at;
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Kills on drop the process groups and processes registered with it: a safety net for the
/// commands and grandchildren a test learns about, in case lockrun leaves them behind.
#[derive(Default)]
pub struct Reaper {
    pids: Mutex<Vec<i32>>,
}

impl Reaper {
    /// Registers `pid` (and the group it leads, if any) to be SIGKILLed on drop.
    pub fn add(&self, pid: i32) {
        self.pids.lock().unwrap().push(pid);
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in self.pids.lock().unwrap().iter() {
            if is_alive(pid) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                signal_pid(pid, Signal::SIGKILL);
            }
        }
    }
}

/// `lockrun` with no `LOCKRUN_*` variable inherited from the developer's environment and
/// stdin from /dev/null.
pub fn lockrun() -> Command {
    serial::side_by_side();
    let mut cmd = Command::new(lockrun_binary());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKRUN_") {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// `lockrun --url URL OPTS... NAME -- COMMAND...`
pub fn lockrun_run(url: &str, name: &str, opts: &[&str], command: &[&str]) -> Command {
    let mut cmd = lockrun();
    cmd.arg("--url")
        .arg(url)
        .args(opts)
        .arg(name)
        .arg("--")
        .args(command);
    cmd
}

/// A command that writes its fencing token to `$STARTED`, then runs until `$GO` exists
/// (see [`hold`]).
pub const HOLD: &str =
    r#"echo "$LOCKRUN_FENCING_TOKEN" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// A command that records its pid in `$PIDFILE`, then sleeps for a minute (SIGTERM ends
/// it; see [`spawn_recording_pid`]).
pub const SLEEPER: &str = r#"echo $$ > "$PIDFILE"; exec sleep 60"#;

/// Spawns `cmd`, a lockrun running [`HOLD`], with `$STARTED` and `$GO` in `s`; returns it
/// and its fencing token once its command runs. `s.touch("go")` lets the command end.
pub fn hold(mut cmd: Command, s: &Scratch) -> (Running, u128) {
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let holder = spawn(cmd);
    let token = parse_token(&wait_line(&s.path("started")));
    (holder, token)
}

/// `lockrun --url URL OPTS... NAME -- sh -c HOLD`, started with [`hold`].
pub fn start_holder(url: &str, name: &str, s: &Scratch, opts: &[&str]) -> (Running, u128) {
    hold(lockrun_run(url, name, opts, &sh(HOLD)), s)
}

/// Spawns `cmd`, a lockrun whose command records its pid in `$PIDFILE` (like
/// [`SLEEPER`]), with `$PIDFILE` and `$LOG` in `s`; returns it and its command's pid once
/// recorded, registered with `reaper` in case it outlives the test.
///
/// Panics with lockrun's stderr if lockrun ends first or the pid does not come within
/// `WAIT`.
pub fn spawn_recording_pid(mut cmd: Command, s: &Scratch, reaper: &Reaper) -> (Running, i32) {
    let path = s.path("pid");
    cmd.env("PIDFILE", &path).env("LOG", s.path("log"));
    let mut lr = spawn(cmd);
    let start = Instant::now();
    let recorded = || fs::read_to_string(&path).is_ok_and(|t| t.ends_with('\n'));
    while !recorded() {
        let running = lr.is_running();
        // (Looked at again once lockrun has ended: the command may have recorded its
        // pid and ended, and lockrun with it, since the last look.)
        if (!running && !recorded()) || start.elapsed() > WAIT {
            panic!(
                "the command recorded no pid in {path:?} ({:?} after lockrun started: \
                 lockrun {}); lockrun's stderr so far:\n{}",
                start.elapsed(),
                if running { "still runs" } else { "ended" },
                lr.stderr_so_far()
            );
        }
        thread::sleep(POLL);
    }
    let pid = wait_pid(&path);
    reaper.add(pid);
    (lr, pid)
}

/// `["sh", "-c", script]`
pub fn sh(script: &str) -> Vec<&str> {
    vec!["sh", "-c", script]
}

/// How a lockrun process ended, with what it printed.
#[derive(Clone, Debug)]
pub struct Finished {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The raw status.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    /// From spawn to the moment the test saw it end.
    pub elapsed: Duration,
    /// The moment the test saw it end.
    pub ended: Instant,
}

impl Finished {
    /// Panics unless the exit code is `code`, showing stderr.
    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "expected exit code {code}, got {:?}\n--- stderr:\n{}\n--- stdout:\n{}",
            self.status,
            self.stderr,
            self.stdout
        );
        self
    }

    /// The first stderr line beginning `lockrun: `, if any.
    pub fn lockrun_line(&self) -> Option<&str> {
        self.stderr.lines().find(|l| l.starts_with("lockrun: "))
    }

    /// Panics unless lockrun explained itself: a `lockrun: ` line on stderr, and no panic or
    /// Rust debug dump.
    pub fn assert_explained(&self) -> &Self {
        assert!(
            self.lockrun_line().is_some(),
            "expected a line beginning 'lockrun: ' on stderr (status {:?}), got:\n{}",
            self.status,
            self.stderr
        );
        for bad in ["panicked", "RUST_BACKTRACE", "Os {", "Error {", "kind: "] {
            assert!(
                !self.stderr.contains(bad),
                "stderr looks like a panic or a debug dump ({bad:?}):\n{}",
                self.stderr
            );
        }
        self
    }

    /// `assert_code(code)` and `assert_explained()`.
    pub fn assert_failure(&self, code: i32) -> &Self {
        self.assert_code(code).assert_explained()
    }

    /// Asserts a refused set-up: exit 125 and one line on stderr, given within `within`
    /// (a refusal is told at once, not after retries), holding each of `says` and none
    /// of `never` (passwords, key material). `what` names the case in a failure.
    pub fn assert_refused_in_one_line(
        &self,
        what: &str,
        within: Duration,
        says: &[&str],
        never: &[&str],
    ) -> &Self {
        self.assert_failure(125);
        let err = &self.stderr;
        assert_eq!(err.lines().count(), 1, "{what}: one line:\n{err}");
        assert!(
            self.elapsed < within,
            "{what}: took {:?}:\n{err}",
            self.elapsed
        );
        for said in says {
            assert!(err.contains(said), "{what}: {said:?} in:\n{err}");
        }
        for never in never {
            assert!(!err.contains(never), "{what}: {never:?} in:\n{err}");
        }
        self
    }
}

/// A running lockrun (or other) process; SIGKILLed and reaped on drop if still running.
pub struct Running {
    child: Child,
    out: File,
    err: File,
    started: Instant,
    finished: Option<Finished>,
}

/// Spawns `cmd` with stdout and stderr captured in temporary files (not pipes: a leftover
/// grandchild holding a pipe open must not hang the test), and the signals lockrun
/// forwards ([`FORWARDED`]) at their default disposition whatever the suite inherited:
/// run under `nohup` (SIGHUP ignored) or as a background job of a script (SIGINT and
/// SIGQUIT ignored), lockrun would rightly leave them ignored and the forwarding tests
/// would wait in vain. A test that wants one ignored sets it itself
/// (`supervisor::ignored`).
pub fn spawn(cmd: Command) -> Running {
    let err = tempfile::tempfile().expect("temp file");
    start(cmd, err.try_clone().unwrap(), err)
}

/// [`spawn`] with stderr given to the process as `stderr` (a pipe nobody reads, say):
/// what it writes there is not captured.
pub fn spawn_with_stderr(cmd: Command, stderr: impl Into<Stdio>) -> Running {
    start(cmd, stderr, tempfile::tempfile().expect("temp file"))
}

/// Spawns `cmd` with `stderr`; `err` is what [`Running`] reads as its stderr.
#[allow(unsafe_code)]
fn start(mut cmd: Command, stderr: impl Into<Stdio>, err: File) -> Running {
    serial::side_by_side();
    // SAFETY: between fork and exec only sigaction(2) is called, which is
    // async-signal-safe; nothing is allocated or locked.
    unsafe {
        cmd.pre_exec(|| {
            for sig in FORWARDED {
                signal(sig, SigHandler::SigDfl).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    let out = tempfile::tempfile().expect("temp file");
    cmd.stdout(out.try_clone().unwrap());
    cmd.stderr(stderr);
    let started = Instant::now();
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    Running {
        child,
        out,
        err,
        started,
        finished: None,
    }
}

/// Runs `cmd` to its end (at most `WAIT`).
pub fn run(cmd: Command) -> Finished {
    spawn(cmd).wait()
}

impl Running {
    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// When it was spawned.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Sends `sig` to it (not to its command).
    pub fn signal(&self, sig: Signal) {
        if self.finished.is_none() {
            signal_pid(self.pid(), sig);
        }
    }

    /// `Some` once it has ended (reaping it).
    pub fn try_finish(&mut self) -> Option<Finished> {
        if self.finished.is_none() {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let ended = Instant::now();
                self.finished = Some(Finished {
                    code: status.code(),
                    status,
                    stdout: read_all(&mut self.out),
                    stderr: read_all(&mut self.err),
                    elapsed: ended - self.started,
                    ended,
                });
            }
        }
        self.finished.clone()
    }

    /// What it wrote on stderr so far (while it runs: to wait for a log line).
    pub fn stderr_so_far(&mut self) -> String {
        match &self.finished {
            Some(f) => f.stderr.clone(),
            None => read_all(&mut self.err),
        }
    }

    /// True while it has not ended.
    pub fn is_running(&mut self) -> bool {
        self.try_finish().is_none()
    }

    /// Waits for its end, at most `WAIT`.
    pub fn wait(&mut self) -> Finished {
        self.wait_for(WAIT)
    }

    /// Waits for its end, at most `timeout`; on timeout kills it and panics with its stderr.
    pub fn wait_for(&mut self, timeout: Duration) -> Finished {
        let start = Instant::now();
        loop {
            if let Some(f) = self.try_finish() {
                return f;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "process {} still running after {timeout:?}; stderr so far:\n{}",
                    self.pid(),
                    read_all(&mut self.err)
                );
            }
            thread::sleep(POLL);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.finished.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn read_all(f: &mut File) -> String {
    let mut s = String::new();
    let _ = f.seek(SeekFrom::Start(0));
    let _ = f.read_to_string(&mut s);
    s
}

/// Parses a fencing token as lockrun hands it to the command.
pub fn parse_token(s: &str) -> u128 {
    let t: u128 = s
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("fencing token {s:?} is not a decimal integer"));
    assert!(t > 0, "fencing token must be > 0, got {t}");
    t
}
