//! Finding the lock directory: its path resolved from `/` one component at a time,
//! each opened relative to its parent's descriptor without following a symlink
//! (`O_PATH | O_NOFOLLOW`) and checked on that descriptor before the next is looked
//! up. Part of [`super`]; [`super::dir`] checks the directory found.
//!
//! lockrun often runs as root, and a path is only as safe as every step of it: a
//! directory above the lock directory that another user may change lets them swap
//! what lies below it (a lock directory with lower counters, or another one for each
//! run: two holders at once), and so does a symlink of theirs, which they may point
//! elsewhere between two runs. So every directory walked through (on the path given,
//! and on the targets of the symlinks followed) must belong to root or the effective
//! user and be writable by group or others only if sticky; a symlink is followed only
//! if it belongs to root or the effective user (its target walked the same way, at
//! most [`MAX_LINKS`] of them), and the lock directory itself must not be one.
//! Missing directories are made only once everything that exists is accepted, each
//! with `mkdirat` in its checked parent (mode 0700, fsynced into it). The descriptor
//! returned is the directory walked to: nothing is opened by its path again.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::geteuid;

use super::dir::{refused, unusable};
use crate::backend::BackendError;

/// How many symlinks one path may go through (Linux's own limit).
const MAX_LINKS: usize = 40;

/// How many components one walk may look at (symlinks' included, and those looked at
/// again after another lockrun made them): a bound on a path that keeps changing.
const MAX_STEPS: usize = 4096;

/// Opens the lock directory `path` (absolute, without `.` or `..`) read-only, as
/// described in the module documentation; a missing directory is made if `create`,
/// else `None`. The caller checks the directory's own owner and mode.
pub fn open_dir(path: &Path, create: bool) -> Result<Option<File>, BackendError> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let root = openat(AT_FDCWD, "/", flags, Mode::empty()).map_err(|e| unusable(path, e.desc()))?;
    let mut walk = Walk {
        given: path,
        stack: Vec::new(),
        pending: names(path),
        links: 0,
    };
    walk.enter(root, PathBuf::from("/"))?;
    walk.run(create)
}

/// A walk under way.
struct Walk<'a> {
    /// The lock directory's path as given, for messages.
    given: &'a Path,
    /// The directories walked into, `/` first, each with its path as resolved.
    stack: Vec<(OwnedFd, PathBuf)>,
    /// The components still to walk.
    pending: VecDeque<OsString>,
    /// Symlinks followed so far.
    links: usize,
}

impl Walk<'_> {
    fn run(&mut self, create: bool) -> Result<Option<File>, BackendError> {
        for _ in 0..MAX_STEPS {
            let Some(name) = self.pending.pop_front() else {
                break;
            };
            if name == ".." {
                // The physical parent: the stack holds the directories as walked.
                if self.stack.len() > 1 {
                    self.stack.pop();
                }
                continue;
            }
            // The lock directory itself is the last component of the path given: a
            // symlink's target always has a component of that path after it.
            let last = self.pending.is_empty();
            let (top, above) = self.stack.last().expect("the stack starts with /");
            let here = above.join(&name);
            let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let fd = match openat(top, name.as_os_str(), flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) if !create => return Ok(None),
                Err(Errno::ENOENT) => {
                    self.make(&name, &here)?;
                    // Walked again: made by us or, meanwhile, by another lockrun,
                    // it is checked like any other.
                    self.pending.push_front(name);
                    continue;
                }
                Err(e) => return Err(self.open_error(&here, e)),
            };
            let st = fstat(&fd).map_err(|e| unusable(self.given, e.desc()))?;
            match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
                SFlag::S_IFDIR if last => return self.open_last(&fd).map(Some),
                SFlag::S_IFDIR => self.check_above(&st, &here)?,
                SFlag::S_IFLNK if last => {
                    return Err(refused(
                        self.given,
                        "it is a symbolic link; give the real directory's path",
                    ))
                }
                SFlag::S_IFLNK => {
                    self.follow(&fd, &st, &here)?;
                    continue;
                }
                _ => {
                    return Err(refused(
                        self.given,
                        &format!("{} on its path is not a directory", here.display()),
                    ))
                }
            }
            self.stack.push((fd, here));
        }
        Err(unusable(
            self.given,
            "its path kept changing while it was looked up; try again",
        ))
    }

    /// Checks and enters `/`.
    fn enter(&mut self, fd: OwnedFd, path: PathBuf) -> Result<(), BackendError> {
        let st = fstat(&fd).map_err(|e| unusable(self.given, e.desc()))?;
        self.check_above(&st, &path)?;
        self.stack.push((fd, path));
        Ok(())
    }

    /// The lock directory, reopened for reading through its own descriptor.
    fn open_last(&self, fd: &OwnedFd) -> Result<File, BackendError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        openat(fd, ".", flags, Mode::empty())
            .map(File::from)
            .map_err(|e| self.open_error(self.given, e))
    }

    /// Follows the symlink `fd` (at `here`, with status `st`) if its owner may be
    /// trusted: its target's components are walked next.
    fn follow(&mut self, fd: &OwnedFd, st: &FileStat, here: &Path) -> Result<(), BackendError> {
        let euid = geteuid().as_raw();
        if st.st_uid != 0 && st.st_uid != euid {
            return Err(refused(
                self.given,
                &format!(
                    "{} on its path is a symbolic link of uid {}'s, who could point it \
                     elsewhere; only root's or this user's are followed: give a path \
                     without it",
                    here.display(),
                    st.st_uid
                ),
            ));
        }
        self.links += 1;
        if self.links > MAX_LINKS {
            return Err(refused(
                self.given,
                "its path goes through too many symbolic links",
            ));
        }
        // The link itself, not a name that may since point elsewhere.
        let target = PathBuf::from(readlinkat(fd, "").map_err(|e| self.open_error(here, e))?);
        if target.is_absolute() {
            self.stack.truncate(1);
        }
        for name in names(&target).into_iter().rev() {
            self.pending.push_front(name);
        }
        Ok(())
    }

    /// Makes the missing directory `name` (at `here`) in the directory on top of the
    /// stack, mode 0700, and fsyncs it into its parent so that the directory (and the
    /// counters it will hold) survives a crash. Another lockrun's making it first is
    /// fine.
    fn make(&self, name: &OsString, here: &Path) -> Result<(), BackendError> {
        let (top, _) = self.stack.last().expect("the stack starts with /");
        let cannot = |e: Errno| {
            let why = format!("cannot create {}: {}", here.display(), e.desc());
            match e {
                Errno::EACCES | Errno::EPERM | Errno::EROFS => refused(self.given, &why),
                _ => unusable(self.given, &why),
            }
        };
        match mkdirat(top, name.as_os_str(), Mode::from_bits_truncate(0o700)) {
            Ok(()) => {}
            Err(Errno::EEXIST) => return Ok(()),
            Err(e) => return Err(cannot(e)),
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let parent = openat(top, ".", flags, Mode::empty()).map_err(cannot)?;
        File::from(parent)
            .sync_all()
            .map_err(|e| unusable(self.given, &format!("cannot fsync {}: {e}", here.display())))
    }

    /// Refuses a directory above the lock directory (`here`, status `st`) that would
    /// let another user move it or swap it for another: it must belong to root or the
    /// effective user, and be writable by group or others only if it is sticky (as
    /// `/tmp` is: there only an entry's owner may rename it).
    fn check_above(&self, st: &FileStat, here: &Path) -> Result<(), BackendError> {
        let euid = geteuid().as_raw();
        let mode = st.st_mode & 0o7777;
        let owner_ok = st.st_uid == 0 || st.st_uid == euid;
        let sticky = mode & 0o1000 != 0;
        if owner_ok && (mode & 0o022 == 0 || sticky) {
            return Ok(());
        }
        Err(refused(
            self.given,
            &format!(
                "{} above it (uid {}, mode {mode:04o}) would let another user move it; use \
                 a directory whose parents belong to root or this user and only their \
                 owner may write (or are sticky)",
                here.display(),
                st.st_uid
            ),
        ))
    }

    fn open_error(&self, here: &Path, e: Errno) -> BackendError {
        let why = format!("cannot open {}: {}", here.display(), e.desc());
        match e {
            Errno::EACCES | Errno::EPERM | Errno::ENOTDIR | Errno::ELOOP => {
                refused(self.given, &why)
            }
            _ => unusable(self.given, &why),
        }
    }
}

/// The components of `path` to walk: names and `..` (`/` and `.` are dropped).
fn names(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}
