//! The backend part of the configuration: the `--url`s checked by the parser of their
//! scheme (through [`crate::backend::KINDS`]), with the password applied and TLS files
//! read. Errors never echo a URL or a password. Part of [`crate::config`]; logs (one
//! warning about a password file others may read) through [`crate::log`].

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
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
    /// How many may hold one name at once (`--slots`; 1 is a plain lock).
    pub slots: u32,
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
        check_slots(target.as_ref(), args.slots)?;
        Ok(BackendConfig {
            display: target.display(),
            target,
            key_prefix: args.key_prefix.clone(),
            slots: args.slots,
        })
    }
}

/// Refuses `--slots` above 1 for a backend that cannot keep a semaphore
/// ([`Target::semaphores`]), before anything is connected.
fn check_slots(target: &dyn Target, slots: u32) -> Result<(), ConfigError> {
    if slots > 1 && !target.semaphores() {
        return Err(ConfigError::Backend(format!(
            "--slots {slots} needs a backend that keeps semaphores, and {} does not: use \
             --slots 1, or a backend README's \"Choosing a backend\" lists for semaphores",
            target.display()
        )));
    }
    Ok(())
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

/// The most of a password file that is read. A password is short; a device or a huge
/// file (a wrong path) must not be read whole.
const PASSWORD_FILE_MAX: usize = 4096;

/// The first line of the password file, which must be a regular-sized text file with a
/// non-empty first line. A file that others may read still works (as with ssh's and
/// libpq's files), with a warning.
fn read_password_file(path: &Path) -> Result<String, ConfigError> {
    let refused = |reason: String| ConfigError::PasswordFile {
        path: path.display().to_string(),
        reason,
    };
    let file = File::open(path).map_err(|e| refused(e.kind().to_string()))?;
    let mut bytes = Vec::new();
    (&file)
        .take(PASSWORD_FILE_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| refused(e.kind().to_string()))?;
    if bytes.len() > PASSWORD_FILE_MAX {
        return Err(refused(
            "it holds more than 4 KiB: put only the password in it, on its first line".into(),
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| refused("it is not UTF-8 text".into()))?;
    let password = text.lines().next().unwrap_or("");
    if password.is_empty() {
        return Err(refused("its first line, the password, is empty".into()));
    }
    // The mode of the file opened (not of the path, which may change meanwhile).
    if let Ok(meta) = file.metadata() {
        warn_if_shared(path, meta.mode());
    }
    Ok(password.to_owned())
}

/// One warning line if group or others may read the password file.
fn warn_if_shared(path: &Path, mode: u32) {
    if mode & 0o044 == 0 {
        return;
    }
    let msg = format!(
        "the password file {} can be read by group or others (mode {:04o}): restrict it \
         to its owner (chmod 600; in Kubernetes, defaultMode: 0400)",
        path.display(),
        mode & 0o7777
    );
    crate::log::emit(
        crate::log::Level::Warn,
        crate::log::Event::PasswordFileMode,
        &msg,
        &[],
    );
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

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
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
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

    #[test]
    fn a_password_file_is_read_up_to_4_kib_and_its_first_line_must_not_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        let read = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            read_password_file(&path).map_err(|e| e.to_string())
        };
        assert_eq!(read(b"pw").as_deref(), Ok("pw"));
        assert_eq!(read(b"pw\r\nrest").as_deref(), Ok("pw"));
        let mut full = b"pw\n".to_vec();
        full.resize(PASSWORD_FILE_MAX, b'#');
        assert_eq!(read(&full).as_deref(), Ok("pw"));
        full.push(b'#');
        assert!(read(&full).unwrap_err().contains("more than 4 KiB"));
        for empty in [&b""[..], b"\n", b"\r\n", b"\nsecond\n"] {
            assert!(read(empty).unwrap_err().contains("is empty"), "{empty:?}");
        }
        assert!(read(b"\xff\xfe").unwrap_err().contains("UTF-8"));
        let e = read_password_file(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("more than 4 KiB"), "{e}");
    }

    /// A backend that keeps no semaphores (none does today; a new one might).
    #[derive(Debug)]
    struct NoSemaphores;

    impl Target for NoSemaphores {
        fn display(&self) -> String {
            "h:1".into()
        }
        fn open(&self, _: &BackendConfig, _: bool) -> crate::backend::AnyBackend {
            unreachable!("never opened")
        }
        fn semaphores(&self) -> bool {
            false
        }
    }

    #[test]
    fn slots_above_1_need_a_backend_that_keeps_semaphores() {
        assert_eq!(check_slots(&NoSemaphores, 1), Ok(()));
        let e = check_slots(&NoSemaphores, 2).unwrap_err().to_string();
        assert!(e.contains("--slots 2") && e.contains("h:1 does not"), "{e}");
        for url in [
            "redis://h:1",
            "redis+sentinel://s:1/m",
            "redis://a:1,redis://b:2,redis://c:3",
            "etcd://h:1",
            "zk://h:1",
            "file:///var/lib/lockrun",
            "postgres://u@h:1/db",
        ] {
            let mut a = args(&[url]);
            a.slots = 3;
            assert!(BackendConfig::from_args(&a, None).is_ok(), "{url}");
        }
    }
}
