//! The lock directory: found (and created if missing) by [`super::walk`], which
//! checks every step of its path, refused unless it is safe to keep locks in, and the
//! lock files in it opened relative to it. Part of [`super`]; uses
//! [`super::lockfile`] for the files.
//!
//! lockrun often runs as root, so the directory must not be a way in: it must be a
//! real directory (not a symlink to one), owned by the effective user (root's must be
//! root's), and writable by no one else, who could otherwise swap a lock file for
//! another (two holders at once) or for a link to a file of root's; the directories
//! and symlinks on its path must not let another user move it or swap it for another
//! (one with lower counters). Lock files are opened with `openat` from the directory's
//! descriptor, `O_NOFOLLOW`, created `0600`, and refused unless they are regular files
//! of the same owner that no one else may read or write (a reader could hold a read
//! lock). Every descriptor is `O_CLOEXEC`: the command inherits none.

use std::fs::File;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode};
use nix::unistd::{geteuid, unlinkat, UnlinkatFlags};

use super::lockfile::LockFile;
use super::record::Record;
use super::walk;
use crate::backend::BackendError;

/// An open, checked lock directory.
pub struct LockDir {
    dir: File,
    path: PathBuf,
    /// Device and inode of the directory opened.
    id: (u64, u64),
}

/// How a lock file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Open {
    /// Read only (`status`); a missing file is `None`.
    Read,
    /// Read and write; a missing file is `None` (`release --force`).
    Write,
    /// Read and write, created if missing (acquire).
    Create,
}

impl LockDir {
    /// Opens and checks `path` ([`walk::open_dir`]); a missing directory is created
    /// (with its missing parents, mode 0700, each fsynced into its parent) if
    /// `create`, else `None`.
    pub fn open(path: &Path, create: bool) -> Result<Option<LockDir>, BackendError> {
        let Some(dir) = walk::open_dir(path, create)? else {
            return Ok(None);
        };
        let meta = dir.metadata().map_err(|e| unusable(path, &e.to_string()))?;
        check_owner_and_mode(&meta, "it").map_err(|why| refused(path, &why))?;
        Ok(Some(LockDir {
            dir,
            path: path.to_owned(),
            id: (meta.dev(), meta.ino()),
        }))
    }

    /// The names of the entries in the directory (read through its descriptor, not
    /// its path), in no order.
    pub fn entries(&self) -> Result<Vec<String>, BackendError> {
        use std::os::fd::AsRawFd;
        let at = format!("/proc/self/fd/{}", self.dir.as_raw_fd());
        let list = std::fs::read_dir(at).map_err(|e| self.io(".", &e))?;
        let mut out = Vec::new();
        for entry in list {
            let entry = entry.map_err(|e| self.io(".", &e))?;
            if let Ok(name) = entry.file_name().into_string() {
                out.push(name);
            }
        }
        Ok(out)
    }

    /// False if the directory's path now names another directory (or nothing): its
    /// lock files are then not the ones other lockruns lock.
    pub fn still_at_path(&self) -> Result<bool, BackendError> {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) => Ok((m.dev(), m.ino()) == self.id),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(unusable(&self.path, &e.to_string())),
        }
    }

    /// Opens the lock file `name` (see [`Open`]) and checks it.
    pub fn open_lock(&self, name: &str, how: Open) -> Result<Option<LockFile>, BackendError> {
        self.open_file(name, how, Role::Lock)
    }

    /// Opens the file `name` of a lock's last run (see [`Open`]; `super::last`) and
    /// checks it as a lock file is checked: created 0600, no symlink followed, refused
    /// unless a regular file of this user's that no one else may use.
    pub fn open_run_record(&self, name: &str, how: Open) -> Result<Option<LockFile>, BackendError> {
        self.open_file(name, how, Role::RunRecord)
    }

    /// Opens the file `name` of `role` (see [`Open`]) and checks it.
    fn open_file(
        &self,
        name: &str,
        how: Open,
        role: Role,
    ) -> Result<Option<LockFile>, BackendError> {
        let base = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let base = base
            | match how {
                Open::Read => OFlag::O_RDONLY,
                Open::Write | Open::Create => OFlag::O_RDWR,
            };
        // Open what is there; create it only if nothing is (O_EXCL), so that we know
        // whether the directory entry is new and must be fsynced.
        for _ in 0..8 {
            let (fd, created) = match openat(&self.dir, name, base, Mode::empty()) {
                Ok(fd) => (fd, false),
                Err(Errno::ENOENT) if how == Open::Create => {
                    let excl = base | OFlag::O_CREAT | OFlag::O_EXCL;
                    match openat(&self.dir, name, excl, Mode::from_bits_truncate(0o600)) {
                        Ok(fd) => (fd, true),
                        Err(Errno::EEXIST) => continue,
                        Err(e) => return Err(self.file_error(name, e, role)),
                    }
                }
                Err(Errno::ENOENT) => return Ok(None),
                Err(e) => return Err(self.file_error(name, e, role)),
            };
            let file = File::from(fd);
            let meta = file.metadata().map_err(|e| self.io(name, &e))?;
            if !meta.file_type().is_file() {
                return Err(self.refused_foreign(name, "it is not a regular file", role));
            }
            check_file_owner_and_mode(&meta, &self.show(name), role)
                .map_err(|why| self.refused_file(name, &why, role))?;
            let id = (meta.dev(), meta.ino());
            return Ok(Some(LockFile::new(file, id, created, self.show(name))));
        }
        Err(BackendError::Unavailable(format!(
            "the lock file {} kept appearing and disappearing; try again",
            self.show(name)
        )))
    }

    /// True if `name` in the directory is still the file `lock` opened (not replaced by
    /// `release --force`, removed, or swapped).
    pub fn is_current(&self, name: &str, lock: &LockFile) -> Result<bool, BackendError> {
        match fstatat(&self.dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok((st.st_dev, st.st_ino) == lock.id()),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(self.io(name, &e.into())),
        }
    }

    /// Makes the directory's entries durable (a new lock file, a rename).
    pub fn sync(&self) -> Result<(), BackendError> {
        self.dir
            .sync_all()
            .map_err(|e| unusable(&self.path, &format!("cannot fsync it: {e}")))
    }

    /// Replaces lock file `name` by one holding `record`, atomically: a new file (a
    /// hidden, unpredictable name that no lock file can have), fsynced, renamed over
    /// it, the directory fsynced.
    pub fn replace(&self, name: &str, record: &Record) -> Result<(), BackendError> {
        let tmp = format!(".lockrun-new-{}", crate::token::random_hex(8));
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(
            &self.dir,
            tmp.as_str(),
            flags,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| self.file_error(&tmp, e, Role::Lock))?;
        let mut file = File::from(fd);
        let written = file
            .write_all(&record.to_bytes(0))
            .and_then(|()| file.sync_all())
            .map_err(|e| self.io(&tmp, &e))
            .and_then(|()| {
                renameat(&self.dir, tmp.as_str(), &self.dir, name)
                    .map_err(|e| self.io(name, &e.into()))
            });
        if written.is_err() {
            let _ = unlinkat(&self.dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        }
        written.and_then(|()| self.sync())
    }

    /// `DIR/name`, for messages.
    pub fn show(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }

    /// An I/O error on lock file `name`: may pass (a full disk, an I/O error).
    pub fn io(&self, name: &str, e: &std::io::Error) -> BackendError {
        BackendError::Unavailable(format!("cannot use the lock file {}: {e}", self.show(name)))
    }

    /// A file of `role` lockrun will not use; `why` says what to do. A lock file holds
    /// the lock's fencing counter: the advice never is to delete it.
    fn refused_file(&self, name: &str, why: &str, role: Role) -> BackendError {
        BackendError::Refused(format!(
            "refusing the {} {}: {why}",
            role.label(),
            self.show(name)
        ))
    }

    /// A file that lockrun never makes (a symlink, a FIFO...), so it holds no
    /// counter of lockrun's and may go.
    fn refused_foreign(&self, name: &str, why: &str, role: Role) -> BackendError {
        self.refused_file(
            name,
            &format!(
                "{why}, which lockrun never makes; remove it (it holds no fencing counter: \
                 lockrun creates its own) or use another directory"
            ),
            role,
        )
    }

    fn file_error(&self, name: &str, e: Errno, role: Role) -> BackendError {
        match e {
            Errno::ELOOP => self.refused_foreign(name, "it is a symbolic link", role),
            Errno::EACCES | Errno::EPERM | Errno::EROFS => BackendError::Refused(format!(
                "cannot open the {} {}: {}",
                role.label(),
                self.show(name),
                e.desc()
            )),
            _ => self.io(name, &e.into()),
        }
    }
}

/// Refuses a directory or file not owned by the effective user, or that group or
/// others may write. `what` names it in the reason.
fn check_owner_and_mode(meta: &std::fs::Metadata, what: &str) -> Result<(), String> {
    let euid = geteuid().as_raw();
    if meta.uid() != euid {
        return Err(format!(
            "{what} belongs to uid {}, not to this user (uid {euid}): only a directory and \
             files of this user's may hold its locks (chown them)",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "group or others may write {what} (mode {mode:04o}): chmod go-w it"
        ));
    }
    Ok(())
}

/// What a file in the lock directory is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A lock file: the lock, its fencing counter and its holders.
    Lock,
    /// The record of a lock's last run (`super::last`).
    RunRecord,
}

impl Role {
    /// How messages name such a file.
    fn label(self) -> &'static str {
        match self {
            Role::Lock => "lock file",
            Role::RunRecord => "run record file",
        }
    }

    /// What another user could do with such a file of ours they may use.
    fn harm(self) -> &'static str {
        match self {
            Role::Lock => "one who can open it can keep the lock busy",
            Role::RunRecord => "one who can write it can make up the lock's last run",
        }
    }
}

/// Refuses a file of `role` (`shown`: its path) not owned by the effective user, or
/// with any permission for group or others: one who may read a lock file may also
/// open it and hold a read lock on its bytes, which keeps every run of ours busy.
fn check_file_owner_and_mode(
    meta: &std::fs::Metadata,
    shown: &str,
    role: Role,
) -> Result<(), String> {
    let euid = geteuid().as_raw();
    if meta.uid() != euid {
        return Err(format!(
            "it belongs to uid {}, not to this user (uid {euid}): only files of this \
             user's may hold its locks (chown {euid} {shown})",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "group or others may use it (mode {mode:04o}), and {}: chmod 600 {shown}",
            role.harm()
        ));
    }
    Ok(())
}

/// A lock directory lockrun will not use, whatever happens: 125.
pub(super) fn refused(path: &Path, why: &str) -> BackendError {
    BackendError::Refused(format!(
        "refusing the lock directory {}: {why}",
        path.display()
    ))
}

/// A lock directory that cannot be used right now.
pub(super) fn unusable(path: &Path, why: &str) -> BackendError {
    BackendError::Unavailable(format!(
        "cannot use the lock directory {}: {why}",
        path.display()
    ))
}
