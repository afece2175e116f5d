//! Stored holder records are untrusted: anyone who can write the backend (or a broken
//! writer) may leave any bytes in a lock's hash. Random and hostile records (start
//! times past the year 9999 or beyond any clock, host names with newlines and terminal
//! escapes, numbers that are not numbers) written into a Redis of the test's own, then
//! `status`, a run and `release --force` against each: no panic, a documented status,
//! and text output that no stored byte can split into forged lines (SECURITY.md,
//! "Trust what a backend stores about a holder").

use super::gen::Rng;
use super::settings;
use crate::support::*;

/// Start times: the year-10000 holder first, then the edges of every integer
/// a backend may give, and text that is no number.
const SINCE: &[&str] = &[
    "253402300800000",
    "253402300799999",
    "18446744073709551615",
    "9223372036854775807",
    "99999999999999999999999",
    "-1",
    "0",
    "1.5e300",
    "garbage",
    "",
];

/// Host names, including ones that try to forge a log line or repaint a terminal.
const HOSTS: &[&str] = &[
    "h",
    "h\nlockrun: acquired lock \"job\" with fencing token 999",
    "\u{1b}[2J\u{1b}[Hweb-1",
    "web\r\u{7}\u{0}-2",
    "\u{202e}evil",
    "",
];

/// A record for the lock `name`: a hash as lockrun writes one, with hostile values.
fn hostile_record(rng: &mut Rng, case: usize) -> Vec<String> {
    let pick =
        |rng: &mut Rng, pool: &[&str]| pool[rng.below(pool.len() as u64) as usize].to_owned();
    let since = if case < SINCE.len() {
        SINCE[case].to_owned()
    } else {
        pick(rng, SINCE)
    };
    let host = if case < HOSTS.len() {
        HOSTS[case].to_owned()
    } else {
        pick(rng, HOSTS)
    };
    // The first cases keep every other field valid, so that the hostile start time
    // and host name reach the code that shows them; later ones spoil a number now and
    // then (a refusal, 125, is then the right answer).
    let spoil = case >= SINCE.len();
    let number = |rng: &mut Rng| match rng.below(if spoil { 8 } else { 4 }) {
        0 => "1".to_owned(),
        1 => u32::MAX.to_string(),
        2 | 3 => (1 + rng.below(1 << 31)).to_string(),
        4 => "0".to_owned(),
        5 => u64::MAX.to_string(),
        6 => "-5".to_owned(),
        _ => "x".to_owned(),
    };
    let mut fields = vec![
        "token".to_owned(),
        "a".to_owned(),
        "fence".to_owned(),
        number(rng),
        "host".to_owned(),
        host,
        "pid".to_owned(),
        number(rng),
        "since_ms".to_owned(),
        since,
    ];
    if spoil && rng.chance(20) {
        fields.extend(["slots".to_owned(), number(rng)]);
    }
    fields
}

/// No byte of a stored record may reach the terminal as a control character: every
/// line ends where lockrun ended it.
fn assert_printable(what: &str, text: &str, context: &str) {
    let bad = text.chars().find(|c| c.is_control() && *c != '\n');
    assert!(
        bad.is_none(),
        "{what} has the control character {bad:?}: {context}"
    );
    for line in text.lines().filter(|_| what == "stderr") {
        assert!(
            line.starts_with("lockrun: "),
            "a forged or foreign line {line:?}: {context}"
        );
    }
    for bad in ["panicked", "RUST_BACKTRACE"] {
        assert!(!text.contains(bad), "{context}");
    }
}

#[test]
fn hostile_stored_holders_never_panic_or_forge_a_line() {
    let (seed, _) = settings();
    let redis = RedisServer::start();
    let mut rng = Rng(seed ^ 0x401D_E125);
    let mut held = 0;
    for case in 0..24 {
        let name = format!("h{case}");
        let key = lock_key(&name);
        let fields = hostile_record(&mut rng, case);
        let _: i64 = redis.query(redis::cmd("HSET").arg(&key).arg(&fields));
        let _: i64 = redis.query(redis::cmd("PEXPIRE").arg(&key).arg(60_000));
        let context = format!("case {case}: HSET {key} {fields:?}");
        let url = redis.url();
        let commands: [(&[&str], &[i32]); 4] = [
            (&["status", &name], &[0, 1, 125]),
            (&["status", "--json", &name], &[0, 1, 125]),
            (&[&name, "--", "true"], &[75, 125]),
            (&["release", "--force", &name], &[0, 125]),
        ];
        for (args, allowed) in commands {
            let mut cmd = lockrun();
            cmd.env("LOCKRUN_URL", &url).args(args);
            let f = run(cmd);
            let context = format!("lockrun {args:?}: {context}\n{}{}", f.stdout, f.stderr);
            let code = f
                .code
                .unwrap_or_else(|| panic!("killed by a signal: {context}"));
            assert!(allowed.contains(&code), "status {code}: {context}");
            assert_printable("stdout", &f.stdout, &context);
            assert_printable("stderr", &f.stderr, &context);
            if args == ["status", &name] && code == 0 {
                held += 1;
            }
            if code == 125 {
                assert_eq!(f.stderr.lines().count(), 1, "not one line: {context}");
            }
        }
        let _: i64 = redis.query(redis::cmd("DEL").arg(&key));
    }
    // At least the first four cases, whose start times are numbers past the year 9999
    // (others may be refused as unreadable, which is right too).
    assert!(
        held >= 4,
        "only {held} records were read as held: the hostile values never reached the display"
    );
}
