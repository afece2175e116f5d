//! Why a backend call did not give an answer about the lock: [`BackendError`], and the
//! refusal of a name held with another `--slots`. Part of the backend interface.

use thiserror::Error;

/// Why a backend call did not give an answer about the lock.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// The backend could not be reached or did not answer in time. May pass.
    #[error("{0}")]
    Unavailable(String),
    /// The backend refused us for good: wrong password, missing permission, a
    /// server that cannot run our scripts. Retrying will not help.
    #[error("{0}")]
    Refused(String),
    /// The lock is not (or no longer) held with our token.
    #[error("the lock is not held by this lockrun")]
    NotOwner,
    /// Refused: the name is held with `--slots theirs`, we asked with `ours`.
    #[error("{}", conflict_words(*theirs, *ours))]
    SlotsConflict {
        /// The N its holders were taken with.
        theirs: u32,
        /// The N asked with.
        ours: u32,
    },
}

impl BackendError {
    /// True if retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            BackendError::Unavailable(_) => true,
            BackendError::Refused(_) | BackendError::NotOwner => false,
            BackendError::SlotsConflict { .. } => false,
        }
    }

    /// True for a refusal for good: [`BackendError::Refused`] or a slots conflict.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            BackendError::Refused(_) | BackendError::SlotsConflict { .. }
        )
    }
}

/// The refusal when holders of a name were taken with another `--slots` than ours
/// (`theirs`): two limits for one name would let more than the smaller one in. A
/// refusal ([`BackendError::SlotsConflict`]), so the run fails (125) without retrying;
/// the backend checks it in the same atomic step that would take a slot.
pub fn slots_conflict(theirs: u32, ours: u32) -> BackendError {
    BackendError::SlotsConflict { theirs, ours }
}

/// The words of [`BackendError::SlotsConflict`].
fn conflict_words(theirs: u32, ours: u32) -> String {
    let as_given = |n: u32| match n {
        1 => "a plain lock (--slots 1)".to_owned(),
        n => format!("--slots {n}"),
    };
    format!(
        "the lock is held with {}, not {}: give every lockrun of one name the same \
         --slots (LOCKRUN_SLOTS)",
        as_given(theirs),
        as_given(ours)
    )
}
