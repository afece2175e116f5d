//! The one-line messages of the MySQL backend's errors: what the server or the network
//! said, in lockrun's words, with the fix where there is one. Never the password (the
//! server's messages hold none). Part of [`super`].

use super::MysqlBackend;
use crate::backend::tls::{certificate_problem_kind, CertProblem};
use crate::backend::BackendError;

/// Access denied for the user (wrong password, no such user, host not allowed).
const ACCESS_DENIED: u16 = 1045;
/// Access denied to the database.
const DB_ACCESS_DENIED: u16 = 1044;
/// A command denied on a table.
const TABLE_ACCESS_DENIED: u16 = 1142;
/// Unknown database.
const BAD_DB: u16 = 1049;

/// Translates `e` from the server at `b`.
pub(super) fn describe(e: &mysql_async::Error, b: &MysqlBackend) -> BackendError {
    let at = &b.display;
    if let Some(refused) = tls_error(e, at) {
        return refused;
    }
    let (user, db, table) = (&b.target.user, &b.target.database, &b.target.table);
    let grant = format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `{db}`.`{table}` TO '{user}'@'HOST'"
    );
    match e {
        mysql_async::Error::Server(s) => {
            let said = one_line(&s.message);
            match s.code {
                ACCESS_DENIED => BackendError::Refused(format!(
                    "MySQL at {at} refused user {user:?} ({said}): check the password (the \
                     URL's, LOCKRUN_PASSWORD or --password-file), that the user may log in \
                     from this host, and for a user that requires a client certificate, \
                     ssl-cert and ssl-key"
                )),
                DB_ACCESS_DENIED | TABLE_ACCESS_DENIED => BackendError::Refused(format!(
                    "MySQL at {at}: user {user:?} lacks a privilege on table {db}.{table} \
                     ({said}); an administrator can run: {grant}"
                )),
                BAD_DB => BackendError::Refused(format!(
                    "MySQL at {at} has no database {db:?} ({said}): create it, or name \
                     another in the URL"
                )),
                _ => BackendError::Unavailable(format!("MySQL at {at}: {said}")),
            }
        }
        mysql_async::Error::Io(io) => BackendError::Unavailable(format!(
            "cannot reach MySQL at {at}: {}",
            one_line(&io.to_string())
        )),
        mysql_async::Error::Driver(d) => {
            BackendError::Unavailable(format!("MySQL at {at}: {}", one_line(&d.to_string())))
        }
        other => {
            BackendError::Unavailable(format!("MySQL at {at}: {}", one_line(&other.to_string())))
        }
    }
}

/// A refused certificate, or TLS asked of a server without it: one line, for good.
fn tls_error(e: &mysql_async::Error, at: &str) -> Option<BackendError> {
    if let mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) = e {
        return Some(BackendError::Refused(format!(
            "MySQL at {at} does not offer TLS, which the URL's ssl-mode requires: enable it \
             on the server (ssl_cert, ssl_key), or use ssl-mode=PREFERRED or DISABLED"
        )));
    }
    let (problem, words) = certificate_problem_kind(e)?;
    let hint = match problem {
        CertProblem::UnknownIssuer => "give the CA that signed it in ssl-ca",
        CertProblem::WrongName => {
            "connect by a name the certificate holds, or use ssl-mode=VERIFY_CA"
        }
        CertProblem::Dates => "renew the server's certificate, or check the clocks",
        CertProblem::ClientCertWanted => "give ssl-cert and ssl-key",
        CertProblem::ClientCertRefused => "give a client certificate the server trusts",
        CertProblem::Other => "check the server's certificate and ssl-ca",
    };
    Some(BackendError::Refused(format!(
        "MySQL at {at}: TLS refused, {words}: {hint}"
    )))
}

/// An answer lockrun cannot read: not a lockrun table, or a changed one.
pub(super) fn unexpected(b: &MysqlBackend) -> BackendError {
    BackendError::Refused(format!(
        "MySQL at {} gave an unexpected answer: is {}.{} a lockrun table?",
        b.display, b.target.database, b.target.table
    ))
}

/// `s` on one line, at most 300 characters.
fn one_line(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(300)
        .collect()
}
