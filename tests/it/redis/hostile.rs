//! A hostile or broken Redis server (`support/fake_server.rs`): a reply without end
//! ends the run in one line naming the server, in bounded memory, whether it comes
//! fast or drips; a server that never answers ends a run when `--wait` runs out, and
//! without `--wait` within the request timeout the line states.

use std::time::Duration;

use crate::support::*;

#[test]
fn an_endless_reply_is_refused_in_one_line_in_bounded_memory() {
    let server = FakeServer::start(Behaviour::RedisHuge);
    let url = format!("redis://127.0.0.1:{}", server.port());
    let says = ["sent a reply larger than 1 MiB"];
    assert_endless_reply_refused(&url, &server.addr(), &[], &says, Duration::from_secs(10));
}

#[test]
fn an_endless_reply_to_a_redlock_server_is_refused_too() {
    // Three of five, all read at once: no quorum without them, and the memory of the
    // three replies together stays bounded.
    let server = FakeServer::start(Behaviour::RedisHuge);
    let others = [0, 1].map(|_| FakeServer::start(Behaviour::RedisHuge));
    let good = [0, 1].map(|_| RedisServer::start());
    let url = format!("redis://127.0.0.1:{}", server.port());
    let says = ["sent a reply larger than 1 MiB"];
    let mut urls: Vec<String> = others
        .iter()
        .map(|o| format!("redis://127.0.0.1:{}", o.port()))
        .collect();
    urls.extend(good.iter().map(|g| g.url()));
    let opts: Vec<&str> = urls.iter().flat_map(|u| ["--url", u.as_str()]).collect();
    assert_endless_reply_refused(&url, &server.addr(), &opts, &says, Duration::from_secs(10));
}

#[test]
fn a_dripping_reply_ends_within_the_request_timeout() {
    let server = FakeServer::start(Behaviour::Drip);
    let url = format!("redis://127.0.0.1:{}", server.port());
    let says = ["did not answer within 3s"];
    let opts = ["--wait", "3s"];
    assert_endless_reply_refused(&url, &server.addr(), &opts, &says, Duration::from_secs(6));
}

#[test]
fn a_silent_server_ends_a_run_when_wait_runs_out() {
    let server = FakeServer::start(Behaviour::Silent);
    let url = format!("redis://127.0.0.1:{}", server.port());
    assert_silence_ends_with_wait(&url, &server.addr(), 3);
}

#[test]
fn a_silent_server_ends_a_run_without_wait_within_the_time_it_states() {
    let server = FakeServer::start(Behaviour::Silent);
    let url = format!("redis://127.0.0.1:{}", server.port());
    let f = run(lockrun_run(&url, "job", &[], &["true"]));
    f.assert_failure(125);
    assert!(
        f.stderr.contains("did not answer within 5s"),
        "the default request timeout (a third of the 30 s TTL, at most 5 s):\n{}",
        f.stderr
    );
    // 5 s, the give-back (1 s at most), and a margin for starting the process.
    assert!(f.elapsed < Duration::from_millis(7500), "{:?}", f.elapsed);
}

#[test]
fn a_reply_of_no_protocol_is_one_line() {
    let server = FakeServer::start(Behaviour::Garbage);
    let url = format!("redis://127.0.0.1:{}", server.port());
    let f = run(lockrun_run(&url, "job", &[], &["true"]));
    f.assert_failure(125);
    assert_eq!(f.stderr.lines().count(), 1, "{}", f.stderr);
    assert!(f.stderr.contains(&server.addr()), "{}", f.stderr);
}
