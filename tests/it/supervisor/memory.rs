//! Once the command has run a while, lockrun and its guard give back the pages of the
//! program that start-up mapped (`src/supervisor/trim.rs`): a lock held for long costs
//! little memory. Before that change each of them kept megabytes of the binary's code
//! mapped for as long as the command ran.

use std::fs;

use crate::support::*;

/// The lockrun binary's code (its executable mappings) in `pid`'s memory, from
/// `/proc/PID/smaps`: (KiB resident, KiB mapped).
fn code_kib(pid: i32) -> (u64, u64) {
    let binary = fs::canonicalize(lockrun_binary()).expect("the lockrun binary");
    let binary = binary.to_str().expect("a UTF-8 path");
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut ours = false;
    let (mut rss, mut size) = (0, 0);
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let kib = || fields[1].parse::<u64>().expect("a size in KiB");
        match fields.first() {
            Some(f) if f.contains('-') && !f.ends_with(':') => {
                ours = fields.get(1) == Some(&"r-xp") && fields.last() == Some(&binary);
            }
            Some(&"Rss:") if ours => rss += kib(),
            Some(&"Size:") if ours => size += kib(),
            _ => {}
        }
    }
    (rss, size)
}

#[test]
fn a_held_lock_gives_back_the_programs_code() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);
    let guard = wait_guard(holder.pid());
    // Start-up leaves most of the code mapped in each (the kernel maps 64 KiB around
    // each page first used): measured 44% to 87% of it in a debug and a release build.
    // What an idle holder and its guard use again is at most a fifth.
    let mut seen = Vec::new();
    wait_until(
        "lockrun and its guard kept a third of their code at most",
        WAIT,
        || {
            seen = vec![code_kib(holder.pid()), code_kib(guard)];
            seen.iter().all(|&(rss, size)| size > 0 && rss * 3 < size)
        },
    );
    assert!(holder.is_running(), "the run ended before the check");
    // And it runs on as before: the command ends, the lock is released.
    s.touch("go");
    holder.wait().assert_code(0);
    run(lockrun_run(&redis.url(), "job", &[], &["true"])).assert_code(0);
}
