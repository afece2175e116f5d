//! What lockrun and its guard say to each other, over a `SOCK_SEQPACKET` socket pair
//! (one message a packet, so no framing; the end of file when one side dies). Part of
//! [`super`]; depends on `nix` only.
//!
//! lockrun → guard: `Command` (which of the arguments the guard was forked with are
//! the command), `Spawn` (the command's environment changes, with the descriptors that
//! hold a file lock as `SCM_RIGHTS`), `Deadline` (the lease's), `Done`. Guard →
//! lockrun: `Spawned` (pid, and the cgroup if the command joined one),
//! `NotFound`/`CannotExecute` (errno), `Exited` (the command's status, and whether the
//! job was empty then), `Empty`.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::{ChildExit, EnvChange};

/// The largest message: the command's environment changes (a stripped `LOCKRUN_URL`
/// and a few short variables) fit many times over.
const MAX_MESSAGE: usize = 256 * 1024;

/// The most descriptors one message carries.
const MAX_FDS: usize = 16;

/// From lockrun to the guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToGuard {
    /// The command is the last this many arguments of the command line the guard was
    /// forked with.
    Command(u32),
    /// Start the command with these changes to the environment.
    Spawn(Vec<EnvChange>),
    /// The job is gone and the lock is being released: exit.
    Done,
    /// SIGKILL the job at this time since boot (`CLOCK_BOOTTIME`), the lease's
    /// deadline, unless a later one comes first.
    Deadline(Duration),
}

/// From the guard to lockrun.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FromGuard {
    /// The command started with this pid; in this cgroup (directory, path) if any.
    Spawned {
        /// The command's pid.
        pid: i32,
        /// The cgroup it joined: its directory and its path in the hierarchy.
        cgroup: Option<(String, String)>,
    },
    /// The command was not found (errno).
    NotFound(i32),
    /// The command could not be executed (errno).
    CannotExecute(i32),
    /// The command ended; `empty` when nothing of the job was left then.
    Exited {
        /// How it ended.
        exit: ChildExit,
        /// No process of the job is left.
        empty: bool,
    },
    /// The last process of the job is gone.
    Empty,
}

impl ToGuard {
    fn encode(&self) -> Vec<u8> {
        match self {
            ToGuard::Done => vec![b'D'],
            ToGuard::Command(n) => {
                let mut out = vec![b'C'];
                out.extend_from_slice(&n.to_le_bytes());
                out
            }
            ToGuard::Deadline(d) => {
                let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                let mut out = vec![b'T'];
                out.extend_from_slice(&ns.to_le_bytes());
                out
            }
            ToGuard::Spawn(env) => {
                let mut out = vec![b'S'];
                for change in env {
                    match change {
                        EnvChange::Set(k, v) => {
                            out.push(b'+');
                            push_str(&mut out, k);
                            push_str(&mut out, v);
                        }
                        EnvChange::Remove(k) => {
                            out.push(b'-');
                            push_str(&mut out, k);
                        }
                    }
                }
                out
            }
        }
    }

    fn decode(bytes: &[u8]) -> Option<ToGuard> {
        let (&kind, mut rest) = bytes.split_first()?;
        match kind {
            b'D' if rest.is_empty() => Some(ToGuard::Done),
            b'C' if rest.len() == 4 => {
                Some(ToGuard::Command(u32::from_le_bytes(rest.try_into().ok()?)))
            }
            b'T' if rest.len() == 8 => Some(ToGuard::Deadline(Duration::from_nanos(
                u64::from_le_bytes(rest.try_into().ok()?),
            ))),
            b'S' => {
                let mut env = Vec::new();
                while let Some((&op, tail)) = rest.split_first() {
                    rest = tail;
                    let key = take_str(&mut rest)?;
                    env.push(match op {
                        b'+' => EnvChange::Set(key, take_str(&mut rest)?),
                        b'-' => EnvChange::Remove(key),
                        _ => return None,
                    });
                }
                Some(ToGuard::Spawn(env))
            }
            _ => None,
        }
    }
}

impl FromGuard {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            FromGuard::Spawned { pid, cgroup } => {
                out.push(b'P');
                out.extend_from_slice(&pid.to_le_bytes());
                if let Some((dir, path)) = cgroup {
                    out.push(b'c');
                    push_str(&mut out, dir);
                    push_str(&mut out, path);
                }
            }
            FromGuard::NotFound(e) => {
                out.push(b'N');
                out.extend_from_slice(&e.to_le_bytes());
            }
            FromGuard::CannotExecute(e) => {
                out.push(b'C');
                out.extend_from_slice(&e.to_le_bytes());
            }
            FromGuard::Exited { exit, empty } => {
                out.push(b'X');
                match exit {
                    ChildExit::Code(c) => out.extend_from_slice(&[b'c', *c, 0, 0, 0]),
                    ChildExit::Signal(s) => {
                        out.push(b's');
                        out.extend_from_slice(&s.to_le_bytes());
                    }
                }
                out.push(u8::from(*empty));
            }
            FromGuard::Empty => out.push(b'E'),
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<FromGuard> {
        let (&kind, rest) = bytes.split_first()?;
        let int = |b: &[u8]| Some(i32::from_le_bytes(b.get(..4)?.try_into().ok()?));
        match kind {
            b'P' => {
                let pid = int(rest)?;
                let mut tail = rest.get(4..)?;
                let cgroup = match tail.split_first() {
                    None => None,
                    Some((b'c', more)) => {
                        tail = more;
                        Some((take_str(&mut tail)?, take_str(&mut tail)?))
                    }
                    Some(_) => return None,
                };
                Some(FromGuard::Spawned { pid, cgroup })
            }
            b'N' => Some(FromGuard::NotFound(int(rest)?)),
            b'C' => Some(FromGuard::CannotExecute(int(rest)?)),
            b'X' if rest.len() == 6 => {
                let exit = match rest[0] {
                    b'c' => ChildExit::Code(rest[1]),
                    b's' => ChildExit::Signal(int(&rest[1..])?),
                    _ => return None,
                };
                Some(FromGuard::Exited {
                    exit,
                    empty: rest[5] == 1,
                })
            }
            b'E' if rest.is_empty() => Some(FromGuard::Empty),
            _ => None,
        }
    }
}

fn push_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

fn take_str(rest: &mut &[u8]) -> Option<String> {
    let end = rest.iter().position(|&b| b == 0)?;
    let s = String::from_utf8(rest[..end].to_vec()).ok()?;
    *rest = &rest[end + 1..];
    Some(s)
}

/// Anything that goes over the socket.
pub trait Message {
    /// Its bytes.
    fn bytes(&self) -> Vec<u8>;
}

impl Message for ToGuard {
    fn bytes(&self) -> Vec<u8> {
        self.encode()
    }
}

impl Message for FromGuard {
    fn bytes(&self) -> Vec<u8> {
        self.encode()
    }
}

/// Sends one message with `fds` attached, waiting for room in the socket. Never
/// raises SIGPIPE (the other side may be dead: that is an error, not a signal).
pub fn send(sock: BorrowedFd<'_>, msg: &impl Message, fds: &[RawFd]) -> io::Result<()> {
    send_with(sock, msg, fds, MsgFlags::MSG_NOSIGNAL)
}

/// Sends one message without waiting: a full socket (a stopped guard) drops it.
pub fn send_now(sock: BorrowedFd<'_>, msg: &impl Message) -> io::Result<()> {
    send_with(
        sock,
        msg,
        &[],
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
    )
}

fn send_with(
    sock: BorrowedFd<'_>,
    msg: &impl Message,
    fds: &[RawFd],
    flags: MsgFlags,
) -> io::Result<()> {
    let bytes = msg.bytes();
    let iov = [IoSlice::new(&bytes)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, flags, None) {
            Err(Errno::EINTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one packet: `Ok(None)` at the end of file; the descriptors it carried.
/// The packet's length is learnt first (a peek), so that its buffer is just as large:
/// most messages are a few bytes, and a buffer of [`MAX_MESSAGE`] for each would cost
/// an `mmap` and page faults every time.
fn recv(sock: BorrowedFd<'_>, flags: MsgFlags) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let Some(len) = next_len(sock, flags)? else {
        return Ok(None);
    };
    let mut buf = vec![0u8; len.clamp(1, MAX_MESSAGE)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        // The packet is there: the peek saw it, and only this process reads here.
        let flags = flags | MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT;
        let msg = match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), flags) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(m) => m,
        };
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(list) = c {
                // SAFETY: SCM_RIGHTS gave this process new descriptors, owned by nobody
                // else.
                #[allow(unsafe_code)]
                fds.extend(
                    list.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if msg.flags.contains(MsgFlags::MSG_TRUNC) || msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(io::Error::other("a message was cut short"));
        }
        let n = msg.bytes;
        if n == 0 {
            return Ok(None);
        }
        buf.truncate(n);
        return Ok(Some((buf, fds)));
    }
}

/// The length of the next packet, waiting for one unless `flags` say not to:
/// `Ok(None)` at the end of file (no message is empty). A peek: the packet stays, with
/// the descriptors it carries, for [`recv`].
fn next_len(sock: BorrowedFd<'_>, flags: MsgFlags) -> io::Result<Option<usize>> {
    let mut probe = [0u8; 1];
    loop {
        let mut iov = [IoSliceMut::new(&mut probe)];
        let peek = flags | MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC;
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, None, peek) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(m) if m.bytes == 0 => return Ok(None),
            Ok(m) => return Ok(Some(m.bytes)),
        }
    }
}

fn malformed() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "a malformed message")
}

/// The guard's read: the next message from lockrun (waiting for it if `wait`),
/// `Ok(None)` when lockrun is gone.
pub fn recv_to_guard(
    sock: BorrowedFd<'_>,
    wait: bool,
) -> io::Result<Option<(ToGuard, Vec<OwnedFd>)>> {
    let flags = if wait {
        MsgFlags::empty()
    } else {
        MsgFlags::MSG_DONTWAIT
    };
    match recv(sock, flags)? {
        None => Ok(None),
        Some((bytes, fds)) => Ok(Some((ToGuard::decode(&bytes).ok_or_else(malformed)?, fds))),
    }
}

/// lockrun's read once the socket is readable: `Ok(None)` when the guard is gone.
pub fn recv_from_guard(sock: BorrowedFd<'_>) -> io::Result<Option<FromGuard>> {
    match recv(sock, MsgFlags::MSG_DONTWAIT)? {
        None => Ok(None),
        Some((bytes, _)) => FromGuard::decode(&bytes).ok_or_else(malformed).map(Some),
    }
}

/// lockrun's read without waiting: `Ok(None)` when nothing is there yet, an
/// `UnexpectedEof` error when the guard is gone.
pub fn try_recv_from_guard(sock: BorrowedFd<'_>) -> io::Result<Option<FromGuard>> {
    match recv_from_guard(sock) {
        Ok(None) => Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(Some(m)) => Ok(Some(m)),
        Err(e) if e.raw_os_error() == Some(Errno::EAGAIN as i32) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_to_the_guard_survive_the_trip() {
        for m in [
            ToGuard::Done,
            ToGuard::Command(3),
            ToGuard::Deadline(Duration::from_nanos(1_234_567_890_123)),
            ToGuard::Spawn(vec![]),
            ToGuard::Spawn(vec![
                EnvChange::Set("LOCKRUN_FENCING_TOKEN".into(), "42".into()),
                EnvChange::Remove("LOCKRUN_PASSWORD".into()),
                EnvChange::Set("LOCKRUN_URL".into(), "redis://u@h:1, x=y".into()),
            ]),
        ] {
            assert_eq!(ToGuard::decode(&m.encode()), Some(m));
        }
        assert_eq!(ToGuard::decode(b"S+KEY"), None);
        assert_eq!(ToGuard::decode(b"Dx"), None);
        assert_eq!(ToGuard::decode(b"C\x01"), None);
    }

    #[test]
    fn messages_from_the_guard_survive_the_trip() {
        for m in [
            FromGuard::Spawned {
                pid: 77,
                cgroup: None,
            },
            FromGuard::Spawned {
                pid: 78,
                cgroup: Some(("/sys/fs/cgroup/lockrun-1".into(), "/lockrun-1".into())),
            },
            FromGuard::NotFound(2),
            FromGuard::CannotExecute(13),
            FromGuard::Exited {
                exit: ChildExit::Code(3),
                empty: true,
            },
            FromGuard::Exited {
                exit: ChildExit::Signal(9),
                empty: false,
            },
            FromGuard::Empty,
        ] {
            assert_eq!(FromGuard::decode(&m.encode()), Some(m));
        }
        assert_eq!(FromGuard::decode(b"X"), None);
        assert_eq!(FromGuard::decode(b"Q"), None);
    }

    #[test]
    fn descriptors_travel_with_a_message_and_the_end_of_file_is_seen() {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        use std::os::fd::AsFd;
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let file = tempfile::tempfile().unwrap();
        send(a.as_fd(), &ToGuard::Done, &[file.as_raw_fd()]).unwrap();
        let (msg, fds) = recv_to_guard(b.as_fd(), true).unwrap().unwrap();
        assert_eq!(msg, ToGuard::Done);
        assert_eq!(fds.len(), 1);
        drop(a);
        assert!(recv_to_guard(b.as_fd(), true).unwrap().is_none());
    }

    #[test]
    fn a_long_message_arrives_whole_and_a_short_one_after_it() {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        use std::os::fd::AsFd;
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let long = ToGuard::Spawn(vec![EnvChange::Set(
            "LOCKRUN_URL".into(),
            "u".repeat(100_000),
        )]);
        send(a.as_fd(), &long, &[]).unwrap();
        send(a.as_fd(), &ToGuard::Done, &[]).unwrap();
        assert_eq!(recv_to_guard(b.as_fd(), true).unwrap().unwrap().0, long);
        assert_eq!(
            recv_to_guard(b.as_fd(), false).unwrap().unwrap().0,
            ToGuard::Done
        );
        let nothing = recv_to_guard(b.as_fd(), false).unwrap_err();
        assert_eq!(nothing.raw_os_error(), Some(Errno::EAGAIN as i32));
    }
}
