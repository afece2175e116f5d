//! `--once-per` on etcd, which tells no time: each run with it grants a period lease
//! (8 days) holding its period key while it runs, and its success after the release;
//! the period is the lease's age by etcd's clock (docs/backends.md, etcd). Nothing is
//! left behind: a skipped or failed run's period lease is revoked, and a success
//! revokes the one of the success it replaces, so one period lease per name remains.

use std::time::Duration;

use crate::support::*;

/// A period lease's TTL: 8 days.
const PERIOD_TTL: i64 = 8 * 24 * 3600;

/// The leases alive with the TTL of a period lease (a week's records lease has 15
/// days, a holder's the `--ttl`), each with its keys.
fn period_leases(e: &EtcdServer) -> Vec<(u64, Vec<String>)> {
    e.leases()
        .into_iter()
        .filter(|id| (PERIOD_TTL - 3600..=PERIOD_TTL).contains(&e.lease_ttl(*id)))
        .map(|id| (id, e.lease_keys(id)))
        .collect()
}

fn run_job(e: &EtcdServer, opts: &[&str], code: i32) -> Finished {
    run(lockrun_run(
        &e.url(),
        "job",
        opts,
        &sh(&format!("exit {code}")),
    ))
}

#[test]
fn period_leases_are_given_back_and_the_last_success_keeps_one() {
    let e = EtcdServer::start();
    run_job(&e, &["--once-per", "1h"], 0).assert_code(0);
    let first = period_leases(&e);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(
        first[0].1,
        ["lockrun:{job}:ok"],
        "the success, no period key"
    );

    // Skipped: its lease is revoked with its period key.
    run_job(&e, &["--once-per", "1h"], 0).assert_code(75);
    assert_eq!(period_leases(&e), first);
    // A run without --once-per that fails leaves the success where it is.
    run_job(&e, &[], 3).assert_code(3);
    assert_eq!(period_leases(&e), first);

    std::thread::sleep(Duration::from_millis(2200));
    // Runs (2 s passed), fails: its lease is revoked.
    run_job(&e, &["--once-per", "2s"], 5).assert_code(5);
    assert_eq!(period_leases(&e), first);
    // Runs and succeeds: its lease keeps the success, the one before is revoked.
    run_job(&e, &["--once-per", "2s"], 0).assert_code(0);
    let second = period_leases(&e);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second[0].0, first[0].0);
    assert_eq!(second[0].1, ["lockrun:{job}:ok"]);
    assert_eq!(
        e.lease_ttl(first[0].0),
        -1,
        "the replaced success's lease is gone"
    );
    assert!(
        e.keys_with_prefix("lockrun:{job}:run#").is_empty(),
        "no period key is left"
    );
}

/// With `--slots 2`: a run holding a slot taken before ours, within D by its period
/// lease, may still succeed: ours is skipped; once it failed, the next one runs.
#[test]
fn an_earlier_slot_within_the_period_skips_until_it_fails() {
    let e = EtcdServer::start();
    let s = Scratch::new();
    let opts = ["--slots", "2", "--once-per", "1h"];
    let (mut first, _) = start_holder(&e.url(), "job", &s, &opts);
    let busy = run_job(&e, &opts, 0);
    busy.assert_code(75);
    assert!(
        busy.stderr.contains("still holding a slot"),
        "{}",
        busy.stderr
    );
    first.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(first.wait().code, Some(143));
    run_job(&e, &opts, 0).assert_code(0);
}
