//! ZooKeeper client errors translated into [`BackendError`]s: one line naming the
//! ensemble as `host:port` only (never the password), the cause and the fix. Part of
//! [`super`].

use std::time::Duration;

use zookeeper_client::Error as ZkError;

use crate::backend::BackendError;

/// Translates `e`, met while working on `path` at ensemble `at`.
pub fn describe(e: &ZkError, at: &str, path: &str) -> BackendError {
    let refused = |what: String| BackendError::Refused(format!("ZooKeeper at {at} {what}"));
    let unavailable = |what: String| BackendError::Unavailable(format!("ZooKeeper at {at} {what}"));
    match e {
        ZkError::NoAuth => refused(format!(
            "denied access to {path} (its ACL): check the user and password in the URL, and \
             the ACL of that path and its parents"
        )),
        ZkError::AuthFailed => {
            refused("refused authentication: check the user and password in the URL".into())
        }
        ZkError::NoHosts => unavailable(
            "cannot be reached: no server of the list took a connection; check the hosts and \
             ports, and that ZooKeeper runs"
                .into(),
        ),
        ZkError::Timeout => unavailable(
            "gave no session in time: check that ZooKeeper runs and its ensemble has a quorum"
                .into(),
        ),
        ZkError::ConnectionLoss => unavailable("lost lockrun's connection".into()),
        ZkError::Custom(_) => unavailable(format!("cannot be reached: {e}")),
        ZkError::SessionExpired | ZkError::SessionMoved | ZkError::ClientClosed => {
            unavailable(format!("ended lockrun's session ({e})"))
        }
        ZkError::Throttled | ZkError::NotReadOnly => {
            unavailable(format!("cannot serve lockrun right now ({e})"))
        }
        ZkError::Unimplemented => refused(
            "does not know a request lockrun sends (container nodes need ZooKeeper 3.5.3 or \
             later): upgrade the ensemble"
                .into(),
        ),
        ZkError::QuotaExceeded => refused(format!(
            "refused a node under {path}: its quota is exceeded"
        )),
        other => refused(format!("rejected a request on {path}: {other}")),
    }
}

/// The longest session a server may grant above `--ttl`: its `minSessionTimeout`
/// raises a short `--ttl` to twice its `tickTime` (4 s by default); a minute allows a
/// `tickTime` of 30 s, far longer than any ensemble uses.
pub const GRANT_ABOVE_TTL: Duration = Duration::from_secs(60);

/// The refusal of a session timeout `granted` by ensemble `at` for `--ttl` `ttl`, if it
/// is refused: below `ttl` (the session could expire before lockrun's deadline), or
/// above both `ttl` and [`GRANT_ABOVE_TTL`] (a crashed holder's lock would last it).
pub fn bad_grant(at: &str, granted: Duration, ttl: Duration) -> Option<BackendError> {
    let ms = crate::units::ms;
    if granted > ttl.max(GRANT_ABOVE_TTL) {
        return Some(BackendError::Refused(format!(
            "ZooKeeper at {at} granted a session timeout of {} for --ttl {} (a crashed \
             holder would keep the lock that long): lower its minSessionTimeout, or use \
             another server",
            ms(granted),
            ms(ttl)
        )));
    }
    (granted < ttl).then(|| {
        BackendError::Refused(format!(
            "ZooKeeper at {at} grants sessions of at most {} (its maxSessionTimeout), less \
             than --ttl {}: use --ttl {} or less, or raise maxSessionTimeout",
            ms(granted),
            ms(ttl),
            ms(granted)
        ))
    })
}

/// The refusal of server `server` (`host:port`), which sent a frame longer than the
/// byte budget ([`crate::backend::budget`]); its connection is closed.
pub fn too_large(server: &str) -> BackendError {
    BackendError::Refused(format!(
        "the ZooKeeper server at {server} sent a reply larger than {}, more than lockrun \
         ever asks for: it is not a ZooKeeper server, or something between rewrites its \
         replies",
        crate::backend::budget::REPLY_BUDGET_WORDS
    ))
}

/// True when `e` says the session is over: its ephemeral nodes, our lock among them,
/// are gone (or about to be, and nothing can renew them).
pub fn session_over(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired | ZkError::SessionMoved | ZkError::ClientClosed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_ensemble_and_the_fix() {
        let e = describe(&ZkError::NoAuth, "h:2181", "/lockrun:/job");
        let BackendError::Refused(msg) = e else {
            panic!("NoAuth is not a refusal")
        };
        assert!(
            msg.starts_with("ZooKeeper at h:2181 denied access to /lockrun:/job"),
            "{msg}"
        );
        assert!(describe(&ZkError::ConnectionLoss, "h:1", "/").is_transient());
        assert!(describe(&ZkError::NoHosts, "h:1", "/").is_transient());
        assert!(!describe(&ZkError::AuthFailed, "h:1", "/").is_transient());
        assert!(!describe(&ZkError::Unimplemented, "h:1", "/").is_transient());
        assert!(session_over(&ZkError::SessionExpired));
        let s = Duration::from_secs;
        assert!(bad_grant("h:1", s(4), s(2)).is_none(), "minSessionTimeout");
        assert!(bad_grant("h:1", s(60), s(1)).is_none());
        assert!(bad_grant("h:1", s(61), s(1)).is_some());
        assert!(
            bad_grant("h:1", s(30), s(31)).is_some(),
            "maxSessionTimeout"
        );
        assert!(bad_grant("h:1", Duration::from_millis(i32::MAX as u64), s(3600)).is_some());
        assert!(!session_over(&ZkError::ConnectionLoss));
    }
}
