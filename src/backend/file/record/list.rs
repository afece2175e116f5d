//! Format 2 of a lock file's record, a semaphore's: the counter lines, N, the holders'
//! list and its checksum (see [`super`]). Part of [`super`].

use super::{counter_lines, field, host_value, number, pid_value, token_value, HolderLine, Record};
use crate::backend::file::hold::HoldClock;
use crate::backend::MAX_SLOTS;

/// Parses a format 2 record (see the module documentation). The head (the counter
/// and N) is parsed strictly; the rest, if its checksum does not match, was torn by a
/// crash and is read as no holders.
pub fn parse(bytes: &[u8]) -> Result<Record, String> {
    // The head: five lines, in the first sector.
    let mut ends = bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i + 1);
    let head_len = ends
        .nth(4)
        .ok_or_else(|| "its head lines are cut short".to_owned())?;
    let head = std::str::from_utf8(&bytes[..head_len]).map_err(|_| "it is not text".to_owned())?;
    let mut lines = head.lines().skip(1);
    let (fencing, reserved, boot) = counter_lines(&mut lines)?;
    let slots = u32::try_from(number(field(lines.next(), "slots")?)?)
        .ok()
        .filter(|n| (1..=MAX_SLOTS).contains(n))
        .ok_or_else(|| format!("its slots are not 1 to {MAX_SLOTS}"))?;
    let mut record = Record {
        fencing,
        reserved,
        boot,
        slots,
        holders: Vec::new(),
    };
    let Some(checked) = checked_body(bytes, head_len) else {
        // Torn: keep the counter, forget the holders.
        return Ok(record);
    };
    let text = std::str::from_utf8(checked).map_err(|_| "it is not text".to_owned())?;
    for line in text.lines() {
        let h = holder_line(line)?;
        if h.slot >= slots || record.holders.last().is_some_and(|l| l.slot >= h.slot) {
            return Err("its holders' slots are out of order".to_owned());
        }
        if h.fencing == 0 || h.fencing > fencing {
            return Err("a holder's fencing token is above the counter".to_owned());
        }
        record.holders.push(h);
    }
    Ok(record)
}

/// The holder lines of a format 2 record whose head takes `head_len` bytes, if its
/// `end` line's checksum matches them (what follows is the padding, or a longer old
/// record's tail that a crash kept). `None`: torn.
fn checked_body(bytes: &[u8], head_len: usize) -> Option<&[u8]> {
    let mut at = head_len;
    while at < bytes.len() {
        let line_end = bytes[at..].iter().position(|b| *b == b'\n')? + at + 1;
        let line = &bytes[at..line_end];
        if let Some(value) = line.strip_prefix(b"end ") {
            let value = std::str::from_utf8(value).ok()?.strip_suffix('\n')?;
            let sum = (value.len() == 16)
                .then(|| u64::from_str_radix(value, 16).ok())
                .flatten()?;
            return (sum == checksum(&bytes[..at])).then_some(&bytes[head_len..at]);
        }
        at = line_end;
    }
    None
}

/// FNV-1a, 64 bits: enough to tell a torn record from a whole one.
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One `holder key=value ...` line of format 2.
fn holder_line(line: &str) -> Result<HolderLine, String> {
    let mut parts = line
        .strip_prefix("holder ")
        .ok_or_else(|| "it has a line that is not a holder where holders belong".to_owned())?
        .split(' ');
    let mut next = |key: &str| {
        parts
            .next()
            .and_then(|p| p.strip_prefix(key))
            .and_then(|p| p.strip_prefix('='))
            .ok_or_else(|| format!("a holder line has no {key} where one belongs"))
    };
    let h = HolderLine {
        slot: u32::try_from(number(next("slot")?)?)
            .map_err(|_| "a slot is too large".to_owned())?,
        fencing: number(next("fencing_token")?)?,
        token: token_value(next("token")?)?,
        host: host_value(next("host")?)?,
        pid: pid_value(next("pid")?)?,
        since_ms: number(next("since_ms")?)?,
        ttl_ms: number(next("ttl_ms")?)?,
        hold_until_ms: number(next("hold_until_ms")?)?,
        hold_clock: None,
    };
    let clock = match parts.next() {
        None => return Ok(h),
        Some(p) => p.strip_prefix("hold_clock="),
    };
    let h = HolderLine {
        hold_clock: match clock {
            Some(c) => Some(HoldClock::parse(c)?),
            None => return Err("a holder line has more than its fields".to_owned()),
        },
        ..h
    };
    match parts.next() {
        None => Ok(h),
        Some(_) => Err("a holder line has more than its fields".to_owned()),
    }
}
