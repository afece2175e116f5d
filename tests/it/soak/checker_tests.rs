//! The soak's checker catches what it must: synthetic histories with one violation each;
//! and the tap reads the frames it must.

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
    report::Section {
        fence,
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
    let mut stderr = format!(
        r#"{{"ts":"t","level":"info","event":"acquired","lock":"soak","fencing_token":{fence}}}"#
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
    check::check(&check::History {
        sections,
        records,
        faults,
        runs,
        store_log,
        ttl: TTL,
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
