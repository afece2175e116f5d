//! The backend part of the configuration: the `--url`s checked by the parser of their
//! scheme (through the registry, [`crate::backend::registry::KINDS`]), with the password
//! applied and TLS files read, into a [`BackendConfig`]. Errors never echo a URL or a
//! password. Part of [`crate::config`]; logs (one warning about a password file others
//! may read) through [`crate::log`].

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::libc;

use super::ConfigError;
use crate::backend::registry::parse_urls;
use crate::backend::url::{BackendConfig, BackendOptions, Target, UrlContext, UrlError};

/// Checks the backend options: the `--url`s (`urls`) by the parser of their scheme,
/// with the password of `password_file` (or else `env_password`, `LOCKRUN_PASSWORD`)
/// applied, and `--slots`.
pub fn check_backend(
    urls: &[String],
    options: &BackendOptions,
    slots: u32,
    password_file: Option<&Path>,
    env_password: Option<String>,
) -> Result<BackendConfig, ConfigError> {
    let password = password(password_file, env_password)?;
    let env = |var: &str| std::env::var(var).ok();
    let ctx = UrlContext {
        password,
        options,
        env: &env,
    };
    let target = parse_urls(urls, &ctx)?;
    check_slots(target.as_ref(), slots)?;
    Ok(BackendConfig {
        display: target.display(),
        target,
        key_prefix: options.key_prefix.clone(),
        slots,
    })
}

/// Refuses `--slots` above 1 for a backend that cannot keep a semaphore
/// ([`Target::semaphores`]), before anything is connected.
fn check_slots(target: &dyn Target, slots: u32) -> Result<(), ConfigError> {
    if slots > 1 && !target.semaphores() {
        return Err(ConfigError::Url(UrlError::Backend(format!(
            "--slots {slots} needs a backend that keeps semaphores, and {} does not: use \
             --slots 1, or docs/backends.md's \"Choosing a backend\" lists for semaphores",
            target.display()
        ))));
    }
    Ok(())
}

/// The password to use: the first line of `--password-file` if given, else
/// `LOCKRUN_PASSWORD` (`env_password`) if not empty; either wins over the URL's.
fn password(
    password_file: Option<&Path>,
    env_password: Option<String>,
) -> Result<Option<String>, ConfigError> {
    match password_file {
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
    // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever, and a
    // run must fail in one line, not hang. Symlinks are followed (Kubernetes mounts a
    // secret's file as one); what they lead to must be a regular file.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| refused(e.kind().to_string()))?;
    let meta = file.metadata().map_err(|e| refused(e.kind().to_string()))?;
    if !meta.is_file() {
        return Err(refused(
            "it is not a regular file (a FIFO, a device or a directory): give the path of a              file that holds the password"
                .into(),
        ));
    }
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
    warn_if_shared(path, meta.mode());
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
    use crate::backend::url::testing::options;

    /// Checks `urls` with the default options, `slots`, and the password sources.
    fn check(
        urls: &[&str],
        slots: u32,
        password_file: Option<&Path>,
        env_password: Option<&str>,
    ) -> Result<BackendConfig, ConfigError> {
        let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
        let env_password = env_password.map(str::to_owned);
        check_backend(&urls, &options(), slots, password_file, env_password)
    }

    #[test]
    fn an_unknown_scheme_is_named_and_the_url_never_echoed() {
        let e = check(&["memcached://:s3cret@x"], 1, None, None).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Url(UrlError::BadScheme { scheme, .. }) if scheme == "memcached"),
            "{e:?}"
        );
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
            let c = check(&[url], 1, None, None).unwrap();
            assert_eq!(c.display, display, "{url}");
            assert!(!format!("{c:?}").contains("\"pw\""));
        }
        let several = ["redis://a:1", "redis://b:2", "redis://c:3"];
        assert_eq!(
            check(&several, 1, None, None).unwrap().display,
            "a:1,b:2,c:3"
        );
    }

    #[test]
    fn the_password_file_wins_over_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "filepw\nsecond line\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let url = ["etcd://root@h:1"];
        assert_eq!(
            password(Some(&path), Some("envpw".into()))
                .unwrap()
                .as_deref(),
            Some("filepw")
        );
        let c = check(&url, 1, Some(&path), Some("envpw")).unwrap();
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("filepw") && !shown.contains("envpw"),
            "{shown}"
        );
        assert_eq!(
            password(None, Some("envpw".into())).unwrap().as_deref(),
            Some("envpw")
        );
        assert_eq!(password(None, Some(String::new())).unwrap(), None);
        let missing = dir.path().join("missing");
        assert!(matches!(
            check(&url, 1, Some(&missing), None),
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
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_password_file_that_is_a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pw");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Without a writer, a blocking open of the FIFO would never return: do it on a
        // thread and wait a bounded time for its answer.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || tx.send(read_password_file(&path).map_err(|e| e.to_string())));
        let answer = rx.recv_timeout(std::time::Duration::from_secs(10));
        let e = answer
            .expect("reading a FIFO as the password file hung")
            .unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        // A symlink to a regular file (a Kubernetes secret's mount) still works.
        let real = dir.path().join("real");
        std::fs::write(&real, "pw\n").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(read_password_file(&link).unwrap(), "pw");
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
            assert!(check(&[url], 3, None, None).is_ok(), "{url}");
        }
    }
}
