//! The clock `--hold-at-least` is kept on: `CLOCK_BOOTTIME` of the boot named by its
//! id, which no clock step moves (an NTP step or `date -s` forward would otherwise end
//! a hold early, and let the same cron tick run twice). Part of [`super`]; used by
//! [`super::record`].
//!
//! A hold is written with its end on that clock (`BOOTID:MS`, see
//! [`super::record`]) and, for messages and for a boot that cannot be compared, on the
//! wall clock. `CLOCK_BOOTTIME` starts again at each boot, so it only means something
//! within the boot that wrote it: during another boot (the machine restarted while the
//! lock was kept) the hold falls back to its wall-clock end, as it was always kept
//! before, so that a restart in the middle of a hold does not let the same tick run
//! again at once; a wall clock stepped back then can only keep it for the longest a
//! lock may last ([`MAX_LEASE`]). A hold written by an older lockrun has only its wall
//! clock end.

use std::sync::OnceLock;
use std::time::Duration;

use super::record::is_boot_id;
use crate::backend::MAX_LEASE;

/// The clocks at one instant, as the holds are judged.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// Wall clock, ms since the Unix epoch.
    pub wall_ms: u64,
    /// This boot's id, if it can be read.
    pub boot: Option<&'static str>,
    /// `CLOCK_BOOTTIME`, ms since this boot.
    pub boottime_ms: u64,
}

impl Now {
    /// The clocks now.
    pub fn get() -> Now {
        let boottime = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .map(Duration::from)
            .unwrap_or_default();
        Now {
            wall_ms: super::now_ms(),
            boot: boot_id(),
            boottime_ms: super::millis(boottime),
        }
    }

    /// The wall clock at `wall_ms`, the boot unknown (for tests).
    #[cfg(test)]
    pub fn wall(wall_ms: u64) -> Now {
        Now {
            wall_ms,
            boot: None,
            boottime_ms: 0,
        }
    }

    /// The end of a hold of `keep` from now: on `CLOCK_BOOTTIME` if the boot is
    /// known, and on the wall clock.
    pub fn hold_end(&self, keep: Duration) -> (u64, Option<HoldClock>) {
        let keep = super::millis(keep.min(MAX_LEASE)) + 1;
        let clock = self.boot.map(|boot| HoldClock {
            boot: boot.to_owned(),
            until_ms: self.boottime_ms.saturating_add(keep),
        });
        (self.wall_ms.saturating_add(keep), clock)
    }
}

/// The end of a hold on `CLOCK_BOOTTIME` of one boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldClock {
    /// The boot id.
    pub boot: String,
    /// `CLOCK_BOOTTIME` in ms at which the hold ends.
    pub until_ms: u64,
}

impl HoldClock {
    /// As written: `BOOTID:MS`.
    pub fn to_text(&self) -> String {
        format!("{}:{}", self.boot, self.until_ms)
    }

    /// Parses `BOOTID:MS`.
    pub fn parse(s: &str) -> Result<HoldClock, String> {
        let bad = || "its hold_clock is malformed".to_owned();
        let (boot, ms) = s.split_once(':').ok_or_else(bad)?;
        if !is_boot_id(boot) {
            return Err(bad());
        }
        Ok(HoldClock {
            boot: boot.to_owned(),
            until_ms: super::record::number(ms)?,
        })
    }
}

/// How long a hold that ends at `wall_until_ms` on the wall clock, and at `clock` if
/// written by this lockrun, still runs at `now` (see the module documentation).
pub fn hold_left(wall_until_ms: u64, clock: Option<&HoldClock>, now: Now) -> Duration {
    let left = match clock {
        Some(c) if now.boot == Some(c.boot.as_str()) => c.until_ms.saturating_sub(now.boottime_ms),
        _ => wall_until_ms.saturating_sub(now.wall_ms),
    };
    Duration::from_millis(left).min(MAX_LEASE)
}

/// This boot's id (Linux's `/proc/sys/kernel/random/boot_id`), read once; `None` if
/// it cannot be read (then every token is fsynced, and holds are kept on the wall
/// clock).
pub fn boot_id() -> Option<&'static str> {
    static BOOT: OnceLock<Option<String>> = OnceLock::new();
    BOOT.get_or_init(|| {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let id = id.trim();
        is_boot_id(id).then(|| id.to_owned())
    })
    .as_deref()
}
