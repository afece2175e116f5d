//! Shared support for lockrun's integration tests, split by concern:
//!
//! - `process`: running the real `lockrun` binary, waiting for it, looking at processes
//!   through `/proc`; `scratch`: a temporary directory for marker, pid and history files;
//! - servers of the test's own on free ports: `redis` (plain, password, TLS, ACL users),
//!   `sentinel` (master, replica and Sentinel), `cluster` (a Redis Cluster of 3 masters
//!   and 3 replicas), `etcd`, `pg` (private PostgreSQL clusters, and a fresh lock table
//!   in one), `pgbouncer` (PgBouncer in front of one, in each pool mode), `mysql` (a
//!   private MariaDB); `tls` makes
//!   their certificates;
//! - `fake_server`: a hostile or broken server (silence, garbage, replies without end,
//!   a ZooKeeper session grant of the test's choosing), and lockrun's peak memory;
//! - `proxy`: the fault-injecting TCP proxy (pass, blackhole, cut, refuse, latency, held
//!   back requests, traffic watching); `clock`: the boot clock and a fake wall clock;
//! - `backends`: every backend behind one interface, for the conformance suite (the
//!   file backend too, with no server: a temporary directory);
//! - `history`: the one mutual-exclusion and fencing checker; `run_records`: a run's
//!   token and how `status` shows its record;
//! - `ping`: a recording HTTP(S) server and a CONNECT proxy for `--ping`;
//! - `serial`: which tests may run side by side; `ready`: a server is ready when it
//!   answers, not when its log says so; `freezer`: a process frozen as a paused
//!   virtual machine leaves it (SIGSTOP no longer does: lockrun is continued at its
//!   lease deadline).
//!
//! Rules every helper keeps, so that tests can run in parallel on a small noisy machine:
//! - every test gets its own servers (never the machine's Redis on 6379 or PostgreSQL on 5432);
//! - every process started here is killed by a `Drop` guard, even when a test panics;
//! - every wait checks a condition and panics with a clear message after a deadline;
//! - the environment given to lockrun has no `LOCKRUN_*` variable unless the test sets it.

mod backends;
mod clock;
mod cluster;
mod etcd;
mod fake_server;
mod freezer;
mod history;
mod job;
mod mysql;
mod nutcracker;
mod pg;
mod pgbouncer;
mod ping;
mod process;
mod proxy;
mod ready;
mod redis;
mod refusal;
mod run_records;
mod scratch;
mod sentinel;
mod serial;
mod tls;
mod zookeeper;

use std::net::TcpListener;
use std::time::Duration;

pub use backends::{
    Backend, EtcdTls, FileService, Mysql, PgBouncerService, Postgres, Quorum, SentinelService,
    Service,
};
pub use clock::{boottime, FakeClock};
pub use cluster::RedisCluster;
pub use etcd::{etcd_key, etcd_slot_key, EtcdServer};
pub use fake_server::{
    assert_endless_reply_refused, assert_silence_ends_with_wait, Behaviour, FakeServer,
};
pub use freezer::Frozen;
pub use history::{
    crowded, most_inside, overlaps, reused_tokens, slot_overlaps, Sections, SlotSections, SlotSpan,
    Span,
};
pub use job::*;
pub use mysql::PrivateMysql;
pub use nutcracker::Nutcracker;
pub use pg::{Db, PrivatePg, Table};
pub use pgbouncer::{PgBouncer, Pool};
pub use ping::{Answer, ConnectProxy, PingRequest, PingServer};
pub use process::*;
pub use proxy::{Mode, Proxy, Watch, Watcher};
pub use redis::{
    acquire_keys, fence_key, limit_key, lock_key, release_keys, slot_key, waiter_key, RedisServer,
};
pub use refusal::Refusal;
pub use run_records::{assert_last_run, last_run_line, recording, run_recorded, status_json};
pub use scratch::{wait_line, wait_pid, Scratch};
pub use sentinel::{Security, Sentinel};
pub use serial::alone;
pub use tls::{TestCa, TlsFiles};
pub use zookeeper::{ZkEnsemble, ZkExtras, ZkServer};

/// Upper bound for waits that should finish in well under a second on an idle machine.
pub const WAIT: Duration = Duration::from_secs(20);

/// How often waiting loops look at their condition.
pub const POLL: Duration = Duration::from_millis(5);

/// A port on 127.0.0.1 that was free a moment ago, and that no other test of this run
/// was given before (see [`listen_on_a_new_port`]).
pub fn free_port() -> u16 {
    listen_on_a_new_port().local_addr().unwrap().port()
}

/// A listener on 127.0.0.1, on a port that no other test of this run was given before
/// (by this or [`free_port`]): a test's server killed or stopped, or its proxy dropped,
/// frees its port, and a lockrun of that test still retrying it must never reach the
/// server of a later test there (it would take or queue for that test's lock: "held
/// with --slots 3" in a plain lock's test, seen once with 8 tests side by side).
pub fn listen_on_a_new_port() -> TcpListener {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("bound address").port();
        if !given.contains(&port) {
            given.push(port);
            return listener;
        }
    }
}

/// A port on which nothing listens (connections are refused).
pub fn closed_port() -> u16 {
    free_port()
}
