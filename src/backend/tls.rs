//! TLS material named in the environment, shared by the backends that speak TLS:
//! `LOCKRUN_TLS_CA` (a private CA to trust instead of the system roots),
//! `LOCKRUN_TLS_CERT` and `LOCKRUN_TLS_KEY` (a client certificate), all PEM files.
//! Read once when the configuration is checked, so a missing file is a 125 before
//! anything starts. Part of [`super`].

use crate::config::ConfigError;

/// The PEM contents of the files named in the environment.
#[derive(Clone, Default)]
pub struct TlsFiles {
    /// A private CA to trust instead of the system roots.
    pub ca: Option<Vec<u8>>,
    /// A client certificate and its key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl TlsFiles {
    /// Reads the files named in the environment (`get` looks a variable up).
    pub fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<TlsFiles, ConfigError> {
        let read = |var: &'static str| -> Result<Option<Vec<u8>>, ConfigError> {
            match get(var).filter(|p| !p.is_empty()) {
                None => Ok(None),
                Some(path) => std::fs::read(&path)
                    .map(Some)
                    .map_err(|e| ConfigError::TlsFile {
                        var,
                        path,
                        reason: e.kind().to_string(),
                    }),
            }
        };
        let client = match (read("LOCKRUN_TLS_CERT")?, read("LOCKRUN_TLS_KEY")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(ConfigError::TlsHalfPair),
        };
        Ok(TlsFiles {
            ca: read("LOCKRUN_TLS_CA")?,
            client,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_a_client_pair_is_refused_and_keys_are_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("c.pem");
        std::fs::write(&cert, "SECRET-KEY-MATERIAL").unwrap();
        let path = cert.display().to_string();
        let only_cert = |v: &str| (v == "LOCKRUN_TLS_CERT").then(|| path.clone());
        assert_eq!(
            TlsFiles::from_env(&only_cert).unwrap_err(),
            ConfigError::TlsHalfPair
        );
        let both = |v: &str| v.starts_with("LOCKRUN_TLS_").then(|| path.clone());
        let files = TlsFiles::from_env(&both).unwrap();
        assert!(files.ca.is_some() && files.client.is_some());
        assert!(!format!("{files:?}").contains("SECRET"));
        let missing = |v: &str| (v == "LOCKRUN_TLS_CA").then(|| "/nonexistent/ca".to_owned());
        assert!(matches!(
            TlsFiles::from_env(&missing),
            Err(ConfigError::TlsFile {
                var: "LOCKRUN_TLS_CA",
                ..
            })
        ));
    }
}
