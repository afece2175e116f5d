//! `--hold-at-least` on the file backend is kept on `CLOCK_BOOTTIME`, not the wall
//! clock: a clock stepped forward (NTP, `date -s`) does not end a hold early.

use crate::support::*;

#[test]
fn a_wall_clock_stepped_forward_does_not_end_a_hold() {
    let f = FileService::start();
    run(lockrun_run(
        &f.lock_url(),
        "job",
        &["--hold-at-least", "20s"],
        &["true"],
    ))
    .assert_code(0);
    // A lockrun whose wall clock is 5 minutes ahead (libfaketime; CLOCK_BOOTTIME is
    // left alone), started at once: the hold has about 20 s left.
    let clock = FakeClock::new();
    clock.jump_forward(std::time::Duration::from_secs(300));
    let s = Scratch::new();
    let mut cmd = lockrun_run(&f.lock_url(), "job", &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    for (k, v) in clock.env() {
        cmd.env(k, v);
    }
    let busy = run(cmd);
    busy.assert_code(75);
    assert!(!s.exists("marker"), "the command ran inside the hold");
}
