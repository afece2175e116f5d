//! ZooKeeper client errors translated into [`BackendError`]s: one line naming the
//! ensemble as `host:port` only (never the password), the cause and the fix. Part of
//! [`super`].

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
        assert!(!session_over(&ZkError::ConnectionLoss));
    }
}
