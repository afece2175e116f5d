//! The kill path waits on nothing (docs/guarantees.md, "Property 10 in detail"; issue 25, case
//! 3): lockrun's stderr is a pipe whose reader is alive but never reads, full before
//! lockrun starts, so every line lockrun writes would block. When renewals then fail
//! (the server down behind the proxy, or frozen), the job is still dead before the
//! lease can have expired, and lockrun still exits 124, soon after: lines it could not
//! write are lost, not waited for.
//!
//! As in the conformance suite's fault tests, the deadline counts from an instant the
//! test observed before the fault: lockrun's last renewal was sent before it.

use std::os::fd::OwnedFd;
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::support::*;

/// The lease of these tests.
const TTL: Duration = Duration::from_secs(2);

/// How long after its job is gone lockrun may take to exit.
const EXIT_WITHIN: Duration = Duration::from_secs(3);

/// A pipe full to the brim, in blocking mode: the read end (keep it, never read it)
/// and the write end (lockrun's stderr).
fn full_pipe() -> (OwnedFd, OwnedFd) {
    let (r, w) = nix::unistd::pipe().expect("pipe");
    let flags = OFlag::from_bits_truncate(fcntl(&w, FcntlArg::F_GETFL).expect("F_GETFL"));
    fcntl(&w, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).expect("F_SETFL");
    let chunk = [b'.'; 4096];
    loop {
        match nix::unistd::write(&w, &chunk) {
            Ok(_) => {}
            Err(Errno::EAGAIN) => break,
            Err(e) => panic!("fill the pipe: {e}"),
        }
    }
    // Small writes might still fit in the last page: fill it byte by byte.
    while nix::unistd::write(&w, b".").is_ok() {}
    // lockrun gets the same open file description: blocking, as a pipe normally is.
    fcntl(&w, FcntlArg::F_SETFL(flags)).expect("F_SETFL");
    (r, w)
}

/// Runs lockrun (`--ttl 2s`, default verbosity, or `-q` with `quiet`) around a job of
/// [`Shape::All`] on a Redis behind a proxy with its stderr a full pipe; applies
/// `fault` once it has renewed for a while; asserts the job dead by the instant before
/// the fault plus the TTL, and lockrun's exit 124 within [`EXIT_WITHIN`] after that.
fn kill_with_stderr_blocked(fault: impl FnOnce(&RedisServer, &Proxy), quiet: bool, what: &str) {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port());
    let s = Scratch::new();
    let reaper = Reaper::default();
    let job = Job::new(Shape::All, &s, "job");
    let mut opts = vec!["--ttl", "2s", "--kill-after", "30s"];
    if quiet {
        opts.push("-q");
    }
    let mut cmd = lockrun_run(&proxy.url(), "job", &opts, &job.command());
    job.env(&mut cmd);
    let (_reader, writer) = full_pipe();
    let mut lr = spawn_with_stderr(cmd, writer);
    reaper.add(lr.pid());
    let procs = job.wait_started(&reaper);
    thread::sleep(Duration::from_millis(1200)); // past a renewal or two
    assert!(lr.is_running(), "{what}: lockrun ended before the fault");
    let at = Instant::now();
    fault(&redis, &proxy);
    let deaths = watch_deaths(&procs, at, WAIT);
    assert!(
        deaths.alive.is_empty(),
        "{what}: processes of the job still alive {:?} after the fault: {:?}",
        deaths.last,
        deaths.alive
    );
    assert!(
        deaths.last <= TTL,
        "{what}: the job's last process died {:?} after the fault, when the lease (TTL \
         {TTL:?}) may already have expired",
        deaths.last
    );
    let f = lr.wait();
    let exited = f.ended - at;
    f.assert_code(124);
    assert!(
        exited <= deaths.last + EXIT_WITHIN,
        "{what}: lockrun exited {exited:?} after the fault, {:?} after its job was gone",
        exited.saturating_sub(deaths.last)
    );
    redis.resume();
}

#[test]
fn blocked_stderr_does_not_delay_the_kill_when_the_server_is_down() {
    let down = |_: &RedisServer, p: &Proxy| {
        p.set_mode(Mode::Refuse);
        p.cut();
    };
    kill_with_stderr_blocked(down, false, "server down, stderr blocked");
}

#[test]
fn blocked_stderr_does_not_delay_the_kill_when_the_server_is_frozen() {
    let freeze = |r: &RedisServer, _: &Proxy| r.pause();
    kill_with_stderr_blocked(freeze, false, "server frozen, stderr blocked");
}

#[test]
fn blocked_stderr_does_not_delay_the_exit_of_a_quiet_lockrun() {
    // `-q` writes only the last line; the issue saw it hang about 11 s on it.
    let hang = |_: &RedisServer, p: &Proxy| p.set_mode(Mode::Blackhole);
    kill_with_stderr_blocked(hang, true, "server hung, -q, stderr blocked");
}
