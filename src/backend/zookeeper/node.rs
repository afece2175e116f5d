//! What this lockrun knows of its own queue node between calls: where it is, what it
//! holds, and where a semaphore's claim of a slot stands. Part of [`super`].

use tokio::sync::watch;

/// Our queue node.
#[derive(Clone, Debug)]
pub struct OurNode {
    /// The lock's directory.
    pub dir: String,
    /// The token in its name.
    pub token: String,
    /// Its path, once the server has answered its creation.
    pub path: Option<String>,
    /// Its creation zxid: a plain lock's fencing token.
    pub czxid: i64,
    /// Its value (written again to stamp the time the lock was taken; a semaphore's
    /// names the slot once claimed).
    pub value: Vec<u8>,
    /// A busy answer was given with it: taking the lock later stamps the time.
    pub waited: bool,
    /// Its creation time by the server's clock: when a plain lock's node that did not
    /// wait took the lock (a claim knows its own time).
    pub created_ms: i64,
    /// After a wait, the time of the stamp (see `queue.rs`), once answered.
    pub stamp: Option<watch::Receiver<Option<i64>>>,
    /// A semaphore's claim of a slot (a plain lock's node never claims one).
    pub claim: Claim,
}

impl OurNode {
    /// When a plain lock's node took the lock, by the server's clock: the stamp's
    /// time after a wait, else its creation. The stamp was sent before any request
    /// of the release, and a session's answers come in order: waiting for it costs the
    /// release nothing.
    pub async fn taken_at(&self) -> i64 {
        if let Some(mut stamp) = self.stamp.clone() {
            if let Ok(at) = stamp.wait_for(Option::is_some).await {
                return at.unwrap_or(self.created_ms);
            }
        }
        self.created_ms
    }

    /// A node of `token` in `dir` known only by its token: one whose creation (or its
    /// claim) was never seen answered.
    pub fn lost(dir: String, token: &str) -> OurNode {
        OurNode {
            dir,
            token: token.to_owned(),
            path: None,
            czxid: 0,
            value: Vec::new(),
            waited: false,
            created_ms: 0,
            stamp: None,
            claim: Claim::Unclaimed,
        }
    }
}

/// Where a semaphore's claim of a slot stands. Recorded before the claim is sent, so
/// that a claim whose answer was lost is cleaned up with the node (see `slots.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Claim {
    /// None sent.
    #[default]
    Unclaimed,
    /// Sent; whether it applied is unknown (the node's value tells).
    Sent,
    /// The slot is ours.
    Held {
        /// The slot.
        slot: u32,
        /// The claim's zxid: the fencing token.
        zxid: i64,
        /// The claim's time by the server's clock.
        since_ms: i64,
        /// The version of the slot's (over) hold node the claim found, deleted with
        /// our release.
        hold_version: Option<i32>,
    },
}
