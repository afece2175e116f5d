//! Authentication and permissions (issue 13 item 5): lines that name the user, the key
//! prefix and the fix. Kept apart from [`super::describe`] (which knows only the
//! member). Part of [`super`].

use super::code;
use super::RpcError;
use crate::backend::BackendError;

/// Who asks, for the lines of [`access_error`]: the user (none without credentials)
/// and the key prefix its role needs.
#[derive(Clone, Copy, Debug)]
pub struct Access<'a> {
    /// The user of the URL, if any (never its password).
    pub user: Option<&'a str>,
    /// `--key-prefix`.
    pub prefix: &'a str,
}

/// The line for an authentication or permission refusal of member `at`, naming the
/// user, the prefix and the fix; `None` for any other error (see [`super::describe`]).
pub fn access_error(e: &RpcError, at: &str, who: Access<'_>) -> Option<BackendError> {
    let RpcError::Status(s) = e else {
        return None;
    };
    let msg = s.message().trim().trim_start_matches("etcdserver: ");
    let code = s.code() as i32;
    let user = who.user.unwrap_or_default();
    let line = match code {
        code::INVALID_ARGUMENT if msg.contains("user name is empty") => format!(
            "etcd at {at} has authentication enabled and no user was given: use \
             etcd://USER@{at} with the password in --password-file or LOCKRUN_PASSWORD"
        ),
        code::INVALID_ARGUMENT if msg.contains("authentication failed") => format!(
            "etcd at {at} refused authentication as user {user:?}: check the user name and \
             its password (--password-file, LOCKRUN_PASSWORD or the URL)"
        ),
        code::FAILED_PRECONDITION if msg.contains("authentication is not enabled") => format!(
            "etcd at {at} has authentication disabled, yet user {user:?} was given: remove \
             the user and password from the URL (or turn authentication on: etcdctl auth enable)"
        ),
        code::PERMISSION_DENIED => {
            let asker = match who.user {
                Some(u) => format!("user {u:?}"),
                None => "lockrun".to_owned(),
            };
            format!(
                "etcd at {at} denied {asker} access to the keys under the prefix {:?} ({msg}): \
                 grant its role readwrite on them: etcdctl role grant-permission ROLE \
                 --prefix=true readwrite {}",
                who.prefix,
                shell_quote(who.prefix)
            )
        }
        _ => return None,
    };
    Some(BackendError::Refused(line))
}

/// `s` quoted for a POSIX shell: in single quotes, each `'` written `'\''`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, msg: &str) -> RpcError {
        RpcError::Status(tonic::Status::new(code, msg))
    }

    /// A user whose prefix needs quoting in a shell.
    const APP: Access<'static> = Access {
        user: Some("app"),
        prefix: "team's:",
    };

    /// No user at all.
    const NONE: Access<'static> = Access {
        user: None,
        prefix: "lockrun:",
    };

    /// Each refusal, as etcd words it, and what its line must say.
    #[test]
    fn each_refusal_names_its_cause_and_fix_in_one_line() {
        use tonic::Code;
        let (app, none) = (APP, NONE);
        let cases: [(RpcError, Access<'_>, &[&str]); 5] = [
            (
                status(Code::InvalidArgument, "etcdserver: user name is empty"),
                none,
                &[
                    "authentication enabled",
                    "no user",
                    "etcd://USER@h:1",
                    "LOCKRUN_PASSWORD",
                ],
            ),
            (
                status(
                    Code::InvalidArgument,
                    "etcdserver: authentication failed, invalid user ID or password",
                ),
                app,
                &["refused authentication", "\"app\"", "password"],
            ),
            (
                status(
                    Code::FailedPrecondition,
                    "etcdserver: authentication is not enabled",
                ),
                app,
                &["authentication disabled", "\"app\"", "remove the user"],
            ),
            (
                status(Code::PermissionDenied, "etcdserver: permission denied"),
                app,
                &[
                    "user \"app\"",
                    "prefix \"team's:\"",
                    r"etcdctl role grant-permission ROLE --prefix=true readwrite 'team'\''s:'",
                ],
            ),
            (
                status(Code::PermissionDenied, "etcdserver: permission denied"),
                none,
                &["denied lockrun", "readwrite 'lockrun:'"],
            ),
        ];
        for (e, who, want) in cases {
            let Some(BackendError::Refused(line)) = access_error(&e, "h:1", who) else {
                panic!("{e:?} is not an access refusal")
            };
            assert!(!line.contains('\n'), "{line}");
            for w in want {
                assert!(line.contains(w), "{line:?} lacks {w:?}");
            }
        }
    }

    #[test]
    fn other_errors_are_no_access_refusals() {
        use tonic::Code;
        for other in [
            status(Code::Unavailable, "etcdserver: no leader"),
            status(Code::FailedPrecondition, "etcdserver: lease already exists"),
            RpcError::Broken("x".into()),
        ] {
            assert_eq!(access_error(&other, "h:1", APP), None);
        }
    }
}
