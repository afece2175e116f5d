//! A fork storm (issue 39, case 3): lockrun SIGKILLed while its job forks as fast as it
//! can, hundreds of short-lived processes alive at once, on `file://` and Redis, with
//! the job's cgroup (root) and with the process tree alone (`nobody`, on `file://`).
//!
//! Every process of the storm carries a mark in its command line (perl's `$0`, which a
//! fork inherits), so that one forked after any list of the job was read is still
//! found. A next holder already waiting on the lock looks, as its command starts, for a
//! marked process alive (none may be); and once lockrun is dead no marked process may
//! be left after a generous wait. How fast the storm dies is `.ci/bench`'s business
//! (`containment_storm`), not a timed assertion here: the machine is noisy.

use std::fs;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::boundary::{as_nobody, give_to_nobody};
use super::kill_paths::On;
use crate::support::*;

/// How many processes the storm keeps alive, each living a random 0-1.5 s (one in 50 a
/// minute: longer than the lease, so that a survivor is still there for the next holder
/// on Redis to see) and replaced by a new fork at once.
const SIZE: usize = 600;

/// The storm: marks itself (and so every fork) `lockrun-storm-x$STORM`, and forks.
const STORM: &str = r#"$0 = "lockrun-storm-x$ENV{STORM}"; my $k = 0;
while (1) {
    if ($k < 600) {
        my $p = fork;
        if (defined $p && !$p) { select(undef, undef, undef, $k % 50 ? rand 1.5 : 60); exit 0 }
        $k++ if $p;
    } else { wait; $k-- }
}"#;

/// The next holder's command: writes the `/proc/PID/cmdline` of every marked process
/// alive to `$SURVIVORS` (a zombie's is empty), then a line to `$CHECKED`. The pattern
/// does not match grep's own command line (`[x]`).
const CHECK: &str = r#"grep -ls -e "lockrun-storm-[x]$STORM" /proc/[0-9]*/cmdline > "$SURVIVORS"
echo checked > "$CHECKED""#;

/// The live processes marked `tag`.
fn marked(tag: &str) -> Vec<i32> {
    let mark = format!("lockrun-storm-x{tag}");
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(mark.len()).any(|w| w == mark.as_bytes()))
        })
        .filter(|&pid| is_alive(pid))
        .collect()
}

/// SIGKILLs every process marked `tag` until none is left, when a case ends (a failed
/// case must not leave a storm running on the machine).
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for _ in 0..200 {
            let left = marked(&self.0);
            if left.is_empty() {
                return;
            }
            left.iter().for_each(|&p| signal_pid(p, Signal::SIGKILL));
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// lockrun SIGKILLed during a storm on `on`, run as `nobody` (the process tree alone)
/// if `unprivileged`.
fn storm(on: On, unprivileged: bool) {
    let what = format!("fork storm on {on:?}, unprivileged: {unprivileged}");
    let (b, s) = if unprivileged {
        let files = FileService::start();
        give_to_nobody(files.root());
        let s = Scratch::new();
        give_to_nobody(&s.path(""));
        (Backend::new(files), s)
    } else {
        (on.backend(), Scratch::new())
    };
    let as_user = |cmd: std::process::Command| {
        if unprivileged {
            as_nobody(&cmd)
        } else {
            cmd
        }
    };
    // Unique on this machine: the cases of this binary run side by side.
    let tag = format!("{}-{on:?}-{}", std::process::id(), unprivileged as u8);
    let _cleanup = Cleanup(tag.clone());
    let mut cmd = b.run("storm", &["--ttl", "2s"], &["perl", "-e", STORM]);
    cmd.env("STORM", &tag);
    let mut lockrun = spawn(as_user(cmd));
    wait_until(
        &format!("{what}: {} processes alive", SIZE / 2),
        WAIT,
        || marked(&tag).len() >= SIZE / 2,
    );
    let (survivors, checked) = (s.path("survivors"), s.path("checked"));
    let mut cmd = b.run("storm", &["--wait", "60s"], &["sh", "-c", CHECK]);
    cmd.env("STORM", &tag)
        .env("SURVIVORS", &survivors)
        .env("CHECKED", &checked);
    let mut next = spawn(as_user(cmd));
    // The next holder waits on the lock while the storm goes on.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        next.try_finish().is_none(),
        "{what}: the next holder ran beside the storm"
    );
    let alive = marked(&tag).len();
    lockrun.signal(Signal::SIGKILL);
    lockrun.wait();
    wait_line(&checked);
    let found = fs::read_to_string(&survivors).unwrap_or_default();
    assert!(
        found.trim().is_empty(),
        "{what}: the next holder's command started while processes of the storm ran:\n{found}"
    );
    next.wait().assert_code(0);
    let gone = wait_until(
        &format!("{what}: no process of the storm left"),
        WAIT,
        || marked(&tag).is_empty(),
    );
    eprintln!(
        "{what}: {alive} processes alive at the kill, none seen {gone:?} after the next holder ran"
    );
}

#[test]
fn lockrun_killed_during_a_fork_storm_on_file() {
    storm(On::File, false);
}

#[test]
fn lockrun_killed_during_a_fork_storm_on_redis() {
    storm(On::Redis, false);
}

#[test]
fn lockrun_killed_during_a_fork_storm_unprivileged_on_file() {
    storm(On::File, true);
}
