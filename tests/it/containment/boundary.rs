//! Which boundary holds a run's job, said in one line at `-v` (JSON event
//! `contained`): run as root with a writable cgroup v2 hierarchy (as the tests are
//! here), the job runs in a child cgroup `lockrun-PID` of lockrun's own, removed once
//! the run is over; run unprivileged, the process tree (the guard as the job's
//! subreaper) holds it, and still nothing of the job outlives a SIGKILLed lockrun.
//! Either way the command inherits what it did before the guard: its stdio and nothing
//! else (no descriptor of the guard's, no lock file).

use std::fs;
use std::os::unix::fs::chown;
use std::path::Path;
use std::time::Instant;

use nix::sys::signal::Signal;
use serde_json::Value;

use super::each_shape;
use crate::support::*;

/// The uid and gid the unprivileged runs use (`nobody`).
const NOBODY: u32 = 65534;

/// `cmd` run as `nobody`, with no supplementary groups.
pub(super) fn as_nobody(cmd: &std::process::Command) -> std::process::Command {
    wrapped(
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
        cmd,
    )
}

/// Hands `dir` to `nobody`.
pub(super) fn give_to_nobody(dir: &Path) {
    chown(dir, Some(NOBODY), Some(NOBODY))
        .unwrap_or_else(|e| panic!("chown {}: {e}", dir.display()));
}

/// The `contained` lines of a JSON log; panics unless there is exactly one, and
/// returns its message.
fn contained_line(stderr: &str) -> String {
    let lines: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "contained")
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one `contained` line at -v, naming the boundary:\n{stderr}"
    );
    assert_eq!(lines[0]["level"], "info", "{}", lines[0]);
    lines[0]["msg"].as_str().unwrap_or_default().to_owned()
}

/// The cgroup v2 path (`0::PATH` of `/proc/PID/cgroup`) of `pid`.
fn cgroup_of(pid: i32) -> String {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("read cgroup");
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 line")
        .to_owned()
}

/// Where the cgroup v2 hierarchy is mounted.
fn cgroup2_mount() -> String {
    let mounts = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    mounts
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            right
                .starts_with("cgroup2 ")
                .then(|| left.split_whitespace().nth(4).map(str::to_owned))?
        })
        .expect("a cgroup2 mount")
}

#[test]
fn as_root_the_job_runs_in_a_cgroup_of_its_own_named_at_v() {
    let b = Backend::new(FileService::start());
    let s = Scratch::new();
    let mut cmd = b.run(
        "job",
        &["-v", "--log-format", "json"],
        &sh(r#"echo $$ > "$PIDFILE"; while [ ! -e "$GO" ]; do sleep 0.01; done"#),
    );
    cmd.env("PIDFILE", s.path("pid")).env("GO", s.path("go"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    let own = cgroup_of(lr.pid());
    let job = cgroup_of(pid);
    let expected = format!("{}/lockrun-{}", own.trim_end_matches('/'), lr.pid());
    assert_eq!(job, expected, "the command's cgroup (lockrun's is {own:?})");
    s.touch("go");
    let f = lr.wait();
    f.assert_code(0);
    let msg = contained_line(&f.stderr);
    assert!(msg.contains("cgroup"), "the boundary line: {msg:?}");
    let dir = format!("{}{expected}", cgroup2_mount());
    assert!(
        !Path::new(&dir).exists(),
        "lockrun left its job's cgroup {dir} behind"
    );
}

#[test]
fn unprivileged_the_process_tree_holds_the_job_named_at_v() {
    let files = FileService::start();
    give_to_nobody(files.root());
    let b = Backend::new(files);
    let cmd = b.run("job", &["-v", "--log-format", "json"], &["true"]);
    let f = run(as_nobody(&cmd));
    f.assert_code(0);
    let msg = contained_line(&f.stderr);
    assert!(msg.contains("process tree"), "the boundary line: {msg:?}");
}

#[test]
fn unprivileged_lockrun_sigkilled_leaves_no_process_of_any_job_shape() {
    // Without a cgroup of its own, the guard alone holds the job: every shape, as
    // `nobody`, on file:// (a directory of nobody's).
    let files = FileService::start();
    give_to_nobody(files.root());
    let b = Backend::new(files);
    let figures = each_shape(&Shape::EVERY, |shape, i| {
        let what = format!("unprivileged, SIGKILL, {}", shape.name());
        let name = format!("job{i}");
        let s = Scratch::new();
        give_to_nobody(&s.path(""));
        let reaper = Reaper::default();
        let job = Job::new(shape, &s, "job");
        let mut cmd = b.run(&name, &[], &job.command());
        job.env(&mut cmd);
        let mut lr = spawn(as_nobody(&cmd));
        reaper.add(lr.pid());
        let procs = job.wait_started(&reaper);
        // (A lock directory of nobody's is refused to root: the next holder is nobody.)
        let next = as_nobody(&b.run(&name, &["--wait", "30s"], &next_holder_command()));
        let mut next = NextHolder::spawn(next, &s, "next", &procs);
        lr.signal(Signal::SIGKILL);
        lr.wait();
        let dead = Instant::now();
        let deaths = watch_deaths(&procs, dead, WAIT);
        next.assert_no_survivors(&what);
        deaths.assert_within(CONTAINED_WITHIN, &what);
        format!("{}: {:?}", shape.name(), deaths.last)
    });
    eprintln!("unprivileged SIGKILL on file: {}", figures.join("; "));
}

#[test]
fn the_command_inherits_its_stdio_and_no_other_descriptor() {
    // lockrun is spawned with stdin, stdout and stderr only; the guard between lockrun
    // and the command (its socket, the lock file it holds) must not show through.
    for b in [
        Backend::new(FileService::start()),
        Backend::new(RedisServer::start()),
    ] {
        // (perl opens nothing of its own for `-e`; a shell may keep one of its own.)
        let list = r#"for (0..1023) { print "$_\n" if open(my $f, "<&=", $_) }"#;
        let f = run(b.run("job", &[], &["perl", "-e", list]));
        f.assert_code(0);
        let mut fds: Vec<u32> = f
            .stdout
            .split_whitespace()
            .filter_map(|fd| fd.parse().ok())
            .collect();
        fds.sort_unstable();
        assert_eq!(
            fds,
            inherited_fds(),
            "the command's descriptors:\n{}",
            f.stdout
        );
    }
}

/// The descriptors a process spawned by the test inherits: its stdio, and whatever the
/// test itself inherited without close-on-exec (from the shell that ran `cargo test`;
/// `/proc/self/fdinfo/N` shows O_CLOEXEC, 02000000, among the flags of a descriptor
/// closed on exec).
fn inherited_fds() -> Vec<u32> {
    let mut fds = vec![0, 1, 2];
    for e in fs::read_dir("/proc/self/fdinfo").unwrap().flatten() {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let info = fs::read_to_string(e.path()).unwrap_or_default();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u32::from_str_radix(f.trim(), 8).ok());
        if fd > 2 && flags.is_some_and(|f| f & 0o2_000_000 == 0) {
            fds.push(fd);
        }
    }
    fds.sort_unstable();
    fds
}

#[test]
fn lockruns_in_pid_namespaces_never_share_a_cgroup() {
    // Every lockrun that is PID 1 of a namespace of its own (containers sharing a
    // cgroup, `unshare --pid`) would name its job's cgroup `lockrun-1`. A waits for a
    // busy lock, with its cgroup made and still empty; B, in another namespace, starts
    // meanwhile. B must not take A's cgroup over (nor A B's once A's command starts):
    // else B's clean-up, or a kill of B's job, reaches A's job, which runs under a lock
    // B does not hold.
    let b = Backend::new(FileService::start());
    let s = Scratch::new();
    // A cgroup of the test's own for A and B, so that no other test's `lockrun-1` is in
    // the way (the cgroup v2 hierarchy is the machine's).
    let parent = format!(
        "{}{}/lockrun-test-{}-shared",
        cgroup2_mount(),
        cgroup_of(std::process::id() as i32).trim_end_matches('/'),
        std::process::id()
    );
    let _ = fs::remove_dir(&parent);
    fs::create_dir(&parent).unwrap_or_else(|e| panic!("mkdir {parent}: {e}"));
    let _rmdir = RemoveDir(parent.clone());
    // (Dropped first: what it kills leaves the cgroups empty.)
    let reaper = Reaper::default();
    let (mut holder, _) = hold(b.run("x", &[], &sh(HOLD)), &s);
    let record = r#"echo $$ > "$PIDFILE"; grep ^0:: /proc/self/cgroup > "$CG"
                    while [ ! -e "$GO" ]; do sleep 0.01; done"#;
    let in_namespace = |name: &str, opts: &[&str], tag: &str| {
        let mut cmd = b.run(name, opts, &sh(record));
        cmd.env("PIDFILE", s.path(&format!("{tag}.pid")))
            .env("CG", s.path(&format!("{tag}.cg")))
            .env("GO", s.path(&format!("{tag}.go")));
        // In the test's cgroup, then in a PID namespace of its own.
        let into = r#"echo $$ > "$1/cgroup.procs" && shift && exec "$@""#;
        let unshare = ["unshare", "--pid", "--fork", "--mount-proc"];
        let prefix: Vec<&str> = ["sh", "-c", into, "sh", &parent]
            .into_iter()
            .chain(unshare)
            .collect();
        spawn(wrapped(&prefix, &cmd))
    };
    // (Killing unshare leaves its lockrun running: the reaper kills it, the namespace's
    // init, and the kernel the rest.)
    let mut a = in_namespace("x", &["--wait", "30s"], "a");
    reaper.add(only_child(a.pid()));
    // Let A make its cgroup and settle into waiting.
    let settle = Instant::now();
    while settle.elapsed() < std::time::Duration::from_millis(700) {
        assert!(a.is_running(), "A ended: {:?}", a.try_finish());
        std::thread::sleep(POLL);
    }
    let mut b_run = in_namespace("y", &[], "b");
    reaper.add(only_child(b_run.pid()));
    let b_cgroup = wait_line(&s.path("b.cg"));
    s.touch("go");
    holder.wait().assert_code(0);
    let a_cgroup = wait_line(&s.path("a.cg"));
    assert_ne!(a_cgroup, b_cgroup, "two lockruns' jobs share a cgroup");
    // B ends: its clean-up must leave A's command alone.
    let inner = wait_pid(&s.path("a.pid"));
    // (sh execs unshare, whose child is lockrun.)
    let a_pid = pids_in_namespace_of(only_child(a.pid()))[&inner];
    reaper.add(a_pid);
    s.touch("b.go");
    b_run.wait().assert_code(0);
    assert!(a.is_running(), "A ended with B: {:?}", a.try_finish());
    assert!(
        is_alive(a_pid),
        "B's clean-up killed A's command (pid {a_pid}), which runs under A's lock"
    );
    s.touch("a.go");
    a.wait().assert_code(0);
}

/// Removes a cgroup directory and the cgroups in it on drop, once they are empty.
struct RemoveDir(String);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let start = Instant::now();
        while start.elapsed() < WAIT {
            for e in fs::read_dir(&self.0).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    let _ = fs::remove_dir(e.path());
                }
            }
            if fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(POLL);
        }
    }
}
