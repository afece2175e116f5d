//! Waiting for a crashed holder's lockrun to be gone. Part of [`super`].
//!
//! Linux frees a dying process's file locks while it closes its files, and only then
//! (in `exit_notify`) sends the parent-death signal to its children: for a moment the
//! lock is free while the dead holder's command has not yet been sent its SIGKILL. A
//! process is a zombie (or gone) only after `exit_notify`, so once the holder's
//! lockrun is one, its command has been sent SIGKILL and never runs again.

use std::time::Duration;

/// The longest wait: the window is microseconds; a pid that stays alive longer is not
/// the holder's (another pid namespace, a reused pid).
const MAX_WAIT: Duration = Duration::from_millis(200);

/// How often to look.
const PAUSE: Duration = Duration::from_millis(2);

/// Returns once process `pid` is gone or a zombie, or after [`MAX_WAIT`].
pub async fn wait_for_exit(pid: u32) {
    let deadline = tokio::time::Instant::now() + MAX_WAIT;
    while running(pid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(PAUSE).await;
    }
}

/// True if `pid` is a process of this pid namespace that has not exited.
fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) S ...`: the state follows the last ')' (comm may hold one).
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X' | 'x') | None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_processes_run_and_reaped_or_zombie_ones_do_not() {
        assert!(running(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited, not yet reaped: a zombie.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while running(pid) {
            assert!(std::time::Instant::now() < deadline, "true never exited");
            std::thread::sleep(PAUSE);
        }
        child.wait().unwrap();
        assert!(!running(pid));
        assert!(!running(u32::MAX));
    }
}
