//! The next holder's check: a command run under the lock of a killed holder that, as it
//! starts, writes down which processes of the earlier job are still alive (none may
//! be).

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use super::Proc;
use crate::support::{spawn, wait_line, Running, Scratch};

/// The next holder's command: for every process of the earlier job listed in
/// `$EARLIER` (`pid start` lines), writes its pid to `$SURVIVORS` if it is alive (the
/// same start time, not a zombie), then writes a line to `$CHECKED`.
const SURVIVORS_CHECK: &str = r#"
while read -r pid start; do
    s=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    set -- ${s##*) }
    case "$1" in Z|X) continue ;; esac
    [ "${20}" = "$start" ] && echo "$pid" >> "$SURVIVORS"
done < "$EARLIER"
echo checked > "$CHECKED"
"#;

/// The next holder of a lock, started (usually waiting) before the earlier holder is
/// killed: as its command starts, it writes down which processes of the earlier job
/// are still alive.
pub struct NextHolder {
    /// Its lockrun.
    pub lockrun: Running,
    survivors: PathBuf,
    checked: PathBuf,
}

/// The command of a next holder (`sh -c` of the survivors' check).
pub fn next_holder_command() -> Vec<&'static str> {
    vec!["sh", "-c", SURVIVORS_CHECK]
}

impl NextHolder {
    /// Writes the earlier job's processes into `s` (under `tag`) and spawns `cmd`, a
    /// lockrun of [`next_holder_command`] on the same lock.
    pub fn spawn(mut cmd: Command, s: &Scratch, tag: &str, earlier: &[Proc]) -> NextHolder {
        let list: String = earlier
            .iter()
            .map(|p| format!("{} {}\n", p.pid, p.start))
            .collect();
        let earlier_file = s.path(&format!("{tag}.earlier"));
        fs::write(&earlier_file, list).expect("write the earlier job's processes");
        let survivors = s.path(&format!("{tag}.survivors"));
        let checked = s.path(&format!("{tag}.checked"));
        cmd.env("EARLIER", &earlier_file)
            .env("SURVIVORS", &survivors)
            .env("CHECKED", &checked);
        NextHolder {
            lockrun: spawn(cmd),
            survivors,
            checked,
        }
    }

    /// Waits (at most `WAIT`) until its command ran and returns the processes of the
    /// earlier job it found alive, and the instant the test saw its check done.
    pub fn survivors(&mut self) -> (Vec<i32>, Instant) {
        wait_line(&self.checked);
        let seen = Instant::now();
        let text = fs::read_to_string(&self.survivors).unwrap_or_default();
        let pids = text.lines().filter_map(|l| l.parse().ok()).collect();
        (pids, seen)
    }

    /// Panics unless its command found none of the earlier job alive; `what` names the
    /// case.
    pub fn assert_no_survivors(&mut self, what: &str) -> Instant {
        let (alive, seen) = self.survivors();
        assert!(
            alive.is_empty(),
            "{what}: the next holder's command started while processes of the earlier \
             job still ran: {alive:?}"
        );
        self.lockrun.wait().assert_code(0);
        seen
    }
}
