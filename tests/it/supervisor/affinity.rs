//! The command's CPU affinity is lockrun's, although lockrun runs its guard on its other
//! CPUs until the command starts (`src/supervisor/cpus.rs`).

use crate::support::*;

/// The `Cpus_allowed_list` line of a `/proc/.../status` (`thread-self`: this test's
/// thread, whose affinity the lockrun it starts inherits).
fn allowed(status: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("a Cpus_allowed_list line")
        .trim()
        .to_owned()
}

/// The CPUs the command of `lockrun` (run by `wrap`, if any) may run on.
fn commands_cpus(wrap: &[&str]) -> String {
    let s = Scratch::new();
    std::fs::create_dir(s.path("locks")).unwrap();
    let url = format!("file://{}", s.path("locks").display());
    let out = s.path("status");
    let line = format!("cat /proc/self/status > '{}'", out.display());
    let lockrun = lockrun_run(&url, "cpus", &[], &["sh", "-c", &line]);
    let cmd = if wrap.is_empty() {
        lockrun
    } else {
        wrapped(wrap, &lockrun)
    };
    run(cmd).assert_code(0);
    allowed(&std::fs::read_to_string(out).expect("the command ran"))
}

#[test]
fn the_command_may_run_on_every_cpu_lockrun_may() {
    let ours = allowed(&std::fs::read_to_string("/proc/thread-self/status").unwrap());
    // On a machine of two CPUs or more, the guard ran on fewer than these until it
    // started the command.
    assert_eq!(
        commands_cpus(&[]),
        ours,
        "the command's CPUs, lockrun's: {ours}"
    );
}

#[test]
fn lockrun_on_one_cpu_runs_its_command_on_that_cpu() {
    let ours = allowed(&std::fs::read_to_string("/proc/thread-self/status").unwrap());
    // The last CPU this test may use: `a-b,c` ends with c, `a-b` with b.
    let last = ours.rsplit([',', '-']).next().unwrap().to_owned();
    assert_eq!(commands_cpus(&["taskset", "-c", &last]), last);
}
