//! The soak's checker catches what it must: synthetic histories with one violation each,
//! of a plain lock and of a semaphore of 3 slots; and the tap reads the frames it must.

use std::time::Duration;

use super::check::{self, Report};
use super::report::{self, Fault, FaultEvent, Run};
use super::tap::{self, Call};
use super::TTL;

fn at(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A successful acquire of `fence` by lock token `token`, sent at `sent` ms.
fn acquired(token: &str, fence: u64, sent: u64) -> tap::Record {
    tap::Record {
        call: Call::Acquire,
        token: token.into(),
        sent: at(sent),
        replied: Some(at(sent + 1)),
        reply: Some(tap::Resp::Array(vec![
            tap::Resp::Int(1),
            tap::Resp::Text(fence.to_string()),
        ])),
        delivered: true,
    }
}

/// A section of `fence` run by lockrun `pid` from `start` to `end` ms, writing once.
fn section(fence: u64, pid: i32, start: u64, end: u64) -> report::Section {
    slot_section(fence, 0, pid, start, end)
}

/// A section of `fence` on `slot`, run by lockrun `pid` from `start` to `end` ms.
fn slot_section(fence: u64, slot: u32, pid: i32, start: u64, end: u64) -> report::Section {
    report::Section {
        fence,
        slot,
        lockrun_pid: pid,
        pids: vec![pid + 1000],
        start: at(start),
        last_seen: at(end),
        end: Some(at(end)),
        gone: Some(at(end + 1)),
        writes: vec![(at(start), true)],
        garbage: Vec::new(),
    }
}

/// A lockrun `pid` that acquired `fence` and exited `code` at `ended` ms.
fn lockrun_run_of(pid: i32, fence: u64, code: i32, ended: u64) -> Run {
    holder_run(pid, fence, 0, code, ended)
}

/// A lockrun `pid` that acquired `fence` on `slot` and exited `code` at `ended` ms.
fn holder_run(pid: i32, fence: u64, slot: u32, code: i32, ended: u64) -> Run {
    let mut stderr = format!(
        r#"{{"ts":"t","level":"info","event":"acquired","lock":"soak","fencing_token":{fence},"slot":{slot}}}"#
    );
    if code == 124 {
        stderr
            .push_str("\n{\"ts\":\"t\",\"level\":\"error\",\"event\":\"lost\",\"lock\":\"soak\"}");
    }
    Run {
        pid,
        ended: at(ended),
        code: Some(code),
        stderr,
        hung: false,
    }
}

fn check_of(
    records: &[tap::Record],
    sections: &[report::Section],
    runs: &[Run],
    faults: &[FaultEvent],
    store_log: &[String],
) -> Report {
    check_slots_of(1, records, sections, runs, faults, store_log)
}

fn check_slots_of(
    slots: u32,
    records: &[tap::Record],
    sections: &[report::Section],
    runs: &[Run],
    faults: &[FaultEvent],
    store_log: &[String],
) -> Report {
    check::check(&check::History {
        sections,
        records,
        faults,
        runs,
        store_log,
        ttl: TTL,
        slots,
    })
}

fn fault(kind: Fault, from: u64, to: u64, pid: Option<i32>) -> FaultEvent {
    FaultEvent {
        kind,
        from: at(from),
        to: at(to),
        pid,
        detail: String::new(),
    }
}

#[test]
fn checker_passes_a_clean_history() {
    let r = check_of(
        &[acquired("a", 100, 1000), acquired("b", 200, 2000)],
        &[section(100, 11, 1002, 1500), section(200, 12, 2002, 2500)],
        &[
            lockrun_run_of(11, 100, 0, 1510),
            lockrun_run_of(12, 200, 0, 2510),
        ],
        &[],
        &["1 100".into(), "1 200".into()],
    );
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.sections, 2);
}

#[test]
fn checker_flags_an_overlap_that_no_fault_explains() {
    let records = [acquired("a", 100, 1000), acquired("b", 200, 1500)];
    let sections = [section(100, 11, 1002, 2000), section(200, 12, 1502, 2500)];
    let runs = [
        lockrun_run_of(11, 100, 0, 2010),
        lockrun_run_of(12, 200, 0, 2510),
    ];
    let log = ["1 100".to_string(), "1 200".into(), "0 100".into()];
    let r = check_of(&records, &sections, &runs, &[], &log);
    assert!(
        r.failures.iter().any(|f| f.contains("overlapped")),
        "{:?}",
        r.failures
    );
    // A freeze does not explain it either; a FLUSHALL during the first holder's lease
    // does, and the stale write is counted.
    let freeze = [fault(Fault::FreezeRedis, 1200, 1300, None)];
    let r = check_of(&records, &sections, &runs, &freeze, &log);
    assert!(r.failures.iter().any(|f| f.contains("overlapped")));
    let flush = [fault(Fault::Flushall, 1200, 1200, None)];
    let r = check_of(&records, &sections, &runs, &flush, &log);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.overlaps.get("flushall"), Some(&1));
    assert_eq!(r.stale_rejected, 1);
    // A pause explains it only if it is the stale holder's lockrun that was paused.
    let other = [fault(Fault::PauseLockrun, 1100, 1600, Some(12))];
    let r = check_of(&records, &sections, &runs, &other, &log);
    assert!(r.failures.iter().any(|f| f.contains("overlapped")));
    let own = [fault(Fault::PauseLockrun, 1100, 1600, Some(11))];
    let r = check_of(&records, &sections, &runs, &own, &log);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
}

#[test]
fn checker_flags_a_command_running_past_the_deadline_lockrun_could_know() {
    // Acquired at 1000 ms, never renewed: the deadline is 1000 + TTL.
    let late = 1000 + TTL.as_millis() as u64 + 20;
    let r = check_of(
        &[acquired("a", 100, 1000)],
        &[section(100, 11, 1002, late)],
        &[lockrun_run_of(11, 100, 124, late + 10)],
        &[],
        &["1 100".into()],
    );
    assert!(
        r.failures.iter().any(|f| f.contains("still running")),
        "{:?}",
        r.failures
    );
    // A renewal sent at 1500 ms that came back moves the deadline past it.
    let mut renewal = acquired("a", 0, 1500);
    renewal.call = Call::Renew;
    renewal.reply = Some(tap::Resp::Int(1));
    let r = check_of(
        &[acquired("a", 100, 1000), renewal.clone()],
        &[section(100, 11, 1002, late)],
        &[lockrun_run_of(11, 100, 124, late + 10)],
        &[],
        &["1 100".into()],
    );
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    // Unless its answer never reached lockrun.
    renewal.delivered = false;
    let r = check_of(
        &[acquired("a", 100, 1000), renewal],
        &[section(100, 11, 1002, late)],
        &[lockrun_run_of(11, 100, 124, late + 10)],
        &[],
        &["1 100".into()],
    );
    assert!(r.failures.iter().any(|f| f.contains("still running")));
}

#[test]
fn checker_flags_fencing_tokens_that_go_backwards() {
    let r = check_of(
        &[acquired("a", 200, 1000), acquired("b", 100, 2000)],
        &[section(200, 11, 1002, 1500), section(100, 12, 2002, 2500)],
        &[
            lockrun_run_of(11, 200, 0, 1510),
            lockrun_run_of(12, 100, 0, 2510),
        ],
        &[],
        &["1 200".into(), "0 100".into()],
    );
    assert!(
        r.failures.iter().any(|f| f.contains("went backwards")),
        "{:?}",
        r.failures
    );
    assert!(
        r.failures
            .iter()
            .any(|f| f.contains("later holder got a smaller token")),
        "{:?}",
        r.failures
    );
}

#[test]
fn checker_flags_statuses_spec_does_not_allow_and_unexplained_ones() {
    let mut killed = lockrun_run_of(11, 100, 0, 1510);
    killed.code = Some(137);
    let mut silent = lockrun_run_of(12, 200, 0, 2510);
    silent.code = Some(124); // no "lost" line
    silent.stderr = silent.stderr.lines().next().unwrap().to_string();
    let r = check_of(
        &[acquired("a", 100, 1000), acquired("b", 200, 2000)],
        &[section(100, 11, 1002, 1500), section(200, 12, 2002, 2500)],
        &[killed, silent],
        &[],
        &[],
    );
    assert!(
        r.failures.iter().any(|f| f.contains("137")),
        "{:?}",
        r.failures
    );
    assert!(
        r.failures
            .iter()
            .any(|f| f.contains("without a \"lost\" line")),
        "{:?}",
        r.failures
    );
}

#[test]
fn checker_counts_a_leftover_child_as_part_of_the_holder() {
    // The first section ends at 1500 ms, but its child (in a session of its own, say)
    // is seen running at 2100 ms, after the second holder started at 2002 ms.
    let mut first = section(100, 11, 1002, 1500);
    first.pids.push(2000);
    first.last_seen = at(2100);
    first.gone = Some(at(2101));
    let r = check_of(
        &[acquired("a", 100, 1000), acquired("b", 200, 2000)],
        &[first, section(200, 12, 2002, 2500)],
        &[
            lockrun_run_of(11, 100, 0, 1510),
            lockrun_run_of(12, 200, 0, 2510),
        ],
        &[],
        &["1 100".into(), "1 200".into()],
    );
    assert!(
        r.failures.iter().any(|f| f.contains("overlapped")),
        "{:?}",
        r.failures
    );
}

#[test]
fn checker_allows_a_sigkill_by_the_nemesis_and_lost_lines_of_a_blocked_stderr_only() {
    let records = [acquired("a", 100, 1000), acquired("b", 200, 2000)];
    let sections = [section(100, 11, 1002, 1500), section(200, 12, 2002, 2500)];
    let mut killed = lockrun_run_of(11, 100, 0, 1510);
    killed.code = None;
    // Exited 124, its "lost" line lost.
    let mut mute = lockrun_run_of(12, 200, 0, 2510);
    mute.code = Some(124);
    let runs = [killed, mute];
    let log = ["1 100".to_string(), "1 200".into()];
    let r = check_of(&records, &sections, &runs, &[], &log);
    assert!(
        r.failures.iter().any(|f| f.contains("status None")),
        "{:?}",
        r.failures
    );
    assert!(
        r.failures
            .iter()
            .any(|f| f.contains("without a \"lost\" line")),
        "{:?}",
        r.failures
    );
    let faults = [
        fault(Fault::KillLockrun, 1400, 1400, Some(11)),
        fault(Fault::StderrBlocked, 2100, 2400, Some(12)),
    ];
    let r = check_of(&records, &sections, &runs, &faults, &log);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.codes.get(&137), Some(&1));
    // The nemesis' faults of one lockrun say nothing of another's.
    let faults = [
        fault(Fault::KillLockrun, 1400, 1400, Some(12)),
        fault(Fault::StderrBlocked, 2100, 2400, Some(11)),
    ];
    let r = check_of(&records, &sections, &runs, &faults, &log);
    assert_eq!(r.failures.len(), 2, "{:?}", r.failures);
}

/// A semaphore of 3 slots, as the soak's workers run it: (lock token, fencing token,
/// slot, lockrun pid, acquire sent at, section from, to), in ms of the test clock.
type Holder = (&'static str, u64, u32, i32, u64, u64, u64);

/// Three holders side by side on slots 0, 1 and 2; slot 2 freed at 1400 and taken
/// again at 1410, slot 0 freed at 1500 and taken again at 1510. Never more than 3
/// inside, tokens in the order of the acquisitions.
const GOOD: [Holder; 5] = [
    ("a", 100, 0, 11, 1000, 1002, 1500),
    ("b", 200, 1, 12, 1010, 1012, 1600),
    ("c", 300, 2, 13, 1020, 1022, 1400),
    ("d", 400, 2, 14, 1410, 1412, 1900),
    ("e", 500, 0, 15, 1510, 1512, 2000),
];

/// Checks a semaphore of 3 slots whose history is `holders` (each exits 0 10 ms after
/// its section ended), under `faults`, with `store_log`.
fn check_semaphore(holders: &[Holder], faults: &[FaultEvent], store_log: &[&str]) -> Report {
    let records: Vec<tap::Record> = holders.iter().map(|h| acquired(h.0, h.1, h.4)).collect();
    let sections: Vec<report::Section> = holders
        .iter()
        .map(|h| slot_section(h.1, h.2, h.3, h.5, h.6))
        .collect();
    let runs: Vec<Run> = holders
        .iter()
        .map(|h| holder_run(h.3, h.1, h.2, 0, h.6 + 10))
        .collect();
    let log: Vec<String> = store_log.iter().map(|l| l.to_string()).collect();
    check_slots_of(3, &records, &sections, &runs, faults, &log)
}

/// True when one of `r`'s failures contains `what`.
fn fails_with(r: &Report, what: &str) -> bool {
    r.failures.iter().any(|f| f.contains(what))
}

#[test]
fn semaphore_checker_passes_a_good_history() {
    // Writes of different slots interleave (a smaller token after a larger one on
    // another slot): each slot is its own resource.
    let log = [
        "1 100 0", "1 200 1", "1 300 2", "1 400 2", "1 100 0", "1 200 1", "1 500 0",
    ];
    let r = check_semaphore(&GOOD, &[], &log);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.sections, 5);
    assert_eq!(r.most_inside, 3);
    assert_eq!(r.writes_accepted, 7);
    let by_slot: Vec<(u32, usize)> = r.by_slot.into_iter().collect();
    assert_eq!(by_slot, [(0, 2), (1, 1), (2, 2)]);
}

#[test]
fn semaphore_checker_flags_four_inside_with_three_slots() {
    // A fourth holder on slot 0 from 1032 to 1300, beside a, b and c.
    let mut h = GOOD.to_vec();
    h.insert(3, ("f", 350, 0, 16, 1030, 1032, 1300));
    let r = check_semaphore(&h, &[], &[]);
    assert!(
        fails_with(&r, "4 sections were inside at once with 3 slots"),
        "{:?}",
        r.failures
    );
    assert!(fails_with(&r, "overlapped on slot 0"), "{:?}", r.failures);
    assert_eq!(r.most_inside, 4);
    // A FLUSHALL after a took its slot explains both: a's lease was gone.
    let r = check_semaphore(&h, &[fault(Fault::Flushall, 1025, 1025, None)], &[]);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.crowds.get("flushall"), Some(&1));
    assert_eq!(r.overlaps.get("flushall"), Some(&1));
    // A freeze does not.
    let r = check_semaphore(&h, &[fault(Fault::FreezeRedis, 1025, 1100, None)], &[]);
    assert!(fails_with(&r, "4 sections were inside at once"));
}

#[test]
fn semaphore_checker_flags_two_on_one_slot() {
    // b takes slot 0 while a holds it: only 2 inside of 3, but on one slot.
    let h = [
        ("a", 100, 0, 11, 1000, 1002, 1500),
        ("b", 200, 0, 12, 1100, 1102, 1600),
    ];
    let log = ["1 100 0", "1 200 0", "0 100 0"];
    let r = check_semaphore(&h, &[], &log);
    assert!(fails_with(&r, "overlapped on slot 0"), "{:?}", r.failures);
    assert!(!fails_with(&r, "inside at once"), "{:?}", r.failures);
    // Explained by a pause of the stale holder's lockrun, not of the newer one's; the
    // stale write rejected on the slot is then counted.
    let other = [fault(Fault::PauseLockrun, 1050, 1200, Some(12))];
    assert!(fails_with(
        &check_semaphore(&h, &other, &log),
        "overlapped on slot 0"
    ));
    let own = [fault(Fault::PauseLockrun, 1050, 1200, Some(11))];
    let r = check_semaphore(&h, &own, &log);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.overlaps.get("pause-lockrun"), Some(&1));
    assert_eq!(r.stale_rejected, 1);
}

#[test]
fn semaphore_checker_flags_a_slot_out_of_range_or_not_the_one_acquired() {
    let mut h = GOOD;
    h[1].2 = 3;
    let r = check_semaphore(&h, &[], &[]);
    assert!(fails_with(&r, "ran on slot 3 of 3"), "{:?}", r.failures);
    // The command got another slot than the one its lockrun logged acquiring.
    let records: Vec<tap::Record> = GOOD.iter().map(|h| acquired(h.0, h.1, h.4)).collect();
    let sections: Vec<report::Section> = GOOD
        .iter()
        .map(|h| slot_section(h.1, h.2, h.3, h.5, h.6))
        .collect();
    let mut runs: Vec<Run> = GOOD
        .iter()
        .map(|h| holder_run(h.3, h.1, h.2, 0, h.6 + 10))
        .collect();
    runs[1] = holder_run(12, 200, 2, 0, 1610);
    let r = check_slots_of(3, &records, &sections, &runs, &[], &[]);
    assert!(
        fails_with(
            &r,
            "LOCKRUN_SLOT=1 but its lockrun 12 logged acquiring slot 2"
        ),
        "{:?}",
        r.failures
    );
    // Or than the one the server's reply named (`{1, fence, slot, free}`).
    let mut records = records;
    let with_slot = |fence: u64, slot: i64| {
        Some(tap::Resp::Array(vec![
            tap::Resp::Int(1),
            tap::Resp::Text(fence.to_string()),
            tap::Resp::Int(slot),
            tap::Resp::Text("001".into()),
        ]))
    };
    records[0].reply = with_slot(100, 0);
    records[1].reply = with_slot(200, 2);
    runs[1] = holder_run(12, 200, 1, 0, 1610);
    let r = check_slots_of(3, &records, &sections, &runs, &[], &[]);
    assert_eq!(
        r.failures,
        [
            "the section with token 200 got LOCKRUN_SLOT=1 but the server handed out slot \
          Some(2) with that token"
        ]
    );
}

#[test]
fn semaphore_checker_flags_a_token_not_increasing() {
    // b asked after a's acquisition was answered, and got a smaller token (on another
    // slot: the order is over every slot).
    let mut h = GOOD;
    h[1].1 = 50;
    let r = check_semaphore(&h, &[], &[]);
    assert!(fails_with(&r, "went backwards"), "{:?}", r.failures);
    // A token handed out twice, to holders of two slots.
    let mut h = GOOD;
    h[1].1 = 100;
    let r = check_semaphore(&h, &[], &[]);
    assert!(fails_with(&r, "handed out twice"), "{:?}", r.failures);
    // A rejected write on slot 1 needs a newer holder of slot 1 beside it; one of
    // another slot does not explain it.
    let log = ["1 200 1", "1 300 2", "0 200 1"];
    let r = check_semaphore(&GOOD, &[], &log);
    assert!(
        fails_with(&r, "no section of that slot with a larger token"),
        "{:?}",
        r.failures
    );
}

#[test]
fn tap_parses_resp2_and_resp3_frames() {
    use tap::{parse, Resp};
    assert_eq!(parse(b":1\r\n"), Some((Resp::Int(1), false, 4)));
    assert_eq!(parse(b"$3\r\nab"), None, "incomplete bulk string");
    let (v, push, len) = parse(b"*2\r\n:1\r\n$4\r\n1234\r\n+extra").unwrap();
    assert_eq!(
        v,
        Resp::Array(vec![Resp::Int(1), Resp::Text("1234".into())])
    );
    assert!(!push);
    assert_eq!(len, 18);
    let (v, push, _) = parse(b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$8\r\nreleased\r\n").unwrap();
    assert!(push);
    assert_eq!(
        v,
        Resp::Array(vec![
            Resp::Text("message".into()),
            Resp::Text("ch".into()),
            Resp::Text("released".into())
        ])
    );
    let (v, _, _) = parse(b"%1\r\n+server\r\n+redis\r\n").unwrap();
    assert_eq!(
        v,
        Resp::Array(vec![
            Resp::Text("server".into()),
            Resp::Text("redis".into())
        ])
    );
    assert_eq!(parse(b"_\r\n").map(|x| x.0), Some(Resp::Null));
}
