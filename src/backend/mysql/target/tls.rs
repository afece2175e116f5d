//! TLS to MySQL as the `mysql` client names it: `ssl-mode` (`DISABLED`, `PREFERRED`
//! (the default), `REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY`; any case), `ssl-ca` (a
//! PEM file of the CAs to trust), `ssl-cert` and `ssl-key` (a client certificate, both
//! or neither). Part of [`super`].
//!
//! `PREFERRED` encrypts when the server offers TLS and goes on in plain text when it
//! offers none (as the client does: it stops no one in the middle); `REQUIRED`
//! encrypts or fails. Neither checks the certificate unless `ssl-ca` is given, which
//! makes them check the chain (as `VERIFY_CA`). `VERIFY_CA` checks the chain up to
//! `ssl-ca`'s CAs, or the system's roots without it; `VERIFY_IDENTITY` checks the host
//! name (or IP address) of the URL against the certificate too: the one mode that stops
//! a man in the middle. A chain that fails the check is an error (125), never a
//! fall-back to plain text. Files are read, and checked with the shared rustls set-up
//! (`backend::tls::client_config`), when the URL is: a missing or bad file is a 125
//! before anything starts. The handshake itself is mysql_async's, on the same rustls.

use mysql_async::{ClientIdentity, SslOpts};

use crate::backend::tls::{client_config, Roots, ServerCheck};
use crate::backend::url::UrlError;

/// The `mysql` client's `ssl-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plain text.
    Disabled,
    /// TLS when the server offers it, plain text otherwise.
    Preferred,
    /// TLS or nothing.
    Required,
    /// TLS, and the chain checked.
    VerifyCa,
    /// TLS, the chain and the host name checked.
    VerifyIdentity,
}

impl SslMode {
    /// Reads a mode as the client spells it (any case).
    pub fn parse(value: &str) -> Result<SslMode, UrlError> {
        Ok(match value.to_ascii_uppercase().as_str() {
            "DISABLED" => SslMode::Disabled,
            "PREFERRED" => SslMode::Preferred,
            "REQUIRED" => SslMode::Required,
            "VERIFY_CA" => SslMode::VerifyCa,
            "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
            _ => {
                return Err(UrlError::Backend(format!(
                    "ssl-mode={} is not valid: use DISABLED, PREFERRED, REQUIRED, VERIFY_CA \
                     or VERIFY_IDENTITY",
                    value.chars().take(32).collect::<String>()
                )))
            }
        })
    }
}

/// TLS as the URL asks for it, with the files already read.
#[derive(Clone)]
pub struct MyTls {
    /// The mode asked for.
    pub mode: SslMode,
    /// The CAs to trust: `ssl-ca`'s PEM, or the system's roots (DER, one each) when a
    /// chain is checked without it.
    roots: Vec<Vec<u8>>,
    /// The chain is checked.
    check_chain: bool,
    /// The client certificate chain and key (PEM).
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for MyTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("MyTls")
            .field("mode", &self.mode)
            .field("check_chain", &self.check_chain)
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

/// Reads the file of parameter `param`.
fn read(param: &str, path: &str) -> Result<Vec<u8>, UrlError> {
    std::fs::read(path).map_err(|e| {
        UrlError::Backend(format!(
            "cannot read the MySQL URL's {param} ({path}): {}",
            e.kind()
        ))
    })
}

impl MyTls {
    /// Checks the mode and reads the files (`ssl-ca`, `ssl-cert`, `ssl-key`).
    pub fn new(
        mode: SslMode,
        ca: Option<String>,
        cert: Option<String>,
        key: Option<String>,
    ) -> Result<MyTls, UrlError> {
        let ca = ca.map(|p| read("ssl-ca", &p)).transpose()?;
        let client = match (cert, key) {
            (Some(c), Some(k)) => Some((read("ssl-cert", &c)?, read("ssl-key", &k)?)),
            (None, None) => None,
            _ => {
                return Err(UrlError::Backend(
                    "ssl-cert and ssl-key go together in the MySQL URL: give both or neither"
                        .to_owned(),
                ))
            }
        };
        if mode == SslMode::Disabled && (ca.is_some() || client.is_some()) {
            return Err(UrlError::Backend(
                "the MySQL URL has ssl-mode=DISABLED and TLS files: remove the files, or \
                 choose another ssl-mode"
                    .to_owned(),
            ));
        }
        let check_chain =
            matches!(mode, SslMode::VerifyCa | SslMode::VerifyIdentity) || ca.is_some();
        // The shared set-up refuses a file without a certificate, an unreadable key or a
        // key of another certificate, in one line.
        let roots = match &ca {
            Some(pem) => Roots::Pem(pem),
            None => Roots::System,
        };
        let check = if check_chain {
            ServerCheck::Chain
        } else {
            ServerCheck::EncryptOnly
        };
        let client_pair = client.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice()));
        if mode != SslMode::Disabled {
            client_config(check, roots, client_pair)?;
        }
        let roots = match ca {
            Some(pem) => vec![pem],
            None if check_chain => system_roots()?,
            None => Vec::new(),
        };
        Ok(MyTls {
            mode,
            roots,
            check_chain,
            client,
        })
    }

    /// mysql_async's options for this mode; `None` for plain text (and for the second
    /// try of `PREFERRED`, which the caller makes without TLS).
    pub fn ssl_opts(&self) -> Option<SslOpts> {
        if self.mode == SslMode::Disabled {
            return None;
        }
        let buf = |b: &Vec<u8>| b.clone().into();
        let mut opts = SslOpts::default()
            .with_root_certs(self.roots.iter().map(buf).collect())
            // An empty store cannot make a verifier: without a chain to check, the
            // built-in roots stay, unused.
            .with_disable_built_in_roots(self.check_chain)
            .with_danger_accept_invalid_certs(!self.check_chain)
            // The name is always checked here (mysql_async's own skipping does not know
            // this rustls's error): VERIFY_CA asks again by a name the certificate holds
            // ([`presented_name`]).
            .with_danger_skip_domain_validation(false);
        if let Some((cert, key)) = &self.client {
            opts = opts.with_client_identity(Some(ClientIdentity::new(buf(cert), buf(key))));
        }
        Some(opts)
    }
}

impl MyTls {
    /// Whether the host name is checked (`VERIFY_IDENTITY`): otherwise a chain that
    /// holds for another name is taken ([`presented_name`]).
    pub fn checks_name(&self) -> bool {
        self.mode == SslMode::VerifyIdentity
    }
}

/// The first name the server's certificate holds, when `e` is a refusal of that
/// certificate for its name only: rustls checks the chain first, so the chain held.
/// As a server name (a wildcard's `*` as a label of its own).
pub fn presented_name(e: &mysql_async::Error) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        let inner = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        if let Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForNameContext { presented, .. },
        )) = inner.unwrap_or(err).downcast_ref::<rustls::Error>()
        {
            let name = presented.first()?;
            let name = ["DnsName(\"", "IpAddress("]
                .iter()
                .find_map(|p| name.strip_prefix(p))
                .map_or(name.as_str(), |rest| {
                    rest.trim_end_matches(')').trim_end_matches('"')
                });
            return Some(match name.strip_prefix("*.") {
                Some(rest) => format!("lockrun.{rest}"),
                None => name.to_owned(),
            });
        }
        next = inner.or_else(|| err.source());
    }
    None
}

/// The system's roots, DER each; none is an error.
fn system_roots() -> Result<Vec<Vec<u8>>, UrlError> {
    let found = rustls_native_certs::load_native_certs();
    let roots: Vec<Vec<u8>> = found.certs.iter().map(|c| c.as_ref().to_vec()).collect();
    if roots.is_empty() {
        return Err(UrlError::Backend(
            "ssl-mode=VERIFY_CA or VERIFY_IDENTITY without ssl-ca needs the system's CA \
             certificates, and none were found: give ssl-ca, or install ca-certificates"
                .to_owned(),
        ));
    }
    Ok(roots)
}
