//! What a lock file holds: a small text record with the fencing counter and the lock's
//! holders (a lockrun holding a slot, or keeping it for `--hold-at-least`). Written
//! whole at offset 0; parsed strictly, so that a file that is not lockrun's is
//! refused, never taken over (its counter never reset). Part of [`super`]; depends on
//! [`crate::backend::Holder`] only.
//!
//! A plain lock (`--slots 1`), and every lock without a holder, is written in format 1,
//! as lockrun always wrote it:
//!
//! ```text
//! lockrun lock file 1
//! fencing_token 42
//! reserved_through 1065    (every token up to here may have been handed out)
//! boot_id 5c1f...          (the boot during which fencing_token was written, or -)
//! token 5f0c...            (the holder's random token: proves ownership)
//! host web-1
//! pid 1234
//! since_ms 1714557600000   (acquisition, wall clock)
//! ttl_ms 30000             (the holder's --ttl: what status reports as left)
//! hold_until_ms 0          (0, or the end of --hold-at-least, wall clock)
//! hold_clock 5c1f...:93021 (only with a hold: its end on CLOCK_BOOTTIME of that boot)
//! ```
//!
//! The six holder lines (seven with a hold's `hold_clock`, see [`super::hold`]: an
//! older lockrun refuses such a record, never misreads it) are all there or none (a released or broken lock keeps only
//! its counter); the holder has slot 0 of 1, and its fencing token is the counter. An
//! empty file is a lock file whose creator died before writing it: counter 0, no
//! holder.
//!
//! A semaphore with holders (`--slots N`, N > 1) is written in format 2: the same
//! counter lines, the N its holders were taken with, one line per holder (by slot,
//! with its own fencing token), and a checksum (FNV-1a, 64 bits) of everything above
//! it:
//!
//! ```text
//! lockrun lock file 2
//! fencing_token 44
//! reserved_through 1065
//! boot_id 5c1f...
//! slots 3
//! holder slot=0 fencing_token=42 token=5f0c... host=web-1 pid=1234 since_ms=... ttl_ms=30000 hold_until_ms=0
//! holder slot=2 fencing_token=44 token=9a1b... host=web-1 pid=1240 since_ms=... ttl_ms=30000 hold_until_ms=0
//! holder slot=3 ... hold_until_ms=1714557630001 hold_clock=5c1f...:93021
//! end 8c2e61d0a7f3b415
//! ```
//!
//! An older lockrun refuses a format 2 file (its first line is not the one it knows),
//! so it never takes a slot of a semaphore as a plain lock; once the last holder has
//! released, the record is format 1 again.
//!
//! `reserved_through` is durable (fsynced) before any token up to it is handed out;
//! `fencing_token` is written without an fsync while the boot it names lasts (the page
//! cache keeps it for every process of that boot). See [`Record::next_token`].
//!
//! A record is padded to a multiple of 512 bytes (by a last line of spaces) and never
//! written shorter than the file already is: a write replaces the whole record in place
//! and the file is never truncated, so a crash cannot leave a new record's head on an
//! old record's tail of another length. A record of one sector (any plain lock, a
//! semaphore with a few holders) is in practice written whole. A longer one may be
//! torn by a crash of the machine (only the first sectors written) or by a SIGKILL in
//! the middle of its write (past its first 4096 bytes): the counter lines are in its
//! first sector, so a format 2 record whose checksum does not match keeps its counter
//! and is read without holders (after a crash of the machine none is alive: the
//! kernel's locks are gone too).

mod list;
#[cfg(test)]
mod tests;

use std::time::Duration;

use super::hold::{self, HoldClock, Now};
use crate::backend::Holder;
use list::checksum;

/// The first line of format 1 (a plain lock, or no holder).
const MAGIC: &str = "lockrun lock file 1";

/// The first line of format 2 (a semaphore).
pub const MAGIC_SLOTS: &str = "lockrun lock file 2";

/// The largest record read; a larger file is not lockrun's. A record of
/// [`crate::backend::MAX_SLOTS`] holders with the longest tokens and host names takes about 560 KB.
pub const MAX_LEN: usize = 1 << 20;

/// Records are padded to a multiple of this.
const BLOCK: usize = 512;

/// How many fencing tokens one fsync reserves.
pub const RESERVE: u64 = 1024;

/// A lock file's contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The last fencing token handed out for this lock, whatever the slot (0: none
    /// yet), as far as the boot named by `boot` knows.
    pub fencing: u64,
    /// No token above this was handed out; on disk (fsynced) before any token up to it.
    pub reserved: u64,
    /// The boot (Linux's boot id) during which `fencing` was written; empty: unknown.
    pub boot: String,
    /// The `--slots` the holders were taken with (1: a plain lock, and format 1).
    pub slots: u32,
    /// Who holds a slot, or keeps it for `--hold-at-least`, or did (a holder that
    /// crashed stays until its slot is taken again): by slot, at most one per slot.
    pub holders: Vec<HolderLine>,
}

impl Default for Record {
    /// A new lock file: no token yet, no holder, a plain lock.
    fn default() -> Record {
        Record {
            fencing: 0,
            reserved: 0,
            boot: String::new(),
            slots: 1,
            holders: Vec::new(),
        }
    }
}

/// One holder of a [`Record`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderLine {
    /// The slot it holds, 0 to N-1.
    pub slot: u32,
    /// The fencing token it was given.
    pub fencing: u64,
    /// The holder's random token.
    pub token: String,
    /// Its host name (non-graphic bytes written as `?`).
    pub host: String,
    /// Its lockrun's pid.
    pub pid: u32,
    /// When it acquired the lock, ms since the Unix epoch.
    pub since_ms: u64,
    /// Its `--ttl`, in ms.
    pub ttl_ms: u64,
    /// 0, or until when the slot is kept after the holder let go (`--hold-at-least`),
    /// ms since the Unix epoch.
    pub hold_until_ms: u64,
    /// The hold's end on a clock that does not step, if written by a lockrun that
    /// keeps it so (see [`super::hold`]).
    pub hold_clock: Option<HoldClock>,
}

impl HolderLine {
    /// How long `--hold-at-least` still keeps its slot (zero: not kept).
    pub fn hold_left(&self, now: Now) -> Duration {
        if self.hold_until_ms == 0 {
            return Duration::ZERO;
        }
        hold::hold_left(self.hold_until_ms, self.hold_clock.as_ref(), now)
    }

    /// The holder as `status` and a busy answer show it, of a lock of `slots` slots:
    /// `locked` says the kernel lock of its slot is held (the lease runs while its
    /// lockrun lives: its TTL is shown as left, since it renews continuously); else
    /// only a hold still to run counts, with the hold left. `None`: not a holder now.
    pub fn shown(&self, slots: u32, locked: bool, now: Now) -> Option<Holder> {
        let hold_left = self.hold_left(now);
        if !locked && hold_left.is_zero() {
            return None;
        }
        Some(Holder {
            host: self.host.clone(),
            pid: self.pid,
            since_ms: self.since_ms,
            fencing_token: self.fencing,
            ttl_left: if hold_left.is_zero() {
                Duration::from_millis(self.ttl_ms)
            } else {
                hold_left
            },
            slot: self.slot,
            slots,
        })
    }
}

impl Record {
    /// The holder line of `slot`, if any.
    pub fn entry(&self, slot: u32) -> Option<&HolderLine> {
        self.holders.iter().find(|h| h.slot == slot)
    }

    /// The holder of `slot` as shown (see [`HolderLine::shown`]); a slot locked by a
    /// lockrun that has not written its record yet shows an unknown holder of a lock
    /// of `slots` slots. `None`: free.
    pub fn holder_of(&self, slot: u32, locked: bool, now: Now, slots: u32) -> Option<Holder> {
        match self.entry(slot) {
            Some(h) => h.shown(self.slots, locked, now),
            None if locked => Some(Holder {
                slot,
                slots,
                ..Holder::default()
            }),
            None => None,
        }
    }

    /// The holder of a plain lock (slot 0), as [`Record::holder_of`] shows it.
    pub fn holder(&self, locked: bool, now: Now) -> Option<Holder> {
        self.holder_of(0, locked, now, 1)
    }

    /// True if the record can be written in format 1: no holder, or the one holder of
    /// a plain lock, holding the last token.
    fn plain(&self) -> bool {
        match self.holders.as_slice() {
            [] => true,
            [h] => self.slots == 1 && h.slot == 0 && h.fencing == self.fencing,
            _ => false,
        }
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        let boot = if self.boot.is_empty() {
            "-"
        } else {
            &self.boot
        };
        let counter = format!(
            "fencing_token {}\nreserved_through {}\nboot_id {boot}\n",
            self.fencing, self.reserved
        );
        if self.plain() {
            let mut s = format!("{MAGIC}\n{counter}");
            if let Some(h) = self.holders.first() {
                s.push_str(&format!(
                    "token {}\nhost {}\npid {}\nsince_ms {}\nttl_ms {}\nhold_until_ms {}\n",
                    h.token, h.host, h.pid, h.since_ms, h.ttl_ms, h.hold_until_ms
                ));
                if let Some(c) = &h.hold_clock {
                    s.push_str(&format!("hold_clock {}\n", c.to_text()));
                }
            }
            return s;
        }
        let mut s = format!("{MAGIC_SLOTS}\n{counter}slots {}\n", self.slots);
        for h in &self.holders {
            s.push_str(&format!(
                "holder slot={} fencing_token={} token={} host={} pid={} since_ms={} \
                 ttl_ms={} hold_until_ms={}",
                h.slot, h.fencing, h.token, h.host, h.pid, h.since_ms, h.ttl_ms, h.hold_until_ms
            ));
            if let Some(c) = &h.hold_clock {
                s.push_str(&format!(" hold_clock={}", c.to_text()));
            }
            s.push('\n');
        }
        s.push_str(&format!("end {:016x}\n", checksum(s.as_bytes())));
        s
    }

    /// The bytes to write over a file of `len` bytes: the text, padded by a line of
    /// spaces to a multiple of 512 bytes and to at least `len`.
    pub fn to_bytes(&self, len: usize) -> Vec<u8> {
        let mut bytes = self.to_text().into_bytes();
        let padded = bytes.len().max(len).next_multiple_of(BLOCK);
        if padded > bytes.len() {
            bytes.resize(padded - 1, b' ');
            bytes.push(b'\n');
        }
        bytes
    }

    /// Parses a file's bytes, or says why they are not a lockrun lock file.
    pub fn parse(bytes: &[u8]) -> Result<Record, String> {
        if bytes.is_empty() {
            return Ok(Record::default());
        }
        if bytes.len() > MAX_LEN {
            return Err(format!("it is larger than {MAX_LEN} bytes"));
        }
        if bytes.starts_with(format!("{MAGIC_SLOTS}\n").as_bytes()) {
            return list::parse(bytes);
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "it is not text".to_owned())?;
        let body = text
            .strip_suffix('\n')
            .ok_or_else(|| "its last line is cut short".to_owned())?;
        let mut lines: Vec<&str> = body.split('\n').collect();
        // The padding: a last line of spaces only.
        if lines.len() > 2 && lines.last().is_some_and(|l| l.bytes().all(|b| b == b' ')) {
            lines.pop();
        }
        let mut lines = lines.into_iter();
        if lines.next() != Some(MAGIC) {
            return Err(format!("its first line is not {MAGIC:?}"));
        }
        let (fencing, reserved, boot) = counter_lines(&mut lines)?;
        let rest: Vec<&str> = lines.collect();
        let (rest, clock) = match rest.as_slice() {
            [head @ .., last] if head.len() == 6 => (
                head,
                Some(HoldClock::parse(field(Some(last), "hold_clock")?)?),
            ),
            all => (all, None),
        };
        let holder = match rest {
            [] => None,
            [token, host, pid, since, ttl, hold] => Some(HolderLine {
                slot: 0,
                fencing,
                token: token_value(field(Some(token), "token")?)?,
                host: host_value(field(Some(host), "host")?)?,
                pid: pid_value(field(Some(pid), "pid")?)?,
                since_ms: number(field(Some(since), "since_ms")?)?,
                ttl_ms: number(field(Some(ttl), "ttl_ms")?)?,
                hold_until_ms: number(field(Some(hold), "hold_until_ms")?)?,
                hold_clock: clock,
            }),
            _ => return Err("its holder lines are incomplete".to_owned()),
        };
        if holder.is_some() && fencing == 0 {
            return Err("it names a holder without a fencing token".to_owned());
        }
        Ok(Record {
            fencing,
            reserved,
            boot,
            slots: 1,
            holders: holder.into_iter().collect(),
        })
    }

    /// The next fencing token, written during boot `boot` (`None`: unknown), and
    /// whether the new record must be made durable (fsynced) before the token is
    /// handed out.
    ///
    /// Within one boot, every process sees the last token written, fsynced or not (the
    /// page cache), so the next is one more; only when it passes `reserved` is a new
    /// block of [`RESERVE`] tokens reserved, durably. A record written during another
    /// boot (the machine crashed or restarted since, or the directory came from
    /// elsewhere) may have lost its last unsynced tokens, never its reservation: the
    /// next token is above the reservation. An unknown boot fsyncs every time.
    pub fn next_token(&self, boot: Option<&str>) -> Option<(u64, u64, bool)> {
        let same_boot = boot.is_some_and(|b| !b.is_empty() && b == self.boot);
        let last = if same_boot {
            self.fencing
        } else {
            self.fencing.max(self.reserved)
        };
        let token = last.checked_add(1)?;
        if same_boot && token <= self.reserved {
            return Some((token, self.reserved, false));
        }
        let reserved = token.saturating_add(if boot.is_some() { RESERVE - 1 } else { 0 });
        Some((token, reserved, true))
    }
}

/// The three counter lines after the first: fencing token, reservation, boot.
pub fn counter_lines<'a>(
    lines: &mut impl Iterator<Item = &'a str>,
) -> Result<(u64, u64, String), String> {
    let fencing = number(field(lines.next(), "fencing_token")?)?;
    let reserved = number(field(lines.next(), "reserved_through")?)?;
    let boot = boot_value(field(lines.next(), "boot_id")?)?;
    Ok((fencing, reserved, boot))
}

/// A host name as stored: graphic ASCII only (others become `?`), 1 to 255 bytes.
pub fn stored_host(host: &str) -> String {
    let s: String = host
        .chars()
        .take(255)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    if s.is_empty() {
        "unknown".to_owned()
    } else {
        s
    }
}

/// True for a token this format can store (lockrun's tokens are 32 hex digits).
pub fn storable_token(token: &str) -> bool {
    (1..=128).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The value of a `key value` line.
pub fn field<'a>(line: Option<&'a str>, key: &str) -> Result<&'a str, String> {
    line.and_then(|l| l.strip_prefix(key))
        .and_then(|l| l.strip_prefix(' '))
        .ok_or_else(|| format!("it has no {key} line where one belongs"))
}

/// A decimal number without sign or leading zeros.
pub fn number(s: &str) -> Result<u64, String> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical
        .then(|| s.parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| {
            format!(
                "{:?} is not a number",
                s.chars().take(24).collect::<String>()
            )
        })
}

pub fn pid_value(s: &str) -> Result<u32, String> {
    u32::try_from(number(s)?)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| "its pid is not a process id".to_owned())
}

pub fn token_value(s: &str) -> Result<String, String> {
    storable_token(s)
        .then(|| s.to_owned())
        .ok_or_else(|| "its token is malformed".to_owned())
}

/// True for what a boot id may be: 1 to 64 of `0-9 a-f -`.
pub fn is_boot_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f' | b'-'))
}

/// A boot id as written: `-` (unknown), or 1 to 64 of `0-9 a-f -`.
fn boot_value(s: &str) -> Result<String, String> {
    if s == "-" {
        return Ok(String::new());
    }
    is_boot_id(s)
        .then(|| s.to_owned())
        .ok_or_else(|| "its boot_id is malformed".to_owned())
}

pub fn host_value(s: &str) -> Result<String, String> {
    (stored_host(s) == s)
        .then(|| s.to_owned())
        .ok_or_else(|| "its host is malformed".to_owned())
}
