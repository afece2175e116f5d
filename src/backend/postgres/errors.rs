//! What PostgreSQL's and the client's errors mean for a lock: [`BackendError::Unavailable`]
//! (may pass: retry) or [`BackendError::Refused`] (will not pass: give up), in one line
//! that names the server as `host:port` only, never the URL (it may hold a password),
//! and says what to set: a certificate refused in the TLS handshake (either way), no
//! TLS where `sslmode` requires it, a client certificate demanded, channel binding not
//! used, a password missing or refused, no `pg_hba.conf` line. Depends on
//! tokio-postgres' error types and [`crate::backend::tls::certificate_problem_kind`].

use crate::backend::tls::{certificate_problem_kind, CertProblem};
use crate::backend::BackendError;

/// Where the client certificate is set.
const SET_CLIENT_CERT: &str =
    "give sslcert=FILE and sslkey=FILE in the URL (or LOCKRUN_TLS_CERT and LOCKRUN_TLS_KEY)";

/// Translates a client error into a one-line message that names the server as
/// `host:port` only (never the URL, which may hold a password).
pub(super) fn describe(e: &tokio_postgres::Error, at: &str, table: &str) -> BackendError {
    if let Some(db) = e.as_db_error() {
        return server_error(db, at, table);
    }
    if let Some((problem, words)) = certificate_problem_kind(e) {
        return certificate_error(problem, &words, at);
    }
    client_error(e, at)
}

/// A refusal of the server at `at`: "PostgreSQL at HOST `what`".
fn refused(at: &str, what: String) -> BackendError {
    BackendError::Refused(format!("PostgreSQL at {at} {what}"))
}

/// An error the server sent, by its SQLSTATE.
fn server_error(db: &tokio_postgres::error::DbError, at: &str, table: &str) -> BackendError {
    let refused = |what: String| refused(at, what);
    let code = db.code().code();
    let msg = db.message().replace('\n', " ");
    match code {
        "28P01" => refused(format!(
            "refused the password ({msg}): check the user, and the password in \
             LOCKRUN_PASSWORD, --password-file or the URL"
        )),
        c if c.starts_with("28") => refused(auth_line(&msg)),
        "3D000" => refused(format!("has no such database ({msg})")),
        "42501" => refused(format!("denied access to the lock table {} ({msg})", table)),
        "3F000" => refused(format!(
            "has no schema for the lock table {} ({msg})",
            table
        )),
        "25006" => BackendError::Unavailable(format!(
            "PostgreSQL at {at} is read-only (a standby?): use the primary, or \
             target_session_attrs=read-write with several hosts ({msg})"
        )),
        "55P03" | "57014" => {
            BackendError::Unavailable(format!("PostgreSQL at {at} is busy: {msg}"))
        }
        c if ["08", "40", "53", "57", "58"]
            .iter()
            .any(|p| c.starts_with(p)) =>
        {
            BackendError::Unavailable(format!("PostgreSQL at {at} is not ready: {msg}"))
        }
        c if c.starts_with("42") => refused(format!(
            "rejected a statement on {}: is it a lockrun table? ({msg})",
            table
        )),
        _ => refused(format!("answered with an error: {code} {msg}")),
    }
}

/// A certificate refused in the TLS handshake (`words`), with what to set.
fn certificate_error(problem: CertProblem, words: &str, at: &str) -> BackendError {
    let hint = match problem {
        CertProblem::UnknownIssuer => {
            "set sslrootcert=FILE (or LOCKRUN_TLS_CA) to the CA that signed it (the \
             server's ssl_cert_file), or sslrootcert=system for a public CA"
        }
        CertProblem::WrongName => {
            "connect by a name the certificate holds, or use sslmode=verify-ca to check \
             the CA only"
        }
        CertProblem::Dates => {
            "renew the server's certificate (ssl_cert_file), or check this host's clock"
        }
        CertProblem::ClientCertWanted => SET_CLIENT_CERT,
        CertProblem::ClientCertRefused => {
            "use a client certificate signed by a CA in the server's ssl_ca_file"
        }
        CertProblem::Other => "check the server's ssl_cert_file",
    };
    BackendError::Refused(format!("TLS to PostgreSQL at {at} failed: {words}: {hint}"))
}

/// An error of the client's own: TLS, authentication, configuration, or the network.
fn client_error(e: &tokio_postgres::Error, at: &str) -> BackendError {
    let refused = |what: String| refused(at, what);
    let kind = e.to_string();
    let reason = reason(e);
    if reason.text.contains("server does not support TLS") {
        return refused(
            "does not offer TLS, which the URL's sslmode requires: turn ssl on in its \
             postgresql.conf (ssl = on, ssl_cert_file, ssl_key_file)"
                .to_owned(),
        );
    }
    if reason.text.contains("did not use channel binding") {
        return refused(
            "did not use channel binding, which channel_binding=require demands: it must \
             authenticate this user with scram-sha-256 (pg_hba.conf) over TLS, with a \
             SCRAM password (password_encryption = scram-sha-256)"
                .to_owned(),
        );
    }
    if kind.contains("TLS") && !reason.is_io {
        return refused(format!("failed the TLS handshake: {}", reason.text));
    }
    if reason.text.contains("password missing") {
        return refused(
            "asks for a password and none was given: set LOCKRUN_PASSWORD or \
             --password-file (or put it in the URL)"
                .to_owned(),
        );
    }
    if kind.contains("authentication") {
        return refused(format!(
            "asked for a password that was not given or not accepted: set LOCKRUN_PASSWORD or --password-file ({})",
            reason.text
        ));
    }
    if kind.contains("configuration") {
        return refused(format!("cannot be used: {}", reason.text));
    }
    BackendError::Unavailable(format!("cannot reach PostgreSQL at {at}: {}", reason.text))
}

/// An authentication refusal (class 28) other than a wrong password, after
/// "PostgreSQL at HOST ": what it means and what to set.
fn auth_line(msg: &str) -> String {
    if msg.contains("requires a valid client certificate") {
        format!("requires a client certificate ({msg}): {SET_CLIENT_CERT}")
    } else if msg.contains("certificate authentication failed")
        || msg.contains("certificate validation")
    {
        format!(
            "refused the client certificate for this user ({msg}): its CN must be the user \
             name (or be mapped to it in pg_ident.conf)"
        )
    } else if msg.contains("channel binding") {
        format!(
            "refused the channel binding ({msg}): the TLS session does not end at the \
             server (a TLS-terminating proxy, or a man in the middle); connect to the \
             server itself, or leave channel_binding out"
        )
    } else if msg.contains("no pg_hba.conf entry") && msg.contains("no encryption") {
        format!(
            "has no pg_hba.conf line for this connection without TLS ({msg}): use \
             sslmode=require (or verify-full), or add a line for it"
        )
    } else if msg.contains("no pg_hba.conf entry") {
        format!("has no pg_hba.conf line for this connection ({msg}): add one for it")
    } else {
        format!("refused authentication: check the user and password ({msg})")
    }
}

/// Why a client error happened, in words, and whether the operating system said so.
struct Reason {
    text: String,
    is_io: bool,
}

/// The refusal of a server (`at`) that sent more than the byte budget in answer to one
/// request ([`crate::backend::budget`]).
pub(super) fn too_large(at: &str) -> BackendError {
    refused(
        at,
        format!(
            "sent a reply larger than {}, more than lockrun ever asks for: it is not a \
             PostgreSQL server, or something between rewrites its replies (sslmode=require \
             or stronger keeps them intact)",
            crate::backend::budget::REPLY_BUDGET_WORDS
        ),
    )
}

/// No socket to the server at `at` could be opened.
pub(super) fn unreachable(e: &std::io::Error, at: &str) -> BackendError {
    BackendError::Unavailable(format!("cannot reach PostgreSQL at {at}: {}", io_text(e)))
}

/// The URL's hosts cannot be used as given (`why`).
pub(super) fn unusable(why: &str, at: &str) -> BackendError {
    refused(at, format!("cannot be used: {why}"))
}

/// The server is not what `target_session_attrs` asks for (`why`).
pub(super) fn session_attrs(why: &str, at: &str) -> BackendError {
    BackendError::Unavailable(format!(
        "PostgreSQL at {at} does not suit target_session_attrs: {why}"
    ))
}

/// An I/O error in a few words, without addresses.
fn io_text(io: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match io.kind() {
        ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        ErrorKind::TimedOut => "timed out".to_owned(),
        ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::UnexpectedEof => "connection closed".to_owned(),
        _ => match io.get_ref() {
            Some(inner) => inner.to_string(),
            None => io.to_string(),
        },
    }
}

/// The innermost cause of `e`: an OS reason without addresses where there is one.
fn reason(e: &tokio_postgres::Error) -> Reason {
    use std::error::Error as _;
    use std::io::ErrorKind;
    let mut source = e.source();
    let mut last = None;
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            let text = io_text(io);
            // A TLS failure wrapped in an I/O error is not a network problem.
            let is_io = io.get_ref().is_none() || io.kind() != ErrorKind::InvalidData;
            return Reason { text, is_io };
        }
        last = Some(s.to_string());
        source = s.source();
    }
    let text = match last {
        Some(cause) => format!("{e}: {cause}"),
        None if e.is_closed() => "connection closed".to_owned(),
        None => e.to_string(),
    };
    Reason {
        text: text.replace('\n', " "),
        is_io: e.is_closed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authentication_refusals_say_what_to_change() {
        let cases = [
            (
                "connection requires a valid client certificate",
                "sslcert=FILE and sslkey=FILE",
            ),
            (
                "certificate authentication failed for user \"app\"",
                "its CN must be the user name",
            ),
            ("SCRAM channel binding check failed", "man in the middle"),
            (
                "no pg_hba.conf entry for host \"10.0.0.1\", user \"app\", database \"db\", no encryption",
                "use sslmode=require",
            ),
            (
                "no pg_hba.conf entry for host \"10.0.0.1\", user \"app\", database \"db\", SSL encryption",
                "add one for it",
            ),
            ("Ident authentication failed", "check the user and password"),
        ];
        for (msg, says) in cases {
            let line = auth_line(msg);
            assert!(line.contains(says) && line.contains(msg), "{line}");
        }
    }
}

// ---------------------------------------------------------------------------------
// Privileges on the lock table (issue 13 item 5): a denial names the table, the user
// and the GRANT that fixes it. Kept apart from `describe` (connections, TLS and
// authentication), which it overrides for SQLSTATE 42501 only.

/// Who is denied what: the user lockrun connects as and the lock table (`--pg-table`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Grantee<'a> {
    /// The user of the URL (`None`: the client's default, named "this user").
    pub(super) user: Option<&'a str>,
    /// The lock table, `table` or `schema.table` (a checked identifier).
    pub(super) table: &'a str,
}

impl Grantee<'_> {
    /// The user as a GRANT names it (quoted when it must be), or `CURRENT_USER`.
    fn role(&self) -> String {
        match self.user {
            Some(u) => quote_ident(u),
            None => "CURRENT_USER".to_owned(),
        }
    }

    /// The user for a sentence.
    fn who(&self) -> String {
        match self.user {
            Some(u) => format!("user {u:?}"),
            None => "this user".to_owned(),
        }
    }

    /// The GRANTs every lockrun needs on an existing table: its rows and its sequence.
    fn grants(&self) -> String {
        let (t, r) = (self.table, self.role());
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {r}; \
             GRANT USAGE ON SEQUENCE {t}_fence TO {r}"
        )
    }

    /// The table's schema (`public` when unqualified: the usual search path's).
    fn schema(&self) -> &str {
        self.table.split_once('.').map_or("public", |(s, _)| s)
    }
}

/// The line for a privilege error (SQLSTATE 42501) of server `at` on the lock table,
/// its sequence or its schema; `None` for any other error.
pub(super) fn privilege_error(
    e: &tokio_postgres::Error,
    at: &str,
    who: Grantee<'_>,
) -> Option<BackendError> {
    let db = e.as_db_error()?;
    if db.code().code() != "42501" {
        return None;
    }
    let msg = db.message().replace('\n', " ");
    let (t, r, user) = (who.table, who.role(), who.who());
    let line = if msg.contains("for sequence") {
        format!(
            "PostgreSQL at {at} denied {user} the lock table's sequence {t}_fence ({msg}): \
             GRANT USAGE ON SEQUENCE {t}_fence TO {r}"
        )
    } else if msg.contains("for schema") {
        format!(
            "PostgreSQL at {at} denied {user} the schema of the lock table {t} ({msg}): \
             GRANT USAGE ON SCHEMA {} TO {r}",
            who.schema()
        )
    } else {
        format!(
            "PostgreSQL at {at} denied {user} access to the lock table {t} ({msg}): {}",
            who.grants()
        )
    };
    Some(BackendError::Refused(line))
}

/// The line for a CREATE of the missing lock table refused for want of privileges
/// (`msg`, the server's words): who may create it, and what to grant.
pub(super) fn create_denied(at: &str, who: Grantee<'_>, msg: &str) -> BackendError {
    BackendError::Refused(format!(
        "PostgreSQL at {at} does not let {} create the lock table {} ({}): create it once \
         as a user who may (one lockrun run as that user does), then {}; or GRANT CREATE ON \
         SCHEMA {} TO {}",
        who.who(),
        who.table,
        msg.replace('\n', " "),
        who.grants(),
        who.schema(),
        who.role()
    ))
}

/// `name` as an SQL identifier: bare if PostgreSQL would read it back unchanged,
/// else in double quotes (each `"` doubled).
fn quote_ident(name: &str) -> String {
    let bare = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    match bare {
        true => name.to_owned(),
        false => format!("\"{}\"", name.replace('"', "\"\"")),
    }
}

#[cfg(test)]
mod privilege_tests {
    use super::*;

    #[test]
    fn roles_are_quoted_as_grant_needs_them() {
        assert_eq!(quote_ident("lockrun_app"), "lockrun_app");
        assert_eq!(quote_ident("App"), "\"App\"");
        assert_eq!(quote_ident("a-b"), "\"a-b\"");
        assert_eq!(quote_ident("x\"y"), "\"x\"\"y\"");
        assert_eq!(quote_ident("1a"), "\"1a\"");
    }

    #[test]
    fn a_refused_create_names_the_table_the_user_and_both_ways_out() {
        let who = Grantee {
            user: Some("App"),
            table: "locks.leases",
        };
        let BackendError::Refused(line) =
            create_denied("h:1", who, "permission denied for schema locks")
        else {
            panic!("not a refusal")
        };
        for want in [
            "user \"App\"",
            "create the lock table locks.leases",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON locks.leases TO \"App\"",
            "GRANT USAGE ON SEQUENCE locks.leases_fence TO \"App\"",
            "GRANT CREATE ON SCHEMA locks TO \"App\"",
        ] {
            assert!(line.contains(want), "{line:?} lacks {want:?}");
        }
        let who = Grantee {
            user: None,
            table: "t",
        };
        let BackendError::Refused(line) = create_denied("h:1", who, "x") else {
            panic!("not a refusal")
        };
        assert!(line.contains("GRANT CREATE ON SCHEMA public TO CURRENT_USER"));
    }
}
