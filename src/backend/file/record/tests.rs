//! The record format's tests. Part of [`super`].

use super::*;

const BOOT: &str = "5c1f0e7a-3b2d-4c8e-9f10-2a3b4c5d6e7f";

/// The holder of `slot` with fencing token `fencing`.
fn line(slot: u32, fencing: u64) -> HolderLine {
    HolderLine {
        slot,
        fencing,
        token: format!("{:032x}", 0x0123_4567_89ab_cdef_u64 + u64::from(slot)),
        host: "web-1".into(),
        pid: 1234 + slot,
        since_ms: 1_714_557_600_000,
        ttl_ms: 30_000,
        hold_until_ms: 0,
        hold_clock: None,
    }
}

/// A plain lock held with token 42.
fn held() -> Record {
    Record {
        fencing: 42,
        reserved: 1065,
        boot: BOOT.into(),
        slots: 1,
        holders: vec![line(0, 42)],
    }
}

/// A semaphore of 3 slots, slots 0 and 2 held (tokens 40 and 44, the last handed out).
fn semaphore() -> Record {
    Record {
        fencing: 44,
        reserved: 1065,
        boot: BOOT.into(),
        slots: 3,
        holders: vec![line(0, 40), line(2, 44)],
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
            slots: 1,
            holders: Vec::new(),
        },
        Record::default(),
        semaphore(),
        Record {
            slots: 1000,
            holders: (0..1000).map(|s| line(s, 44)).collect(),
            ..semaphore()
        },
    ] {
        assert_eq!(Record::parse(r.to_text().as_bytes()), Ok(r.clone()));
        for len in [0, 512, 600, 4096, 200_000] {
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
        good.replace("token 0000", "token 00.0"),
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
    let ms = 1_714_557_601_000;
    let now = Now::wall(ms);
    let mut r = held();
    assert_eq!(r.holder(false, now), None);
    let h = r.holder(true, now).unwrap();
    assert_eq!((h.pid, h.fencing_token), (1234, 42));
    assert_eq!(h.ttl_left, Duration::from_secs(30));
    r.holders[0].hold_until_ms = ms + 1500;
    assert_eq!(
        r.holder(false, now).unwrap().ttl_left,
        Duration::from_millis(1500)
    );
    assert_eq!(r.holder(false, Now::wall(ms + 1500)), None);
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
                ..Record::default()
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
        ..Record::default()
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
        ..Record::default()
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

#[test]
fn a_semaphore_lists_its_holders_by_slot_each_with_its_token() {
    let r = semaphore();
    let text = r.to_text();
    assert!(
        text.starts_with(&format!(
            "lockrun lock file 2\nfencing_token 44\nreserved_through 1065\nboot_id {BOOT}\n\
             slots 3\nholder slot=0 fencing_token=40 token=0000000000000000"
        )),
        "{text}"
    );
    assert!(text.contains("\nholder slot=2 fencing_token=44 "), "{text}");
    let end = text.lines().last().unwrap();
    assert!(end.starts_with("end ") && end.len() == 20, "{end}");
    let now = Now::wall(1_714_557_601_000);
    assert_eq!(r.holder_of(1, false, now, 3), None);
    let unknown = r.holder_of(1, true, now, 3).unwrap();
    assert_eq!((unknown.slot, unknown.slots, unknown.pid), (1, 3, 0));
    let second = r.holder_of(2, true, now, 3).unwrap();
    assert_eq!(
        (second.slot, second.slots, second.pid, second.fencing_token),
        (2, 3, 1236, 44)
    );
    assert_eq!(r.holder_of(2, false, now, 3), None);
}

#[test]
fn a_record_of_an_older_lockrun_is_a_plain_lock() {
    // Written before semaphores: format 1, its holder has slot 0 of 1.
    let old = "lockrun lock file 1\nfencing_token 42\nreserved_through 1065\nboot_id -\n\
               token 0123456789abcdef0123456789abcdef\nhost web-1\npid 1234\n\
               since_ms 1714557600000\nttl_ms 30000\nhold_until_ms 0\n";
    let r = Record::parse(old.as_bytes()).unwrap();
    assert_eq!((r.slots, r.holders.len()), (1, 1));
    assert_eq!((r.holders[0].slot, r.holders[0].fencing), (0, 42));
    let h = r.holder(true, Now::wall(1_714_557_601_000)).unwrap();
    assert_eq!((h.slot, h.slots, h.fencing_token), (0, 1, 42));
    // Written back unchanged, byte for byte: a plain lock is what it always was.
    assert_eq!(r.to_text(), old);
    // A semaphore whose holders all left is format 1 again (an older lockrun reads it).
    let left = Record {
        holders: Vec::new(),
        ..semaphore()
    };
    assert!(left.to_text().starts_with("lockrun lock file 1\n"));
    assert_eq!(Record::parse(left.to_text().as_bytes()).unwrap().slots, 1);
}

#[test]
fn a_semaphore_record_that_is_not_lockruns_is_refused() {
    let good = semaphore().to_text();
    // Rewrites that keep the checksum right: only the content is wrong.
    let resum = |text: String| {
        let body = &text[..text.find("end ").unwrap()];
        format!("{body}end {:016x}\n", checksum(body.as_bytes()))
    };
    let bad: Vec<String> = vec![
        good.replace("slots 3", "slots 0"),
        good.replace("slots 3", "slots 1001"),
        good.replace("slots 3\n", ""),
        good.replace("fencing_token 44", "fencing_token 044"),
        resum(good.replace("slot=2", "slot=3")),
        resum(good.replace("slot=2", "slot=0")),
        resum(good.replace("fencing_token=44", "fencing_token=45")),
        resum(good.replace("fencing_token=40", "fencing_token=0")),
        resum(good.replace("pid=1236", "pid=0")),
        resum(good.replace(" hold_until_ms=0\nend", " hold_until_ms=0 x=1\nend")),
        resum(good.replace("host=web-1 pid=1236", "pid=1236 host=web-1")),
        resum(good.replace("\nholder slot=2", "\nholders slot=2")),
        "lockrun lock file 2\nfencing_token 1\n".into(),
    ];
    for text in bad {
        assert!(Record::parse(text.as_bytes()).is_err(), "{text:?}");
    }
}

#[test]
fn a_torn_semaphore_record_keeps_its_counter_and_forgets_its_holders() {
    let long = Record {
        slots: 40,
        holders: (0..40).map(|s| line(s, 44)).collect(),
        ..semaphore()
    };
    let old = long.to_bytes(0);
    assert!(old.len() > 4096);
    let new = Record {
        fencing: 45,
        holders: (0..40).map(|s| line(s, 45 - u64::from(s % 2))).collect(),
        ..long.clone()
    }
    .to_bytes(old.len());
    assert_eq!(new.len(), old.len());
    // The first sectors of the new record, the rest of the old one.
    for cut in [512, 1024, 4096] {
        let torn = [&new[..cut], &old[cut..]].concat();
        let r = Record::parse(&torn).unwrap();
        assert_eq!((r.fencing, r.reserved, r.slots), (45, 1065, 40));
        assert!(r.holders.is_empty(), "{cut}");
    }
    // A whole record followed by an old record's longer tail is whole.
    let short = semaphore().to_bytes(0);
    let kept = [&short[..], &old[short.len()..]].concat();
    assert_eq!(Record::parse(&kept), Ok(semaphore()));
}

#[test]
fn a_hold_is_kept_on_boottime_during_its_boot_and_on_the_wall_clock_after() {
    let now = Now {
        wall_ms: 1_714_557_601_000,
        boot: Some(BOOT),
        boottime_ms: 90_000,
    };
    let (until, clock) = now.hold_end(Duration::from_secs(20));
    let mut r = held();
    r.holders[0].hold_until_ms = until;
    r.holders[0].hold_clock = clock;
    // Written and read back, in both formats.
    let text = r.to_text();
    assert!(
        text.contains(&format!("\nhold_clock {BOOT}:110001\n")),
        "{text}"
    );
    assert_eq!(Record::parse(text.as_bytes()).unwrap(), r);
    assert!(Record::parse(text.replace(":110001", ":x").as_bytes()).is_err());
    let mut two = semaphore();
    two.holders[1] = r.holders[0].clone();
    two.holders[1].slot = 2;
    two.holders[1].fencing = 44;
    let text = two.to_text();
    assert!(
        text.contains(&format!(" hold_clock={BOOT}:110001\nend ")),
        "{text}"
    );
    assert_eq!(Record::parse(text.as_bytes()).unwrap(), two);
    let left = |n: Now| r.holder(false, n).map(|h| h.ttl_left.as_millis());
    assert_eq!(left(now), Some(20_001));
    // A wall clock stepped forward (or back) changes nothing within the boot.
    let stepped = Now {
        wall_ms: now.wall_ms + 300_000,
        ..now
    };
    assert_eq!(left(stepped), Some(20_001));
    let later = Now {
        boottime_ms: 100_000,
        ..stepped
    };
    assert_eq!(left(later), Some(10_001));
    // Another boot: CLOCK_BOOTTIME started again, the wall clock is what is left.
    let rebooted = Now {
        wall_ms: now.wall_ms + 5_000,
        boot: Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"),
        boottime_ms: 1_000,
    };
    assert_eq!(left(rebooted), Some(15_001));
}
