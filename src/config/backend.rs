//! The backend part of the configuration: the `--url`s checked by the parser of their
//! scheme (through [`crate::backend::KINDS`]), with the password applied and TLS files
//! read. Errors never echo a URL or a password. Part of [`crate::config`].

use std::path::Path;
use std::sync::Arc;

use super::ConfigError;
use crate::backend::{parse_urls, Target, UrlContext};
use crate::cli::BackendArgs;

/// Where the lock lives.
#[derive(Clone, Debug)]
pub struct BackendConfig {
    /// Which backend, and how to reach it (checked by the backend's own parser).
    pub target: Arc<dyn Target>,
    /// The server(s) as `host:port`, for messages (never the full URL).
    pub display: String,
    /// The namespace of the keys.
    pub key_prefix: String,
}

impl BackendConfig {
    /// Checks the backend options; `env_password` is `LOCKRUN_PASSWORD`.
    pub fn from_args(
        args: &BackendArgs,
        env_password: Option<String>,
    ) -> Result<BackendConfig, ConfigError> {
        let password = password(args, env_password)?;
        let env = |var: &str| std::env::var(var).ok();
        let ctx = UrlContext {
            password,
            args,
            env: &env,
        };
        let target = parse_urls(&args.url, &ctx)?;
        Ok(BackendConfig {
            display: target.display(),
            target,
            key_prefix: args.key_prefix.clone(),
        })
    }
}

/// The password to use: the first line of `--password-file` if given, else
/// `LOCKRUN_PASSWORD` (`env_password`) if not empty; either wins over the URL's.
fn password(
    args: &BackendArgs,
    env_password: Option<String>,
) -> Result<Option<String>, ConfigError> {
    match &args.password_file {
        Some(path) => read_password_file(path).map(Some),
        None => Ok(env_password.filter(|p| !p.is_empty())),
    }
}

fn read_password_file(path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::PasswordFile {
        path: path.display().to_string(),
        reason: e.kind().to_string(),
    })?;
    Ok(text.lines().next().unwrap_or("").to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::table::testing::args;

    #[test]
    fn an_unknown_scheme_is_named_and_the_url_never_echoed() {
        let e = BackendConfig::from_args(&args(&["memcached://:s3cret@x"]), None).unwrap_err();
        assert_eq!(e, ConfigError::BadScheme("memcached".into()));
        let text = e.to_string();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(
            text.contains("redis+sentinel://") && text.contains("etcd://"),
            "{text}"
        );
    }

    #[test]
    fn the_url_picks_the_backend_and_the_display() {
        for (url, display) in [
            ("redis://127.0.0.1:6379", "127.0.0.1:6379"),
            ("postgres://u:pw@db:6543/app", "db:6543"),
            ("etcd://a:1,b:2", "a:1,b:2"),
            ("redis+sentinel://s:1/m", "sentinel s:1/m"),
            ("redis://a:1,redis://b:2,redis://c:3", "a:1,b:2,c:3"),
        ] {
            let c = BackendConfig::from_args(&args(&[url]), None).unwrap();
            assert_eq!(c.display, display, "{url}");
            assert!(!format!("{c:?}").contains("\"pw\""));
        }
        let several = args(&["redis://a:1", "redis://b:2", "redis://c:3"]);
        assert_eq!(
            BackendConfig::from_args(&several, None).unwrap().display,
            "a:1,b:2,c:3"
        );
    }

    #[test]
    fn the_password_file_wins_over_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "filepw\nsecond line\n").unwrap();
        let mut a = args(&["etcd://root@h:1"]);
        a.password_file = Some(path);
        assert_eq!(
            password(&a, Some("envpw".into())).unwrap().as_deref(),
            Some("filepw")
        );
        let c = BackendConfig::from_args(&a, Some("envpw".into())).unwrap();
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("filepw") && !shown.contains("envpw"),
            "{shown}"
        );
        let no_file = args(&["etcd://root@h:1"]);
        assert_eq!(
            password(&no_file, Some("envpw".into())).unwrap().as_deref(),
            Some("envpw")
        );
        assert_eq!(password(&no_file, Some(String::new())).unwrap(), None);
        a.password_file = Some(dir.path().join("missing"));
        assert!(matches!(
            BackendConfig::from_args(&a, None),
            Err(ConfigError::PasswordFile { .. })
        ));
    }
}
