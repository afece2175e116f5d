//! The record of a lock's last run on `file://`: a small text file of its own beside
//! the lock file (`name::record_file_name`: `P@NAME` beside `P=NAME`), opened and
//! checked as a lock file is (`dir.rs`: created 0600, no symlink followed, refused
//! unless a regular file of this user's that no one else may use). Part of
//! [`super`].
//!
//! ```text
//! lockrun last run 1
//! host web-1
//! pid 1234
//! fencing_token 42
//! slot 0
//! started_ms 1714557600000   (acquisition, wall clock)
//! ended_ms 1714557605000     (release, wall clock)
//! exit_status 3
//! ended_by exited
//! ok_started_ms 1714550400000   (the last success's acquisition; both lines only
//! ok_host web-2                  once a run of the name exited 0)
//! ```
//!
//! A run's release writes it from its holder line in the lock file (host, pid, token,
//! slot, start), under the lock file's record guard (byte 1), before it lets go of
//! its slot: so two releases of a semaphore's slots write one after the other, and
//! `status`, which reads it under the same guard (shared), never sees half of one.
//! A run that did not exit 0 keeps the last success of the record it replaces.
//! As a lock file's record, it is padded to 512 bytes and never written shorter (one
//! sector: in practice written whole), and not fsynced (a crash of the machine may
//! leave the run before). It is best effort: a release never fails for it; `status`
//! says what is wrong with a file it cannot read. Like the lock file and its
//! fencing counter, it stays: one file per name ever run.

use std::os::unix::fs::FileExt;

use super::dir::{LockDir, Open};
use super::lock::{lock_record, Kind};
use super::lockfile::LockFile;
use super::record::{field, host_value, number, pid_value, Record};
use super::{name, now_ms, FileBackend, Held};
use crate::backend::{BackendError, LastOk, RunEnd, RunRecord, MAX_SLOTS};

/// The first line.
const MAGIC: &str = "lockrun last run 1";

/// Records are padded to a multiple of this, as lock files are.
const BLOCK: usize = 512;

/// The largest file read: a record takes one block.
const MAX_LEN: usize = 4 * BLOCK;

/// The file's text.
fn to_text(r: &RunRecord) -> String {
    format!(
        "{MAGIC}\nhost {}\npid {}\nfencing_token {}\nslot {}\nstarted_ms {}\nended_ms {}\n\
         exit_status {}\nended_by {}\n",
        r.host, r.pid, r.fencing_token, r.slot, r.started_ms, r.ended_ms, r.exit_status, r.ended_by
    ) + &r.last_ok.as_ref().map_or_else(String::new, |ok| {
        format!("ok_started_ms {}\nok_host {}\n", ok.started_ms, ok.host)
    })
}

/// The bytes to write over a file of `len` bytes: the text, padded by a line of
/// spaces to a multiple of 512 bytes and to at least `len`.
fn to_bytes(r: &RunRecord, len: usize) -> Vec<u8> {
    let mut bytes = to_text(r).into_bytes();
    let padded = bytes.len().max(len).next_multiple_of(BLOCK);
    if padded > bytes.len() {
        bytes.resize(padded - 1, b' ');
        bytes.push(b'\n');
    }
    bytes
}

/// Parses a file's bytes (empty: its creator died before writing it, no record), or
/// says why they are not a record of lockrun's.
fn parse(bytes: &[u8]) -> Result<Option<RunRecord>, String> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "it is not text".to_owned())?;
    let body = text
        .strip_suffix('\n')
        .ok_or_else(|| "its last line is cut short".to_owned())?;
    let mut lines: Vec<&str> = body.split('\n').collect();
    if lines.len() > 2 && lines.last().is_some_and(|l| l.bytes().all(|b| b == b' ')) {
        lines.pop();
    }
    let (last_ok, lines) = match lines.as_slice() {
        [first @ .., ok_started, ok_host] if first.len() == 9 => {
            let ok = LastOk {
                started_ms: number(field(Some(ok_started), "ok_started_ms")?)?,
                host: host_value(field(Some(ok_host), "ok_host")?)?,
            };
            (Some(ok), first)
        }
        all => (None, all),
    };
    let [magic, host, pid, fence, slot, started, ended, exit, by] = lines else {
        return Err("it does not have the lines of one".to_owned());
    };
    if *magic != MAGIC {
        return Err(format!("its first line is not {MAGIC:?}"));
    }
    let small = |line: &str, key: &str, max: u64| -> Result<u64, String> {
        let n = number(field(Some(line), key)?)?;
        (n < max)
            .then_some(n)
            .ok_or_else(|| format!("its {key} is out of range"))
    };
    let ended_by = field(Some(by), "ended_by")?;
    let word = (1..=32).contains(&ended_by.len())
        && ended_by
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_');
    if !word {
        return Err("its ended_by is malformed".to_owned());
    }
    Ok(Some(RunRecord {
        host: host_value(field(Some(host), "host")?)?,
        pid: pid_value(field(Some(pid), "pid")?)?,
        fencing_token: number(field(Some(fence), "fencing_token")?)?,
        slot: small(slot, "slot", u64::from(MAX_SLOTS))? as u32,
        started_ms: number(field(Some(started), "started_ms")?)?,
        ended_ms: number(field(Some(ended), "ended_ms")?)?,
        exit_status: small(exit, "exit_status", 256)? as u8,
        ended_by: ended_by.to_owned(),
        last_ok,
    }))
}

/// An I/O error on the record file `file`.
fn io(file: &LockFile, e: &std::io::Error) -> BackendError {
    BackendError::Unavailable(format!(
        "cannot use the run record file {}: {e}",
        file.shown()
    ))
}

/// Writes `r` over the record in `file`.
fn write(file: &LockFile, r: &RunRecord) -> Result<(), BackendError> {
    let len = file.file().metadata().map_err(|e| io(file, &e))?.len();
    let bytes = to_bytes(r, usize::try_from(len).unwrap_or(usize::MAX));
    file.file()
        .write_all_at(&bytes, 0)
        .map_err(|e| io(file, &e))
}

/// Reads the record in `file`; a file that is not one is refused.
fn read(file: &LockFile) -> Result<Option<RunRecord>, BackendError> {
    let mut buf = vec![0u8; MAX_LEN + 1];
    let mut len = 0;
    while len < buf.len() {
        match file.file().read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(file, &e)),
        }
    }
    let parsed = match len > MAX_LEN {
        true => Err(format!("it is larger than {MAX_LEN} bytes")),
        false => parse(&buf[..len]),
    };
    parsed.map_err(|why| {
        BackendError::Refused(format!(
            "{} is not the record of a lock's last run ({why}): remove it; the next run \
             writes it anew",
            file.shown()
        ))
    })
}

impl FileBackend {
    /// Writes the record of the run that ends (`end`; `None`: no command ran, no
    /// record) holding `held`, whose holder line is in `record` (the lock file's, read
    /// under its guard, which the caller holds). Best effort.
    pub(super) fn record_run(&self, name: &str, held: &Held, record: &Record, end: Option<RunEnd>) {
        let Some(end) = end else { return };
        let Some(h) = record.entry(held.slot).filter(|h| h.token == held.token) else {
            return;
        };
        let mut run = RunRecord {
            host: h.host.clone(),
            pid: h.pid,
            fencing_token: h.fencing,
            slot: held.slot,
            started_ms: h.since_ms,
            ended_ms: now_ms(),
            exit_status: end.exit_status,
            ended_by: end.ended_by.as_str().to_owned(),
            last_ok: None,
        };
        let Some(file_name) = name::record_file_name(&self.key_prefix, name) else {
            return;
        };
        if let Ok(Some(dir)) = self.dir(false) {
            if let Ok(Some(file)) = dir.open_run_record(&file_name, Open::Create) {
                run.last_ok = match end.exit_status {
                    0 => Some(LastOk {
                        started_ms: run.started_ms,
                        host: run.host.clone(),
                    }),
                    // A record that cannot be read has no success to keep.
                    _ => read(&file).ok().flatten().and_then(|r| r.last_ok),
                };
                let _ = write(&file, &run);
            }
        }
    }

    /// The record of `name`'s last run, read under the lock file's guard (shared).
    pub(super) async fn read_last_run(
        &self,
        name: &str,
    ) -> Result<Option<RunRecord>, BackendError> {
        // The lock file's name first: its refusal says what is wrong with the name.
        let lock_name = self.file_name(name)?;
        let record_name = name::record_file_name(&self.key_prefix, name)
            .ok_or_else(|| BackendError::Refused("the lock name is too long".into()))?;
        let Some(dir) = self.dir(false)? else {
            return Ok(None);
        };
        let Some(file) = dir.open_run_record(&record_name, Open::Read)? else {
            return Ok(None);
        };
        let lock = guard(&dir, &lock_name).await?;
        let last = read(&file);
        drop(lock);
        last
    }
}

/// The lock file `file_name` of `dir` with its record guard held shared (let go of
/// when it is closed), or `None` if there is no lock file.
async fn guard(dir: &LockDir, file_name: &str) -> Result<Option<LockFile>, BackendError> {
    let Some(lock) = dir.open_lock(file_name, Open::Read)? else {
        return Ok(None);
    };
    lock_record(lock.file(), Kind::Read)
        .await
        .map_err(|e| lock.io(&e.into()))?;
    Ok(Some(lock))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RunRecord {
        RunRecord {
            host: "web-1".into(),
            pid: 1234,
            fencing_token: 42,
            slot: 2,
            started_ms: 1_714_557_600_000,
            ended_ms: 1_714_557_605_000,
            exit_status: 124,
            ended_by: "max_runtime".into(),
            last_ok: None,
        }
    }

    #[test]
    fn the_last_success_reads_back_when_there_is_one() {
        let r = RunRecord {
            last_ok: Some(LastOk {
                started_ms: 1_714_550_400_000,
                host: "web-2".into(),
            }),
            ..sample()
        };
        let text = to_text(&r);
        assert!(
            text.ends_with("ended_by max_runtime\nok_started_ms 1714550400000\nok_host web-2\n")
        );
        assert_eq!(parse(&to_bytes(&r, 0)), Ok(Some(r.clone())));
        for bad in [
            text.replace("ok_host web-2\n", ""),
            text.replace("ok_host web-2", "ok_host web 2"),
            text.replace("ok_started_ms 1714550400000", "ok_started_ms x"),
            text.replace("ok_started_ms", "ok_start_ms"),
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_record_reads_back_from_one_block_never_written_shorter() {
        let r = sample();
        let bytes = to_bytes(&r, 0);
        assert_eq!(bytes.len(), BLOCK);
        assert_eq!(parse(&bytes), Ok(Some(r.clone())));
        // The longest host still fits one block.
        let long = RunRecord {
            host: "h".repeat(255),
            ended_ms: u64::MAX,
            ..r.clone()
        };
        assert_eq!(to_bytes(&long, 0).len(), BLOCK);
        assert_eq!(to_bytes(&r, 1000).len(), 2 * BLOCK);
        assert_eq!(parse(&to_bytes(&r, 1000)), Ok(Some(r)));
        assert_eq!(parse(b""), Ok(None));
    }

    #[test]
    fn what_lockrun_never_writes_is_refused() {
        let good = to_text(&sample());
        let bad = [
            good.replace("lockrun last run 1", "lockrun lock file 1"),
            good.replace("exit_status 124", "exit_status 256"),
            good.replace("slot 2", "slot 1000"),
            good.replace("pid 1234", "pid 0"),
            good.replace("host web-1", "host web 1"),
            good.replace("ended_by max_runtime", "ended_by Max"),
            good.replace("ended_by max_runtime\n", ""),
            good.replace("fencing_token 42", "fencing_token 042"),
            good.trim_end().to_owned(),
            format!("{good}extra 1\n"),
        ];
        for b in bad {
            assert!(parse(b.as_bytes()).is_err(), "{b:?}");
        }
    }
}
