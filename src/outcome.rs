//! How a run ended, and the exit status each ending maps to (README, "Exit status", and
//! the man page's EXIT STATUS). Depends on nothing else in the crate.

/// The exit status used when the lock is busy and no `--conflict-exit-code` is given.
pub const DEFAULT_CONFLICT_EXIT_CODE: u8 = 75;

/// How a `lockrun run` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The command ran and exited with this status.
    Exited(u8),
    /// The command was killed by this signal, which lockrun did not send on lock loss.
    Signaled(i32),
    /// lockrun itself was interrupted by this signal before the command started.
    Interrupted(i32),
    /// The lock was held by someone else; the command was not started. Carries the
    /// `--conflict-exit-code`.
    Busy(u8),
    /// lockrun stopped the command because the lock was lost.
    LockLost,
    /// lockrun stopped the command because `--max-runtime` was reached.
    MaxRuntime,
    /// lockrun failed before starting the command (usage, configuration, backend).
    Failed,
    /// The command was found but could not be executed.
    CannotExecute,
    /// The command was not found.
    NotFound,
    /// `lockrun status`: the lock is held (by at least one holder).
    Held,
    /// `lockrun status`: the lock is free.
    Free,
    /// `lockrun release --force` broke the lock (or found it free).
    ForceReleased,
    /// `lockrun list` listed the names it found (perhaps none).
    Listed,
}

impl Outcome {
    /// The process exit status for this outcome.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Exited(code) => code,
            Outcome::Signaled(sig) | Outcome::Interrupted(sig) => {
                128u8.saturating_add(u8::try_from(sig).unwrap_or(127))
            }
            Outcome::Busy(code) => code,
            Outcome::LockLost | Outcome::MaxRuntime => 124,
            Outcome::Failed => 125,
            Outcome::CannotExecute => 126,
            Outcome::NotFound => 127,
            Outcome::Held | Outcome::ForceReleased | Outcome::Listed => 0,
            Outcome::Free => 1,
        }
    }

    /// The word used in logs and metrics for this outcome: `ran`, `busy`, `lost` or
    /// `error` (a command stopped at `--max-runtime` counts as an error: the job did
    /// not finish; `status` and `release --force`, which write no metrics, did what
    /// was asked: `ran`).
    pub fn kind(self) -> &'static str {
        match self {
            Outcome::Exited(_)
            | Outcome::Signaled(_)
            | Outcome::Held
            | Outcome::Free
            | Outcome::ForceReleased
            | Outcome::Listed => "ran",
            Outcome::Busy(_) => "busy",
            Outcome::LockLost => "lost",
            Outcome::MaxRuntime
            | Outcome::Interrupted(_)
            | Outcome::Failed
            | Outcome::CannotExecute
            | Outcome::NotFound => "error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_spec_table() {
        assert_eq!(Outcome::Exited(0).exit_code(), 0);
        assert_eq!(Outcome::Exited(7).exit_code(), 7);
        assert_eq!(Outcome::Signaled(15).exit_code(), 143);
        assert_eq!(Outcome::Signaled(9).exit_code(), 137);
        assert_eq!(Outcome::Interrupted(2).exit_code(), 130);
        assert_eq!(Outcome::Busy(DEFAULT_CONFLICT_EXIT_CODE).exit_code(), 75);
        assert_eq!(Outcome::Busy(0).exit_code(), 0);
        assert_eq!(Outcome::LockLost.exit_code(), 124);
        assert_eq!(Outcome::MaxRuntime.exit_code(), 124);
        assert_eq!(Outcome::Failed.exit_code(), 125);
        assert_eq!(Outcome::CannotExecute.exit_code(), 126);
        assert_eq!(Outcome::NotFound.exit_code(), 127);
        assert_eq!(Outcome::Held.exit_code(), 0);
        assert_eq!(Outcome::Free.exit_code(), 1);
        assert_eq!(Outcome::ForceReleased.exit_code(), 0);
    }

    #[test]
    fn outcome_kinds() {
        assert_eq!(Outcome::Exited(3).kind(), "ran");
        assert_eq!(Outcome::Signaled(15).kind(), "ran");
        assert_eq!(Outcome::Busy(75).kind(), "busy");
        assert_eq!(Outcome::LockLost.kind(), "lost");
        assert_eq!(Outcome::MaxRuntime.kind(), "error");
        assert_eq!(Outcome::Failed.kind(), "error");
        assert_eq!(Outcome::NotFound.kind(), "error");
    }
}
