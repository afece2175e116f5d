//! What a lock file holds: a small text record with the fencing counter and, while a
//! lockrun holds the lock (or keeps it for `--hold-at-least`), its holder. Written
//! whole at offset 0; parsed strictly, so that a file that is not lockrun's is
//! refused, never taken over (its counter never reset). Part of [`super`]; depends on
//! [`crate::backend::Holder`] only.
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
//! ```
//!
//! `reserved_through` is durable (fsynced) before any token up to it is handed out;
//! `fencing_token` is written without an fsync while the boot it names lasts (the page
//! cache keeps it for every process of that boot). See [`Record::next_token`].
//!
//! The six holder lines are all there or none (a released or broken lock keeps only
//! its counter). An empty file is a lock file whose creator died before writing it:
//! counter 0, no holder.
//!
//! A record is padded to a multiple of 512 bytes (by a last line of spaces) and never
//! written shorter than the file already is: a write replaces the whole record in place (one
//! sector, in practice written whole) and the file is never truncated, so a crash
//! cannot leave a new record's head on an old record's tail.

use std::time::Duration;

use crate::backend::Holder;

/// The first line: what the file is, and the format's version.
const MAGIC: &str = "lockrun lock file 1";

/// The largest record read; a larger file is not lockrun's.
pub const MAX_LEN: usize = 4096;

/// Records are padded to a multiple of this.
const BLOCK: usize = 512;

/// How many fencing tokens one fsync reserves.
pub const RESERVE: u64 = 1024;

/// A lock file's contents.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Record {
    /// The last fencing token handed out for this lock (0: none yet), as far as the
    /// boot named by `boot` knows.
    pub fencing: u64,
    /// No token above this was handed out; on disk (fsynced) before any token up to it.
    pub reserved: u64,
    /// The boot (Linux's boot id) during which `fencing` was written; empty: unknown.
    pub boot: String,
    /// Who holds the lock, or keeps it for `--hold-at-least`.
    pub holder: Option<HolderLine>,
}

/// The holder's part of a [`Record`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderLine {
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
    /// 0, or until when the lock is kept after the holder let go (`--hold-at-least`),
    /// ms since the Unix epoch.
    pub hold_until_ms: u64,
}

impl Record {
    /// The file's text.
    pub fn to_text(&self) -> String {
        let boot = if self.boot.is_empty() {
            "-"
        } else {
            &self.boot
        };
        let mut s = format!(
            "{MAGIC}\nfencing_token {}\nreserved_through {}\nboot_id {boot}\n",
            self.fencing, self.reserved
        );
        if let Some(h) = &self.holder {
            s.push_str(&format!(
                "token {}\nhost {}\npid {}\nsince_ms {}\nttl_ms {}\nhold_until_ms {}\n",
                h.token, h.host, h.pid, h.since_ms, h.ttl_ms, h.hold_until_ms
            ));
        }
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
        let fencing = number(field(lines.next(), "fencing_token")?)?;
        let reserved = number(field(lines.next(), "reserved_through")?)?;
        let boot = boot_value(field(lines.next(), "boot_id")?)?;
        let rest: Vec<&str> = lines.collect();
        let holder = match rest.as_slice() {
            [] => None,
            [token, host, pid, since, ttl, hold] => Some(HolderLine {
                token: token_value(field(Some(token), "token")?)?,
                host: host_value(field(Some(host), "host")?)?,
                pid: u32::try_from(number(field(Some(pid), "pid")?)?)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| "its pid is not a process id".to_owned())?,
                since_ms: number(field(Some(since), "since_ms")?)?,
                ttl_ms: number(field(Some(ttl), "ttl_ms")?)?,
                hold_until_ms: number(field(Some(hold), "hold_until_ms")?)?,
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
            holder,
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

    /// The holder as `status` and a busy answer show it: `locked` says the kernel
    /// lock is held (the lease runs while its lockrun lives: its TTL is shown as left,
    /// since it renews continuously); else only a hold still to run counts, with the
    /// hold left. `None`: free.
    pub fn holder(&self, locked: bool, now_ms: u64) -> Option<Holder> {
        let hold_left = self.hold_left(now_ms);
        if !locked && hold_left.is_zero() {
            return None;
        }
        let Some(h) = &self.holder else {
            // Locked by a lockrun that has not written its record yet.
            return Some(Holder::default());
        };
        Some(Holder {
            host: h.host.clone(),
            pid: h.pid,
            since_ms: h.since_ms,
            fencing_token: self.fencing,
            ttl_left: if hold_left.is_zero() {
                Duration::from_millis(h.ttl_ms)
            } else {
                hold_left
            },
            ..Holder::default()
        })
    }

    /// How long `--hold-at-least` still keeps the lock (zero: not kept).
    pub fn hold_left(&self, now_ms: u64) -> Duration {
        let until = self.holder.as_ref().map_or(0, |h| h.hold_until_ms);
        Duration::from_millis(until.saturating_sub(now_ms))
    }
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
fn field<'a>(line: Option<&'a str>, key: &str) -> Result<&'a str, String> {
    line.and_then(|l| l.strip_prefix(key))
        .and_then(|l| l.strip_prefix(' '))
        .ok_or_else(|| format!("it has no {key} line where one belongs"))
}

/// A decimal number without sign or leading zeros.
fn number(s: &str) -> Result<u64, String> {
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

fn token_value(s: &str) -> Result<String, String> {
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

fn host_value(s: &str) -> Result<String, String> {
    (stored_host(s) == s)
        .then(|| s.to_owned())
        .ok_or_else(|| "its host is malformed".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> Record {
        Record {
            fencing: 42,
            reserved: 1065,
            boot: "5c1f0e7a-3b2d-4c8e-9f10-2a3b4c5d6e7f".into(),
            holder: Some(HolderLine {
                token: "0123456789abcdef0123456789abcdef".into(),
                host: "web-1".into(),
                pid: 1234,
                since_ms: 1_714_557_600_000,
                ttl_ms: 30_000,
                hold_until_ms: 0,
            }),
        }
    }

    #[test]
    fn records_read_back_what_was_written() {
        for r in [
            held(),
            Record {
                fencing: 7,
                reserved: 7,
                boot: String::new(),
                holder: None,
            },
            Record::default(),
        ] {
            assert_eq!(Record::parse(r.to_text().as_bytes()), Ok(r.clone()));
            for len in [0, 512, 600, 4096] {
                let bytes = r.to_bytes(len);
                assert!(
                    bytes.len() >= len && bytes.len() % 512 == 0,
                    "{}",
                    bytes.len()
                );
                assert_eq!(Record::parse(&bytes), Ok(r.clone()));
            }
        }
        assert_eq!(Record::parse(b""), Ok(Record::default()));
        let text = held().to_text();
        assert!(
            text.starts_with(
                "lockrun lock file 1\nfencing_token 42\nreserved_through 1065\nboot_id 5c1f"
            ),
            "{text}"
        );
    }

    #[test]
    fn anything_else_is_refused() {
        let good = held().to_text();
        let bad: Vec<String> = vec![
            "hello\n".into(),
            "#!/bin/sh\nrm -rf /\n".into(),
            good.trim_end().into(),
            good.replace("lock file 1", "lock file 2"),
            good.replace("fencing_token 42", "fencing_token 042"),
            good.replace("fencing_token 42", "fencing_token +42"),
            good.replace("fencing_token 42", "fencing_token 18446744073709551616"),
            good.replace("fencing_token 42", "fencing_token 0"),
            good.replace("fencing_token 42", "fencing_token  42"),
            good.replace("\nreserved_through 1065", ""),
            good.replace("boot_id 5c1f", "boot_id 5C1F"),
            good.replace("boot_id 5c1f", "boot_id  5c1f"),
            good.replace("pid 1234", "pid 0"),
            good.replace("pid 1234", "pid 4294967296"),
            good.replace("host web-1", "host web 1"),
            good.replace("host web-1", "host "),
            good.replace("token 0123", "token 01.3"),
            good.replace("ttl_ms", "ttl"),
            good.replace("\nhold_until_ms 0", ""),
            format!("{good}extra 1\n"),
            good.replace('\n', "\r\n"),
            good.replace("\npid", "\n\npid"),
            good.replace("\npid", "\n \npid"),
            format!("{good} x\n"),
            format!("{good}  \n \n"),
            format!("{good}\n\n"),
            format!("{MAGIC}\nfencing_token 1\n{}", "x".repeat(MAX_LEN)),
        ];
        for text in bad {
            assert!(Record::parse(text.as_bytes()).is_err(), "{text:?}");
        }
        assert!(Record::parse(b"\xff\xfe\n").is_err());
    }

    #[test]
    fn the_holder_is_shown_while_locked_or_kept() {
        let now = 1_714_557_601_000;
        let mut r = held();
        assert_eq!(r.holder(false, now), None);
        let h = r.holder(true, now).unwrap();
        assert_eq!((h.pid, h.fencing_token), (1234, 42));
        assert_eq!(h.ttl_left, Duration::from_secs(30));
        r.holder.as_mut().unwrap().hold_until_ms = now + 1500;
        assert_eq!(
            r.holder(false, now).unwrap().ttl_left,
            Duration::from_millis(1500)
        );
        assert_eq!(r.holder(false, now + 1500), None);
        let free = Record {
            fencing: 3,
            ..Record::default()
        };
        assert_eq!(free.holder(false, now), None);
        assert_eq!(free.holder(true, now), Some(Holder::default()));
    }

    #[test]
    fn tokens_increase_and_survive_a_lost_unsynced_write() {
        let (a, b) = (Some("aaaa-1"), Some("bbbb-2"));
        let mut disk = Record::default();
        let mut cache = Record::default();
        let mut given = Vec::new();
        let mut fsyncs = 0;
        for round in 0..3 {
            let boot = if round % 2 == 0 { a } else { b };
            // A new boot finds what the disk kept: the last fsynced record.
            cache = disk.clone();
            for _ in 0..2500 {
                let (token, reserved, durable) = cache.next_token(boot).unwrap();
                cache = Record {
                    fencing: token,
                    reserved,
                    boot: boot.unwrap().to_owned(),
                    holder: None,
                };
                if durable {
                    disk = cache.clone();
                    fsyncs += 1;
                }
                given.push(token);
            }
        }
        assert!(given.windows(2).all(|w| w[0] < w[1]), "tokens went back");
        // Three per boot of 2500 tokens with blocks of 1024: 1, 1025, 2049.
        assert_eq!(fsyncs, 9);
        assert!(cache.fencing < 3 * 2500 + 3 * RESERVE);
    }

    #[test]
    fn an_unknown_boot_fsyncs_every_token() {
        let r = Record {
            fencing: 5,
            reserved: 5,
            ..Record::default()
        };
        assert_eq!(r.next_token(None), Some((6, 6, true)));
        let same = Record {
            fencing: 5,
            reserved: 9,
            boot: "ab".into(),
            holder: None,
        };
        assert_eq!(same.next_token(Some("ab")), Some((6, 9, false)));
        assert_eq!(
            same.next_token(Some("cd")),
            Some((10, 10 + RESERVE - 1, true))
        );
        assert_eq!(same.next_token(None), Some((10, 10, true)));
        let full = Record {
            fencing: u64::MAX,
            reserved: u64::MAX,
            boot: "ab".into(),
            holder: None,
        };
        assert_eq!(full.next_token(Some("ab")), None);
    }

    #[test]
    fn host_names_are_stored_as_graphic_ascii() {
        assert_eq!(stored_host("web-1.example"), "web-1.example");
        assert_eq!(stored_host("a b\nc"), "a?b?c");
        assert_eq!(stored_host(""), "unknown");
        assert_eq!(stored_host(&"h".repeat(300)).len(), 255);
        assert!(storable_token(&crate::token::lock_token()));
        assert!(!storable_token("") && !storable_token("a b"));
    }
}
