//! The backend conformance suite: the contract of docs/guarantees.md written once as
//! tests and run against every backend (its own servers behind fault-injecting proxies,
//! see `support::backends`). A backend is done when it passes all of them; a new one
//! joins with one line at the bottom of this file. A backend with no server (the file
//! backend) joins the second list: the contract, and of the faults only the definite loss
//! (its lock broken by `release --force`); a server down, hung, killed or frozen means
//! nothing for it. A backend reached through a hop of its own in front of a backend of
//! the first list (PostgreSQL through PgBouncer, etcd over TLS) joins the third: the
//! contract tests that hop can change, and every fault test.
//!
//! - `contract`: running, exclusion, busy and waiting, hand-off, crashes, renewal,
//!   `--hold-at-least`, fencing, `status` and `release --force`, ownership, two
//!   (prefix, name) pairs spelling one `PREFIX + NAME` being two locks, no lease
//!   longer than a day, failing closed;
//! - `containment`: a SIGKILLed holder's job (a child in a session of its own, one
//!   ignoring SIGTERM) is gone before the next holder's command starts (property 10);
//! - `semaphore`: `--slots N` (property 9): at most N inside on distinct slots with
//!   tokens that increase, busy, `status` and `release --force` over every slot, another
//!   N refused, a crashed holder's slot freed when its lease ends, waiters in order;
//! - `faults`: a definite loss, the backend down, hung, killed or frozen while a command
//!   holds the lock: the command is dead before the lease can have expired, and the lock
//!   works again, with larger tokens, once the fault is over.
//!
//! Deadlines in the fault tests count from instants the test observed *before* the
//! fault: lockrun's last successful renewal was sent before then, so the lease it
//! enforces ended at most TTL later. Waits for things to happen are generous; safety
//! assertions are strict.

mod containment;
mod contract;
mod faults;
mod records;
mod semaphore;

use std::time::Duration;

use crate::support::*;

/// The lease used by these tests: whole seconds, because etcd's TTLs are.
const TTL: Duration = Duration::from_secs(2);
const TTL_ARG: &str = "2s";

/// How a contract test gets its backend: it calls this first (after `alone()`, if it
/// runs alone).
type Start = fn() -> Backend;

/// Starts a lockrun holding `name` until the scratch file "go" exists; returns it and its
/// fencing token once its command runs.
fn holder(b: &Backend, name: &str, s: &Scratch, opts: &[&str]) -> (Running, u128) {
    hold(b.run(name, opts, &sh(HOLD)), s)
}

/// Runs one command on "job" with `opts` and returns the fencing token it was given.
fn token_of(b: &Backend, opts: &[&str]) -> u128 {
    let f = run(b.run("job", opts, &sh(r#"echo "$LOCKRUN_FENCING_TOKEN""#)));
    parse_token(f.assert_code(0).stdout.trim())
}

/// Every contract test, each run by [`contract_test`] for one backend.
macro_rules! contract_tests {
    ($start:expr) => {
        contract_test!(
            $start,
            contract::command_gets_its_token_and_name_and_its_status
        );
        contract_test!($start, contract::exclusive_under_contention);
        contract_test!(
            $start,
            contract::busy_lock_exits_75_without_running_the_command
        );
        contract_test!($start, contract::wait_that_runs_out_exits_75);
        contract_test!($start, contract::waiter_starts_soon_after_release);
        contract_test!($start, contract::waiter_takes_over_a_crashed_holders_lock);
        contract_test!($start, contract::renewal_keeps_a_long_command_alive);
        contract_test!(
            $start,
            contract::hold_at_least_keeps_the_lock_then_lets_it_go
        );
        contract_test!($start, contract::fencing_tokens_increase);
        contract_test!($start, contract::status_and_forced_release);
        contract_test!($start, contract::release_never_removes_another_owners_lock);
        contract_test!(
            $start,
            contract::two_prefix_and_name_pairs_that_spell_alike_are_two_locks
        );
        contract_test!(
            $start,
            contract::a_lease_longer_than_a_day_is_refused_and_leaves_no_lock
        );
        contract_test!($start, contract::unreachable_backend_fails_closed);
        contract_test!($start, records::records_list_and_once_per);
        contract_test!(
            $start,
            containment::next_holder_starts_after_the_killed_holders_job_is_gone
        );
        contract_test!($start, faults::definite_loss_stops_the_command);
        contract_test!(
            $start,
            semaphore::semaphore_admits_at_most_n_on_distinct_slots
        );
        contract_test!($start, semaphore::semaphore_busy_status_and_forced_release);
        contract_test!($start, semaphore::semaphore_refuses_a_different_slot_count);
        contract_test!(
            $start,
            semaphore::semaphore_crashed_holders_slot_frees_when_its_lease_ends
        );
        contract_test!($start, semaphore::semaphore_waiters_are_served_in_order);
    };
}

/// Every fault test of a backend's servers, each run by [`contract_test`].
macro_rules! server_fault_tests {
    ($start:expr) => {
        contract_test!($start, faults::backend_down_kills_before_the_lease_expires);
        contract_test!($start, faults::backend_hung_kills_before_the_lease_expires);
        contract_test!($start, faults::server_killed_kills_before_the_lease_expires);
        contract_test!($start, faults::server_frozen_kills_before_the_lease_expires);
    };
}

/// The contract tests that a pooler or TLS between lockrun and the server can change:
/// the way in, exclusion and ownership through another hop, waits that PgBouncer's
/// transaction pool wakes by polling (no `LISTEN`) and etcd wakes by a watch over TLS,
/// renewals (each through another pooled connection, or a keep-alive stream over TLS),
/// a definite loss, and a way in that fails. The rest (argument checks, status, key
/// layout, the lease's own arithmetic) is the same SQL or the same etcd requests as the
/// backend without the hop, tested there. Each run by [`contract_test`].
macro_rules! transport_tests {
    ($start:expr) => {
        contract_test!(
            $start,
            contract::command_gets_its_token_and_name_and_its_status
        );
        contract_test!($start, contract::exclusive_under_contention);
        contract_test!($start, contract::wait_that_runs_out_exits_75);
        contract_test!($start, contract::waiter_starts_soon_after_release);
        contract_test!($start, contract::waiter_takes_over_a_crashed_holders_lock);
        contract_test!($start, contract::renewal_keeps_a_long_command_alive);
        contract_test!($start, contract::release_never_removes_another_owners_lock);
        contract_test!($start, contract::unreachable_backend_fails_closed);
        contract_test!($start, faults::definite_loss_stops_the_command);
        contract_test!($start, semaphore::semaphore_waiters_are_served_in_order);
    };
}

/// One contract test for one backend.
macro_rules! contract_test {
    ($start:expr, $module:ident :: $test:ident) => {
        #[test]
        fn $test() {
            super::$module::$test(|| Backend::new($start))
        }
    };
}

/// Every contract test for each backend, in a module named after it; after
/// `no server:`, without the fault tests of servers; after `through:`, a backend reached
/// through a pooler or over TLS, whose plain form is in the first list: the tests that
/// hop can change, and every fault test.
macro_rules! conformance {
    (through: $($backend:ident => $start:expr;)*) => {$(
        mod $backend {
            use super::*;

            transport_tests!($start);
            server_fault_tests!($start);
        }
    )*};
    (no server: $($backend:ident => $start:expr;)*) => {$(
        mod $backend {
            use super::*;

            contract_tests!($start);
        }
    )*};
    ($($backend:ident => $start:expr;)*) => {$(
        mod $backend {
            use super::*;

            contract_tests!($start);
            server_fault_tests!($start);
        }
    )*};
}

conformance! {
    redis => RedisServer::start();
    redlock => Quorum::start();
    sentinel => SentinelService::start();
    postgres => Postgres::start();
    etcd => EtcdServer::start();
    zookeeper => ZkServer::start();
    mysql => Mysql::start();
}

conformance! {
    through:
    pgbouncer => PgBouncerService::start();
    etcd_tls => EtcdTls::start();
}

conformance! {
    no server:
    file => FileService::start();
}
