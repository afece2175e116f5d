//! The job's own cgroup v2, where lockrun can make one: the stronger boundary. Part of
//! [`super`]; depends on `nix` only.
//!
//! A cgroup holds every process forked inside it, whatever it does to its session, its
//! group or its parent, and `cgroup.kill` (Linux 5.14) SIGKILLs all of them at once, a
//! process forking at that moment included. lockrun makes `lockrun-PID` below its own
//! cgroup (the `0::` line of `/proc/self/cgroup`, under the cgroup2 mount of
//! `/proc/self/mountinfo`) when it may: root with a writable hierarchy, or a subtree
//! delegated to it (systemd's `Delegate=yes`). Anything else (no cgroup2 mount, a
//! read-only one in a container, no write permission, no `cgroup.kill`) leaves the job
//! to the process tree, which is always used as well.
//!
//! lockrun's own cgroup has processes (lockrun), so it cannot have controllers enabled
//! for its children (cgroup v2's "no internal processes" rule): the new cgroup limits
//! nothing, it only holds the job. It is removed once the job is gone.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::libc;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// A cgroup made for one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    /// Its directory in the cgroup2 file system.
    dir: PathBuf,
    /// Its path as `/proc/PID/cgroup` shows it (`/x/lockrun-123`).
    path: String,
}

impl Cgroup {
    /// Makes `lockrun-ID` below this process's own cgroup, if that can be done and the
    /// kernel has `cgroup.kill`.
    pub fn create(id: u32) -> Option<Cgroup> {
        let (base, own) = base()?;
        let mut name = format!("lockrun-{id}");
        let mut dir = base.join(&name);
        if let Err(e) = fs::create_dir(&dir) {
            if e.kind() != io::ErrorKind::AlreadyExists {
                return None;
            }
            // Another lockrun's (one of the same pid in another PID namespace: every
            // container's lockrun is 1), or one left by a lockrun that could not clean
            // up: never taken over, a name of its own then.
            let mut salt = [0u8; 4];
            crate::token::fill(&mut salt).ok()?;
            name = format!("lockrun-{id}-{:08x}", u32::from_ne_bytes(salt));
            dir = base.join(&name);
            fs::create_dir(&dir).ok()?;
        }
        let cg = Cgroup {
            path: format!("{}/{name}", own.trim_end_matches('/')),
            dir,
        };
        if !cg.dir.join("cgroup.kill").exists() {
            cg.remove();
            return None;
        }
        Some(cg)
    }

    /// Removes the empty `lockrun-*` cgroups beside this one that lockruns which died
    /// with their guard left behind ([`sweep`]): done by the guard once the command
    /// runs, off the way of its start.
    pub fn sweep_beside(&self) {
        if let Some(base) = self.dir.parent() {
            sweep(base);
        }
    }

    /// The cgroups a guard that died before it told lockrun where it started the
    /// command made for the job: the `lockrun-*` cgroup below lockrun's own of each of
    /// `pids` (lockrun's descendants, read before they are killed). A cgroup of that
    /// name with none of them in it may be another lockrun's (one of the same pid in
    /// another PID namespace): it is left alone, for the sweep.
    pub fn of_job(pids: &[i32]) -> Vec<Cgroup> {
        let Some((base, own)) = base() else {
            return Vec::new();
        };
        let own = own.trim_end_matches('/');
        let mut found: Vec<Cgroup> = Vec::new();
        let mut add = |name: &str| {
            let cg = Cgroup {
                dir: base.join(name),
                path: format!("{own}/{name}"),
            };
            if !found.contains(&cg) && cg.dir.is_dir() {
                found.push(cg);
            }
        };
        for &pid in pids {
            let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
                continue;
            };
            let path = text.lines().find_map(|l| l.strip_prefix("0::"));
            let name = path.and_then(|p| p.strip_prefix(own)?.strip_prefix('/'));
            if let Some(name) = name.filter(|n| n.starts_with("lockrun-") && !n.contains('/')) {
                add(name);
            }
        }
        found
    }

    /// A cgroup known by its directory (what the guard tells lockrun).
    pub fn at(dir: PathBuf, path: String) -> Cgroup {
        Cgroup { dir, path }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its path within the hierarchy.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Its directory, open (for `clone3`'s `CLONE_INTO_CGROUP`).
    pub fn open_dir(&self) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_DIRECTORY)
            .open(&self.dir)
    }

    /// SIGKILLs every process in it, at once.
    pub fn kill(&self) -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(self.dir.join("cgroup.kill"))?;
        f.write_all(b"1")
    }

    /// Waits at most `limit` until no live process is left in it (`populated 0` in
    /// `cgroup.events`: a process leaves its cgroup as it dies, before it is a zombie,
    /// so a zombie not yet reaped is not counted). The kernel wakes the wait when that
    /// file changes: no look costs anything while the job's processes die. True if it
    /// is empty.
    pub fn wait_empty(&self, limit: Duration) -> bool {
        let Ok(events) = File::open(self.dir.join("cgroup.events")) else {
            return false;
        };
        let until = Instant::now() + limit;
        let mut buf = [0u8; 256];
        loop {
            // kernfs files are read again from the start after each change.
            let Ok(n) = events.read_at(&mut buf, 0) else {
                return false;
            };
            if buf[..n].split(|&b| b == b'\n').any(|l| l == b"populated 0") {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(events.as_fd(), PollFlags::POLLPRI)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return false,
            }
        }
    }

    /// The pids in it now.
    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Removes it (it must be empty); a failure leaves an empty directory behind.
    /// True once it is gone (removed now or before).
    pub fn remove(&self) -> bool {
        match fs::remove_dir(&self.dir) {
            Ok(()) => true,
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        }
    }
}

/// How old an empty `lockrun-*` cgroup must be before a lockrun removes it as left
/// behind.
const LEFT_BEHIND: Duration = Duration::from_secs(600);

/// Removes the empty `lockrun-*` cgroups in `base` left by lockruns that died with their
/// guard (a PID namespace killed whole, or both SIGKILLed at once). A cgroup still in
/// use is never empty for long (a run's is made as it starts to take its lock), and
/// removing one that a waiting lockrun made only sends that run to the process tree:
/// its `clone3` into the cgroup fails and the guard starts the command without it.
fn sweep(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("lockrun-") {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > LEFT_BEHIND);
        // The events are read only for an old one: the young are the live jobs of
        // lockruns beside this one, on every run's way.
        let empty = || {
            fs::read_to_string(e.path().join("cgroup.events"))
                .is_ok_and(|ev| ev.lines().any(|l| l == "populated 0"))
        };
        if old && empty() {
            let _ = fs::remove_dir(e.path());
        }
    }
}

/// The directory of this process's own cgroup in the cgroup2 file system, and its
/// path in the hierarchy.
fn base() -> Option<(PathBuf, String)> {
    let own = own_cgroup()?;
    let (mount, root) = cgroup2_mount()?;
    let rel = own.strip_prefix(root.trim_end_matches('/')).unwrap_or(&own);
    Some((mount.join(rel.trim_start_matches('/')), own))
}

/// This process's cgroup v2 path (`0::/path` in `/proc/self/cgroup`).
fn own_cgroup() -> Option<String> {
    let text = read_proc("/proc/self/cgroup")?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
}

/// Where the cgroup2 file system is mounted, and which cgroup is the mount's root.
fn cgroup2_mount() -> Option<(PathBuf, String)> {
    let text = read_proc("/proc/self/mountinfo")?;
    text.lines().find_map(parse_mountinfo_line)
}

/// A small file of `/proc`, read in as few calls as its size allows: these files say
/// they are empty, so `fs::read_to_string` starts with 32 bytes and doubles (ten reads
/// and a `statx` for a mountinfo of 2 KiB, on the guard's way to being ready).
fn read_proc(path: &str) -> Option<String> {
    let mut file = File::open(path).ok()?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).ok()
}

/// One `/proc/self/mountinfo` line: `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS... - TYPE ...`.
fn parse_mountinfo_line(line: &str) -> Option<(PathBuf, String)> {
    let (before, after) = line.split_once(" - ")?;
    if after.split_whitespace().next()? != "cgroup2" {
        return None;
    }
    let mut f = before.split_whitespace();
    let root = f.nth(3)?;
    let mount = f.next()?;
    Some((PathBuf::from(unescape(mount)), unescape(root)))
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_line_of_mountinfo_gives_mount_point_and_root() {
        let l = "35 25 0:30 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw";
        assert_eq!(
            parse_mountinfo_line(l),
            Some((PathBuf::from("/sys/fs/cgroup/unified"), "/".to_owned()))
        );
        let v1 = "36 25 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory";
        assert_eq!(parse_mountinfo_line(v1), None);
        let escaped = "1 2 0:3 /a\\040b /mnt/c\\040g rw - cgroup2 none rw";
        assert_eq!(
            parse_mountinfo_line(escaped),
            Some((PathBuf::from("/mnt/c g"), "/a b".to_owned()))
        );
    }
}
