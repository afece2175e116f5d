//! TLS from a PostgreSQL URL's libpq parameters, the environment's files and libpq's
//! default files (see the doc of [`super`] for the rules), in steps: the mode, channel
//! binding, plain or TLS, the roots and how much they check, the client certificate,
//! and the rustls configuration. Part of [`super`].

use std::path::Path;
use std::sync::Arc;

use tokio_postgres::config::{ChannelBinding, SslMode as PgMode, SslNegotiation};

use super::{LibpqParams, PgTls, SslMode};
use crate::backend::tls::{client_config, Roots, ServerCheck, TlsFiles};
use crate::backend::url::{UrlContext, UrlError};

/// PEM contents, and where they came from (for messages).
type Found<T> = (Option<T>, String);

/// A client certificate and its key, PEM.
type Pair = (Vec<u8>, Vec<u8>);

/// TLS from the URL's parameters, the environment's files and libpq's default files;
/// sets tokio-postgres' `sslmode` and `channel_binding` to match.
pub(super) fn tls(
    params: &LibpqParams,
    config: &mut tokio_postgres::Config,
    ctx: &UrlContext<'_>,
) -> Result<Option<PgTls>, UrlError> {
    let (mode, system) = mode(params)?;
    config.channel_binding(channel_binding(params, mode)?);
    if !uses_tls(config, mode)? {
        return Ok(None);
    }
    let env = TlsFiles::from_env(ctx.env)?;
    let home = (ctx.env)("HOME").filter(|h| !h.is_empty());
    // libpq's default files, used only when they exist.
    let default_file = |name: &str| {
        home.as_ref()
            .map(|h| Path::new(h).join(".postgresql").join(name))
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
    };
    let (ca, ca_from) = roots(params, env.ca, default_file("root.crt"))?;
    let check = server_check(mode, system || ca.is_some())?;
    let (client, client_from) = client(params, env.client, default_file("postgresql.crt"))?;

    let roots = match &ca {
        Some(pem) => Roots::Pem(pem),
        None => Roots::System,
    };
    let client_pair = client.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice()));
    let made = client_config(check, roots, client_pair).map_err(|e| match e {
        UrlError::Backend(why) if why.starts_with("the CA file") => {
            UrlError::Backend(format!("{why} ({ca_from})"))
        }
        UrlError::Backend(why) if why.starts_with("the client") => {
            UrlError::Backend(format!("{why} ({client_from})"))
        }
        other => other,
    })?;
    let mut rustls = (*made).clone();
    rustls.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Some(PgTls {
        mode,
        check,
        client_cert: client.is_some(),
        config: Arc::new(rustls),
    }))
}

/// The `sslmode`, and whether `sslrootcert=system` was given (which needs
/// `verify-full`); refuses GSSAPI encryption.
fn mode(params: &LibpqParams) -> Result<(SslMode, bool), UrlError> {
    let system = params.sslrootcert.as_deref() == Some("system");
    let mode = match params.sslmode.as_deref() {
        Some(value) => SslMode::parse(value)?,
        // libpq 16: the system's roots mean verify-full unless told otherwise.
        None if system => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if system && mode != SslMode::VerifyFull {
        return Err(UrlError::Backend(format!(
            "sslrootcert=system needs sslmode=verify-full, not {} (any CA of the system \
             may have signed a certificate for any name)",
            mode.as_str()
        )));
    }
    match params.gssencmode.as_deref() {
        None | Some("disable" | "prefer") => {}
        Some(_) => {
            return Err(UrlError::Backend(
                "lockrun does not use GSSAPI encryption: use gssencmode=disable (or leave it \
                 out) and sslmode for TLS"
                    .to_owned(),
            ))
        }
    }
    Ok((mode, system))
}

/// `channel_binding`, which `require` only with TLS.
fn channel_binding(params: &LibpqParams, mode: SslMode) -> Result<ChannelBinding, UrlError> {
    let binding = match params.channel_binding.as_deref() {
        None | Some("prefer") => ChannelBinding::Prefer,
        Some("disable") => ChannelBinding::Disable,
        Some("require") => ChannelBinding::Require,
        Some(other) => {
            return Err(UrlError::Backend(format!(
                "channel_binding={} is not valid: use disable, prefer or require",
                other.chars().take(32).collect::<String>()
            )))
        }
    };
    if binding == ChannelBinding::Require && mode == SslMode::Disable {
        return Err(UrlError::Backend(
            "channel_binding=require needs TLS: not with sslmode=disable".to_owned(),
        ));
    }
    Ok(binding)
}

/// Sets tokio-postgres' `sslmode`; false when the connection is plain (`disable`, or
/// only Unix-domain sockets).
fn uses_tls(config: &mut tokio_postgres::Config, mode: SslMode) -> Result<bool, UrlError> {
    // libpq ignores sslmode on Unix-domain sockets (the server never offers TLS there).
    let all_unix = !config.get_hosts().is_empty()
        && config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    if mode == SslMode::Disable || all_unix {
        config.ssl_mode(PgMode::Disable);
        return Ok(false);
    }
    if mode == SslMode::Prefer && config.get_ssl_negotiation() == SslNegotiation::Direct {
        return Err(UrlError::Backend(
            "sslnegotiation=direct needs sslmode=require, verify-ca or verify-full".to_owned(),
        ));
    }
    config.ssl_mode(if mode == SslMode::Prefer {
        PgMode::Prefer
    } else {
        PgMode::Require
    });
    Ok(true)
}

/// The roots: sslrootcert, LOCKRUN_TLS_CA (`env_ca`), ~/.postgresql/root.crt
/// (`default`, if it exists). None for the system's roots, or for none at all.
fn roots(
    params: &LibpqParams,
    env_ca: Option<Vec<u8>>,
    default: Option<String>,
) -> Result<Found<Vec<u8>>, UrlError> {
    Ok(match params.sslrootcert.as_deref() {
        Some("system") => (None, "sslrootcert=system".to_owned()),
        Some(path) => (
            Some(read_file("sslrootcert", path)?),
            format!("sslrootcert={path}"),
        ),
        None => match (env_ca, default) {
            (Some(pem), _) => (Some(pem), "LOCKRUN_TLS_CA".to_owned()),
            (None, Some(path)) => (Some(read_file("the default sslrootcert", &path)?), path),
            (None, None) => (None, String::new()),
        },
    })
}

/// How much of the server's certificate `mode` checks, given whether there are roots
/// (any root makes `prefer` and `require` check the chain, as libpq does).
fn server_check(mode: SslMode, has_roots: bool) -> Result<ServerCheck, UrlError> {
    let check = match mode {
        SslMode::VerifyFull => ServerCheck::ChainAndNameOrCommonName,
        SslMode::VerifyCa => ServerCheck::Chain,
        _ if has_roots => ServerCheck::Chain,
        _ => ServerCheck::EncryptOnly,
    };
    if !has_roots && check != ServerCheck::EncryptOnly {
        return Err(UrlError::Backend(format!(
            "sslmode={} needs the CA that signed the server's certificate: set \
             sslrootcert=FILE, sslrootcert=system or LOCKRUN_TLS_CA (or put it in \
             ~/.postgresql/root.crt)",
            mode.as_str()
        )));
    }
    Ok(check)
}

/// The client certificate and key: sslcert and sslkey, LOCKRUN_TLS_CERT and _KEY
/// (`env_pair`), libpq's ~/.postgresql/postgresql.crt (`default`, if it exists) and .key.
fn client(
    params: &LibpqParams,
    env_pair: Option<Pair>,
    default: Option<String>,
) -> Result<Found<Pair>, UrlError> {
    Ok(
        match (params.sslcert.as_deref(), params.sslkey.as_deref()) {
            (Some(cert), Some(key)) => {
                let cert_pem = read_file("sslcert", cert)?;
                check_key_mode("sslkey", key)?;
                (
                    Some((cert_pem, read_file("sslkey", key)?)),
                    format!("sslcert={cert}, sslkey={key}"),
                )
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(UrlError::Backend(
                    "sslcert and sslkey go together: give both or neither".to_owned(),
                ))
            }
            (None, None) => match (env_pair, default) {
                (Some(pair), _) => (Some(pair), "LOCKRUN_TLS_CERT, LOCKRUN_TLS_KEY".to_owned()),
                (None, Some(cert)) => {
                    let key = cert.trim_end_matches(".crt").to_owned() + ".key";
                    check_key_mode("the default sslkey", &key)?;
                    let pair = (
                        read_file("the default sslcert", &cert)?,
                        read_file("the default sslkey", &key)?,
                    );
                    (Some(pair), format!("{cert}, {key}"))
                }
                (None, None) => (None, String::new()),
            },
        },
    )
}

/// A file named by a parameter or a variable: its contents, or a 125 naming it.
fn read_file(var: &'static str, path: &str) -> Result<Vec<u8>, UrlError> {
    std::fs::read(path).map_err(|e| UrlError::TlsFile {
        var,
        path: path.to_owned(),
        reason: e.kind().to_string(),
    })
}

/// libpq's refusal of a private key others may read: at most 0600 for a file of ours,
/// 0640 for one of root's.
fn check_key_mode(var: &'static str, path: &str) -> Result<(), UrlError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| UrlError::TlsFile {
        var,
        path: path.to_owned(),
        reason: e.kind().to_string(),
    })?;
    let mode = meta.mode() & 0o777;
    let allowed = if meta.uid() == 0 { 0o640 } else { 0o600 };
    if meta.is_file() && mode & !allowed != 0 {
        return Err(UrlError::Backend(format!(
            "{var} ({path}) can be read by others (mode {mode:04o}): chmod 600 it \
             (0640 if root owns it), as libpq requires"
        )));
    }
    Ok(())
}
