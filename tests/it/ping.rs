//! `--ping URL`: the run that holds the lock pings `URL/start?rid=RID` as its command
//! starts and `URL/STATUS?rid=RID` when it ends, with a JSON body; busy runs ping
//! nothing; a ping never delays the command, never changes the exit status, gives up
//! within about 10 s of the command's end (after the release), and a failure is one
//! warning line without the URL's path or password. Against servers of the test's own
//! (`support/ping.rs`): plain HTTP, TLS with a throw-away CA, one that never answers, a
//! refused port, a CONNECT proxy.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

/// The proxy variables of the developer's environment, which a test must not inherit.
const PROXY_VARS: [&str; 8] = [
    "http_proxy",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
    "HTTP_PROXY",
];

/// A run of `command` on a file lock `name` with `--ping url` and `opts`.
fn pinging(f: &FileService, url: &str, opts: &[&str], command: &[&str]) -> Command {
    let mut all = vec!["--ping", url];
    all.extend_from_slice(opts);
    let mut cmd = lockrun_run(&f.lock_url(), "job", &all, command);
    for var in PROXY_VARS {
        cmd.env_remove(var);
    }
    cmd
}

/// The `ping_failed` lines of a run's stderr.
fn ping_failures(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("could not ping"))
        .collect()
}

/// Checks a run's two pings: start then `status`, one rid (a UUID v4), the JSON bodies.
fn assert_pinged(reqs: &[PingRequest], path: &str, status: u8) {
    assert_eq!(reqs.len(), 2, "two pings: {reqs:#?}");
    let (start, end) = (&reqs[0], &reqs[1]);
    let rid = start.rid();
    assert_eq!(rid.len(), 36, "a UUID: {rid}");
    assert_eq!(&rid[14..15], "4", "a UUID v4: {rid}");
    assert_eq!(start.target, format!("{path}/start?rid={rid}"));
    assert_eq!(end.target, format!("{path}/{status}?rid={rid}"));
    for r in reqs {
        assert_eq!(r.method, "POST");
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.body["lock"], "job");
        assert_eq!(r.body["host"], hostname().as_str());
        assert!(
            r.body["fencing_token"].as_u64().unwrap() > 0,
            "{:?}",
            r.body
        );
        assert_eq!(r.body["slot"], 0);
    }
    assert_eq!(start.body.get("exit_status"), None);
    assert_eq!(end.body["exit_status"], status);
    assert!(end.body["duration_ms"].is_u64(), "{:?}", end.body);
    assert_eq!(start.body["fencing_token"], end.body["fencing_token"]);
}

/// Exit 0 and 3: start, then the command's status, with one rid and the run's body; a
/// second run has another rid. LOCKRUN_PING works and the command does not see it.
#[test]
fn start_and_end_carry_the_exit_status_and_one_rid() {
    let f = FileService::start();
    for code in [0u8, 3] {
        let server = PingServer::start(Answer::Ok);
        let url = format!("http://127.0.0.1:{}/ping/k3y/", server.port());
        let script = format!("sleep 0.3; exit {code}");
        let done = run(pinging(&f, &url, &[], &sh(&script)));
        done.assert_code(i32::from(code));
        assert!(done.stderr.is_empty(), "no line: {}", done.stderr);
        // The answer was read before lockrun ended.
        let reqs = server.requests();
        assert_pinged(&reqs, "/ping/k3y", code);
        let took = reqs[1].body["duration_ms"].as_u64().unwrap();
        assert!((300..10_000).contains(&took), "duration_ms {took}");
    }
    let server = PingServer::start(Answer::Ok);
    let url = format!("http://127.0.0.1:{}/x", server.port());
    let mut cmd = lockrun_run(
        &f.lock_url(),
        "job",
        &[],
        &sh(r#"test -z "${LOCKRUN_PING+set}""#),
    );
    cmd.env("LOCKRUN_PING", &url);
    for var in PROXY_VARS {
        cmd.env_remove(var);
    }
    run(cmd).assert_code(0);
    let reqs = server.requests();
    assert_pinged(&reqs, "/x", 0);
}

/// `--max-runtime` stops the command: the end ping says 124.
#[test]
fn a_stopped_command_pings_124() {
    let f = FileService::start();
    let server = PingServer::start(Answer::Ok);
    let url = format!("http://127.0.0.1:{}/m", server.port());
    let done = run(pinging(
        &f,
        &url,
        &["--max-runtime", "1s"],
        &["sleep", "60"],
    ));
    done.assert_code(124);
    assert_pinged(&server.requests(), "/m", 124);
}

/// A busy run (75) pings nothing: the holder's two pings are all the server gets,
/// though the busy run ended before the holder's end ping.
#[test]
fn a_busy_run_pings_nothing() {
    let f = FileService::start();
    let s = Scratch::new();
    let server = PingServer::start(Answer::Ok);
    let url = format!("http://127.0.0.1:{}/b", server.port());
    let (mut holder, _) = hold(pinging(&f, &url, &[], &sh(HOLD)), &s);
    server.wait_requests(1);
    run(pinging(&f, &url, &[], &["true"])).assert_code(75);
    s.touch("go");
    holder.wait_for(WAIT).assert_code(0);
    // Connections are accepted in order: the busy run's would have come first.
    assert_eq!(server.accepted(), 2, "{:#?}", server.requests());
    assert_pinged(&server.requests(), "/b", 0);
}

/// A run skipped by `--once-per` (the last run within the period succeeded) pings
/// nothing: the first run's two pings are all the server gets.
#[test]
fn a_run_skipped_by_once_per_pings_nothing() {
    let f = FileService::start();
    let server = PingServer::start(Answer::Ok);
    let url = format!("http://127.0.0.1:{}/o", server.port());
    run(pinging(&f, &url, &["--once-per", "1h"], &["true"])).assert_code(0);
    let skipped = run(pinging(&f, &url, &["--once-per", "1h"], &["true"]));
    skipped.assert_code(75);
    // A third run, without --once-per, pings again: the skipped run's connection,
    // had there been one, was accepted before its.
    run(pinging(&f, &url, &[], &sh("exit 3"))).assert_code(3);
    let reqs = server.requests();
    assert_eq!(server.accepted(), 4, "{reqs:#?}");
    assert_pinged(&reqs[..2], "/o", 0);
    assert_pinged(&reqs[2..], "/o", 3);
}

/// Over TLS, with the test's CA in LOCKRUN_TLS_CA: both pings. Without it, the
/// certificate is refused: one warning line per ping, exit status unchanged.
#[test]
fn pings_over_tls_trust_the_ca_of_lockrun_tls_ca() {
    let tls = TlsFiles::generate(false);
    let f = FileService::start();
    let server = PingServer::start_tls(&tls);
    let url = format!("https://127.0.0.1:{}/t/uuid", server.port());
    let mut cmd = pinging(&f, &url, &[], &["true"]);
    cmd.env("LOCKRUN_TLS_CA", tls.path("ca.pem"));
    run(cmd).assert_code(0);
    assert_pinged(&server.requests(), "/t/uuid", 0);
    let done = run(pinging(&f, &url, &[], &sh("exit 3")));
    done.assert_code(3);
    let lines = ping_failures(&done.stderr);
    assert_eq!(lines.len(), 2, "{}", done.stderr);
    for l in lines {
        assert!(l.contains("certificate"), "{l}");
        assert!(!l.contains("/t/uuid"), "{l}");
    }
    assert_eq!(
        server.requests().len(),
        2,
        "no request without a trusted certificate"
    );
}

/// A server that accepts and never answers: the command starts at once, the lock is
/// released while lockrun still waits on the ping (a second run takes it), and lockrun
/// ends within 10 s (plus a margin) of the command's end, with its exit status.
#[test]
fn a_silent_server_delays_nothing_but_the_exit() {
    let f = FileService::start();
    let s = Scratch::new();
    let server = PingServer::start(Answer::Never);
    let url = format!("http://127.0.0.1:{}/s", server.port());
    let mut cmd = pinging(&f, &url, &[], &sh(r#"touch "$M"; sleep 0.5; exit 3"#));
    cmd.env("M", s.path("started"));
    let mut lr = spawn(cmd);
    let spawned = Instant::now();
    wait_until("the command starts", WAIT, || s.exists("started"));
    let started = spawned.elapsed();
    assert!(
        started < Duration::from_secs(5),
        "the command started after {started:?}"
    );
    wait_until("the start ping's connection", WAIT, || {
        server.accepted() >= 1
    });
    // The command has ended (0.5 s) and the release is done when a second run gets in.
    let second = Instant::now();
    let mut got_in = false;
    while second.elapsed() < Duration::from_secs(8) && !got_in {
        got_in = run(lockrun_run(&f.lock_url(), "job", &[], &["true"])).code == Some(0);
    }
    assert!(
        got_in,
        "a second run got the lock while the first waited on its ping"
    );
    assert!(
        lr.is_running(),
        "lockrun waits on its ping (else the check proves nothing)"
    );
    let done = lr.wait_for(Duration::from_secs(30));
    done.assert_code(3);
    // The command ended about 0.5 s after it started; lockrun ends at most 10 s later.
    let after_command = done
        .elapsed
        .saturating_sub(started + Duration::from_millis(500));
    assert!(
        after_command < Duration::from_secs(13),
        "lockrun ended {after_command:?} after its command"
    );
    let lines = ping_failures(&done.stderr);
    assert!(!lines.is_empty() && lines.len() <= 2, "{}", done.stderr);
    assert!(
        lines.iter().all(|l| l.contains("no answer within 10s")),
        "{}",
        done.stderr
    );
}

/// A refused port: one warning line per ping (start, end), naming only
/// scheme://host:port/ (no password, no path), and the exit status unchanged.
#[test]
fn a_refused_port_is_a_warning_without_credentials() {
    let f = FileService::start();
    let port = closed_port();
    let url = format!("http://hc:s3cretpw@127.0.0.1:{port}/ping/s3cret-uuid");
    let done = run(pinging(&f, &url, &[], &sh("exit 3")));
    done.assert_code(3);
    assert_eq!(done.stderr.lines().count(), 2, "{}", done.stderr);
    let lines = ping_failures(&done.stderr);
    assert_eq!(lines.len(), 2, "{}", done.stderr);
    for l in lines {
        assert!(l.contains(&format!("http://127.0.0.1:{port}/ ")), "{l}");
        assert!(l.contains("refused"), "{l}");
        for secret in ["s3cretpw", "s3cret-uuid", "hc:"] {
            assert!(!l.contains(secret), "{secret} in {l}");
        }
    }
}

/// https_proxy: the pings go through the proxy with CONNECT (and its credentials),
/// TLS inside the tunnel; http_proxy: absolute form.
#[test]
fn pings_go_through_the_proxy_of_the_environment() {
    let tls = TlsFiles::generate(false);
    let f = FileService::start();
    let server = PingServer::start_tls(&tls);
    let proxy = ConnectProxy::start();
    let url = format!("https://127.0.0.1:{}/p", server.port());
    let mut cmd = pinging(&f, &url, &[], &["true"]);
    cmd.env("LOCKRUN_TLS_CA", tls.path("ca.pem")).env(
        "https_proxy",
        format!("http://pu:pp@127.0.0.1:{}", proxy.port()),
    );
    let done = run(cmd);
    done.assert_code(0);
    assert!(done.stderr.is_empty(), "{}", done.stderr);
    assert_pinged(&server.requests(), "/p", 0);
    let heads = proxy.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    for h in heads {
        let to = format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n", server.port());
        assert!(h.starts_with(&to), "{h}");
        assert!(h.contains("Proxy-Authorization: Basic cHU6cHA=\r\n"), "{h}");
    }
    // http_proxy: the recording server plays the proxy; the target is absolute.
    let proxy = PingServer::start(Answer::Ok);
    let port = closed_port();
    let mut cmd = pinging(&f, &format!("http://127.0.0.1:{port}/h"), &[], &["true"]);
    cmd.env("http_proxy", format!("127.0.0.1:{}", proxy.port()));
    run(cmd).assert_code(0);
    let reqs = proxy.requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    let prefix = format!("http://127.0.0.1:{port}/h/");
    assert!(
        reqs.iter().all(|r| r.target.starts_with(&prefix)),
        "{reqs:#?}"
    );
}

/// A URL lockrun cannot ping is refused at start: 125, one line that does not quote
/// it, the command not started.
#[test]
fn a_bad_url_is_refused_before_anything_starts() {
    let f = FileService::start();
    let s = Scratch::new();
    for url in [
        "ftp://hc:s3cret@host/x",
        "hc-ping.com/s3cret",
        "http://host:0/s3cret",
    ] {
        let mut cmd = pinging(&f, url, &[], &sh(r#"touch "$M""#));
        cmd.env("M", s.path("ran"));
        run(cmd).assert_refused_in_one_line(url, WAIT, &["--ping"], &["s3cret"]);
        assert!(!s.exists("ran"), "{url}: the command ran");
    }
}

/// A signal while lockrun waits on its end ping ends the wait at once, the exit status
/// the command's, with one line saying the ping was not sent.
#[test]
fn a_signal_ends_the_wait_for_the_end_ping() {
    let f = FileService::start();
    let server = PingServer::start(Answer::Never);
    let url = format!("http://127.0.0.1:{}/sig", server.port());
    let mut lr = spawn(pinging(&f, &url, &[], &sh("exit 3")));
    wait_until("the start ping's connection", WAIT, || {
        server.accepted() >= 1
    });
    // Once the lock is free again, lockrun is past its release, waiting on the pings.
    wait_until("the release", WAIT, || {
        run(lockrun_run(&f.lock_url(), "job", &[], &["true"])).code == Some(0)
    });
    assert!(
        lr.is_running(),
        "lockrun waits on its ping (else the check proves nothing)"
    );
    lr.signal(nix::sys::signal::Signal::SIGTERM);
    let sent = Instant::now();
    let done = lr.wait_for(Duration::from_secs(30));
    let took = sent.elapsed();
    done.assert_code(3);
    assert!(
        took < Duration::from_secs(3),
        "lockrun ended {took:?} after SIGTERM"
    );
    let lines = ping_failures(&done.stderr);
    assert!(lines.is_empty(), "{}", done.stderr);
    assert!(
        done.stderr
            .lines()
            .any(|l| l.contains("did not ping") && l.contains("signal")),
        "{}",
        done.stderr
    );
}
