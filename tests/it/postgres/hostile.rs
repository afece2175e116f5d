//! A hostile or broken PostgreSQL server (`support/fake_server.rs`): notices without
//! end after the start-up (the default `sslmode=prefer`, refused TLS, so anyone in the
//! middle can send them) end the run in one line naming the server, in bounded memory;
//! a server that never answers ends a run when `--wait` runs out.

use std::time::Duration;

use crate::support::*;

#[test]
fn endless_notices_are_refused_in_one_line_in_bounded_memory() {
    let server = FakeServer::start(Behaviour::PgNotices);
    let url = format!("postgres://lockrun@127.0.0.1:{}/db", server.port());
    let says = ["sent a reply larger than 1 MiB"];
    assert_endless_reply_refused(&url, &server.addr(), &[], &says, Duration::from_secs(10));
}

#[test]
fn a_silent_server_ends_a_run_when_wait_runs_out() {
    let server = FakeServer::start(Behaviour::Silent);
    let url = format!("postgres://lockrun@127.0.0.1:{}/db", server.port());
    assert_silence_ends_with_wait(&url, &server.addr(), 3);
}
