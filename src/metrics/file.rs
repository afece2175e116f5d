//! The metrics file on disk, in a directory that someone else may be able to write:
//! node_exporter's textfile directory often belongs to an unprivileged user, while
//! lockrun often runs as root. So nothing here ever follows a symlink or trusts a
//! name: the previous file is read only if it is a regular file of at most 64 KiB
//! (opened without following a symlink and without blocking on a FIFO), and the new
//! file is written into a temporary file of unpredictable name that this process
//! created itself (`O_EXCL`), then renamed over the path, which replaces whatever is
//! there (a symlink included) without writing through it. Depends on [`crate::token`].

use std::ffi::{OsStr, OsString};
use std::fs::{File, FileType, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::libc;

/// The most of a previous file that is read. lockrun's own file is about 1 KiB; the
/// bound keeps a planted huge file (or a link to `/dev/zero`) from growing lockrun.
pub const MAX_PREVIOUS: u64 = 64 * 1024;

/// The file's mode whatever the umask: node_exporter, often another user, reads it.
const MODE: u32 = 0o644;

/// Temporary names tried before giving up. Each has 64 random bits, so a name that
/// exists already was planted: a few tries only make a planted name harmless.
const ATTEMPTS: usize = 4;

/// The longest prefix of the file's name kept in the temporary name, so that the
/// temporary name (about 20 bytes more) stays within `NAME_MAX` (255).
const NAME_PREFIX: usize = 200;

/// What the previous file can give.
#[derive(Debug, PartialEq)]
pub enum Previous {
    /// Its text (empty when there is no file yet).
    Text(String),
    /// It is not read, for this reason (a clause: "is a FIFO, not a regular file").
    Unusable(String),
    /// A directory: there is nothing to read and nothing can replace it.
    Directory,
}

/// Reads the previous file at `path` without following a symlink, blocking, or
/// reading more than [`MAX_PREVIOUS`] bytes.
pub fn read_previous(path: &Path) -> Previous {
    // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
    // O_NOCTTY: a terminal must never become lockrun's controlling terminal.
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Previous::Text(String::new()),
        Err(e) => return unopenable(path, &e),
    };
    // The type of what was opened (fstat), not of what the path names a moment later.
    let meta = match file.metadata() {
        Ok(meta) => meta,
        Err(e) => return Previous::Unusable(format!("cannot be read ({e})")),
    };
    if meta.is_dir() {
        return Previous::Directory;
    }
    if !meta.is_file() {
        return Previous::Unusable(format!(
            "is a {}, not a regular file",
            kind(meta.file_type())
        ));
    }
    let too_big = || Previous::Unusable(format!("is over {} KiB", MAX_PREVIOUS / 1024));
    if meta.len() > MAX_PREVIOUS {
        return too_big();
    }
    // One byte more than allowed tells a file that grew since the fstat.
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_PREVIOUS + 1).read_to_end(&mut bytes) {
        return Previous::Unusable(format!("cannot be read ({e})"));
    }
    if bytes.len() as u64 > MAX_PREVIOUS {
        return too_big();
    }
    // Only one line is looked for in it: a stray invalid byte elsewhere must not lose it.
    Previous::Text(String::from_utf8_lossy(&bytes).into_owned())
}

/// Why `path` could not be opened (`e`), saying what it is when that is the reason.
fn unopenable(path: &Path, e: &io::Error) -> Previous {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_symlink() => Previous::Unusable("is a symbolic link".into()),
        Ok(meta) if meta.is_dir() => Previous::Directory,
        Ok(meta) if !meta.is_file() => Previous::Unusable(format!(
            "is a {}, not a regular file",
            kind(meta.file_type())
        )),
        _ => Previous::Unusable(format!("cannot be read ({e})")),
    }
}

/// The name of a file type that is neither a regular file nor a directory.
fn kind(t: FileType) -> &'static str {
    if t.is_symlink() {
        "symbolic link"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// Replaces `path` with a regular file of mode 0644 holding `text`, atomically: a
/// reader sees the old file or the new one, never a part. Whatever was at `path`
/// (a symlink included) is replaced, never written through. On failure nothing of
/// this call is left behind.
pub fn replace(path: &Path, text: &str) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path names no file; give a file's path",
        )
    })?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let (tmp, mut file) = create_temporary(dir, name)?;
    let written = fill(&mut file, text).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir)
}

/// Creates a new temporary file for `name` in `dir`, with a name no one can guess
/// ahead: the pid is not enough (every container's lockrun may be PID 1, and a local
/// user can plant a symlink under every pid). `O_EXCL` makes the file this process's
/// own; with `O_NOFOLLOW`, no symlink in its place is ever followed.
fn create_temporary(dir: &Path, name: &OsStr) -> io::Result<(PathBuf, File)> {
    for _ in 0..ATTEMPTS {
        let tmp = dir.join(temporary_name(name));
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp);
        match created {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "every random temporary name tried exists already in its directory; \
         look for planted files there",
    ))
}

/// `.NAME.RANDOM.tmp`: a dot-file not ending in `.prom`, which the textfile collector
/// ignores.
fn temporary_name(name: &OsStr) -> OsString {
    let kept = &name.as_bytes()[..name.len().min(NAME_PREFIX)];
    let mut tmp = b".".to_vec();
    tmp.extend_from_slice(kept);
    tmp.extend_from_slice(format!(".{}.tmp", crate::token::random_hex(8)).as_bytes());
    OsString::from_vec(tmp)
}

/// Sets the mode (the umask applied at creation), writes `text` and syncs it, so
/// that the rename never publishes an empty file after a crash.
fn fill(file: &mut File, text: &str) -> io::Result<()> {
    file.set_permissions(Permissions::from_mode(MODE))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// Syncs the directory, so that the rename itself survives a crash. A file system
/// that cannot sync a directory (EINVAL) is not an error.
fn sync_dir(dir: &Path) -> io::Result<()> {
    match File::open(dir).and_then(|d| d.sync_all()) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::process::Command;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn no_file_is_an_empty_previous_text() {
        let dir = tempfile::tempdir().unwrap();
        let previous = read_previous(&dir.path().join("job.prom"));
        assert_eq!(previous, Previous::Text(String::new()));
    }

    #[test]
    fn a_regular_file_up_to_64_kib_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.prom");
        let text = "x".repeat(MAX_PREVIOUS as usize);
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_previous(&path), Previous::Text(text));
    }

    #[test]
    fn a_file_one_byte_over_64_kib_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.prom");
        std::fs::write(&path, "x".repeat(MAX_PREVIOUS as usize + 1)).unwrap();
        assert_eq!(
            read_previous(&path),
            Previous::Unusable("is over 64 KiB".into())
        );
    }

    #[test]
    fn a_symlink_is_not_followed_even_to_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "text").unwrap();
        let path = dir.path().join("job.prom");
        symlink(&target, &path).unwrap();
        assert_eq!(
            read_previous(&path),
            Previous::Unusable("is a symbolic link".into())
        );
    }

    #[test]
    fn a_fifo_without_a_writer_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.prom");
        assert!(Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap()
            .success());
        // A blocking open would never return: the test would hang, not fail.
        let expected = Previous::Unusable("is a FIFO, not a regular file".into());
        assert_eq!(read_previous(&path), expected);
    }

    #[test]
    fn a_directory_is_neither_read_nor_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.prom");
        std::fs::create_dir(&path).unwrap();
        assert_eq!(read_previous(&path), Previous::Directory);
        assert!(replace(&path, "text").is_err());
        let left = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(left, 1, "a temporary file was left");
    }

    #[test]
    fn a_socket_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.prom");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let expected = Previous::Unusable("is a socket, not a regular file".into());
        assert_eq!(read_previous(&path), expected);
    }

    #[test]
    fn replace_puts_a_0644_regular_file_in_place_of_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "root only").unwrap();
        std::fs::set_permissions(&target, Permissions::from_mode(0o600)).unwrap();
        let path = dir.path().join("job.prom");
        symlink(&target, &path).unwrap();
        replace(&path, "metrics\n").unwrap();
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "metrics\n");
        assert_eq!(mode(&path), 0o644);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "root only");
        assert_eq!(mode(&target), 0o600);
    }

    #[test]
    fn temporary_names_are_random_hidden_and_bounded() {
        let a = temporary_name(OsStr::new("job.prom"));
        let b = temporary_name(OsStr::new("job.prom"));
        assert_ne!(a, b);
        let a = a.to_str().unwrap();
        assert!(a.starts_with(".job.prom.") && a.ends_with(".tmp"), "{a}");
        // No part is the pid (16 random hex digits may hold a short pid's digits).
        let pid = std::process::id().to_string();
        assert!(!a.split('.').any(|part| part == pid), "{a}");
        assert!(temporary_name(OsStr::new(&"n".repeat(255))).len() <= 255);
    }
}
