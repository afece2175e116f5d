//! A hostile or broken ZooKeeper server (`support/fake_server.rs`): a frame without
//! end ends the run in one line naming the server, in bounded memory; a session grant
//! far above `--ttl` (2^31 - 1 ms: a crashed holder's lock for 24 days) is refused
//! before anything is created; a server that never answers ends a run when `--wait`
//! runs out.

use std::time::Duration;

use crate::support::*;

#[test]
fn an_endless_frame_is_refused_in_one_line_in_bounded_memory() {
    let server = FakeServer::start(Behaviour::ZkHuge);
    let url = format!("zk://127.0.0.1:{}", server.port());
    let says = ["sent a reply larger than 1 MiB"];
    assert_endless_reply_refused(&url, &server.addr(), &[], &says, Duration::from_secs(10));
}

#[test]
fn a_session_granted_far_longer_than_the_ttl_is_refused() {
    let server = FakeServer::start(Behaviour::ZkGrant(i32::MAX));
    let refusal = Refusal {
        what: "a session of 2^31 - 1 ms",
        url: format!("zk://127.0.0.1:{}", server.port()),
        env: vec![],
        says: vec!["granted a session timeout of", "--ttl 30s", "127.0.0.1:"],
        never: vec![],
    };
    refusal.check(&["--ttl", "30s"], Duration::from_secs(10), &[]);
}

#[test]
fn a_silent_server_ends_a_run_when_wait_runs_out() {
    let server = FakeServer::start(Behaviour::Silent);
    let url = format!("zk://127.0.0.1:{}", server.port());
    assert_silence_ends_with_wait(&url, &server.addr(), 3);
}
