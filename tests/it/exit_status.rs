//! The exit-status table (README, "Exit status"), one row (or one bad input) per test:
//! the command's own status, 128+N, 126, 127, and 125 for every way lockrun can fail
//! before the command starts. In every 125 case the command must not have started: it
//! would have created a marker file.

use std::os::unix::fs::PermissionsExt;

use crate::support::*;

/// A command that leaves a marker file behind if it ever runs.
const MARK: &str = r#"touch "$MARK""#;

/// Runs `lockrun ARGS...` whose command (if any) would touch a marker; asserts status 125
/// with a `lockrun: ` line, and that the command never ran.
fn assert_rejected(args: &[&str], envs: &[(&str, &str)]) -> Finished {
    let s = Scratch::new();
    let mut cmd = lockrun();
    cmd.args(args).env("MARK", s.path("marker"));
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let f = run(cmd);
    f.assert_failure(125);
    assert!(
        !s.exists("marker"),
        "the command ran although lockrun exited 125 (args {args:?})"
    );
    f
}

/// `--url URL OPTS... NAME -- sh -c 'touch "$MARK"'` as a list of arguments.
fn run_args<'a>(url: &'a str, opts: &[&'a str], name: &'a str) -> Vec<&'a str> {
    let mut v = vec!["--url", url];
    v.extend_from_slice(opts);
    v.extend_from_slice(&[name, "--", "sh", "-c", MARK]);
    v
}

#[test]
fn command_exit_status_is_passed_through() {
    let redis = RedisServer::start();
    run(lockrun_run(&redis.url(), "job", &[], &sh("exit 7"))).assert_code(7);
    run(lockrun_run(&redis.url(), "job", &[], &sh("exit 0"))).assert_code(0);
    assert!(
        !redis.lock_held("job"),
        "the lock is still held after the runs"
    );
}

#[test]
fn command_killed_by_its_own_signal_gives_128_plus_n() {
    let redis = RedisServer::start();
    let f = run(lockrun_run(&redis.url(), "job", &[], &sh("kill -USR1 $$")));
    f.assert_code(128 + 10);
    assert!(!redis.lock_held("job"));
}

#[test]
fn non_executable_file_gives_126() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let path = s.path("not-executable.sh");
    std::fs::write(&path, "#!/bin/sh\ntouch \"$MARK\"\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = lockrun_run(&redis.url(), "job", &[], &[path.to_str().unwrap()]);
    cmd.env("MARK", s.path("marker"));
    run(cmd).assert_failure(126);
    assert!(!s.exists("marker"));
    assert!(
        !redis.lock_held("job"),
        "the lock is still held after a 126"
    );
}

#[test]
fn directory_as_command_gives_126() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let dir = s.path("a-directory");
    std::fs::create_dir(&dir).unwrap();
    run(lockrun_run(
        &redis.url(),
        "job",
        &[],
        &[dir.to_str().unwrap()],
    ))
    .assert_failure(126);
    assert!(!redis.lock_held("job"));
}

#[test]
fn missing_command_on_path_gives_127() {
    let redis = RedisServer::start();
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &[],
        &["lockrun-test-no-such-command-4711"],
    ));
    f.assert_failure(127);
    assert!(
        !redis.lock_held("job"),
        "the lock is still held after a 127"
    );
}

#[test]
fn missing_command_path_gives_127() {
    let redis = RedisServer::start();
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &[],
        &["/nonexistent/lockrun-test/cmd"],
    ));
    f.assert_failure(127);
    assert!(!redis.lock_held("job"));
}

#[test]
fn name_with_bad_characters_is_rejected() {
    let redis = RedisServer::start();
    let url = redis.url();
    for name in ["a b", "job!", "jöb", "job{x}", "a*", "job\n", "$job"] {
        assert_rejected(&run_args(&url, &[], name), &[]);
        assert!(
            !redis.exists(&lock_key(name)),
            "a lock was taken for bad name {name:?}"
        );
    }
}

#[test]
fn name_of_201_bytes_is_rejected() {
    let redis = RedisServer::start();
    let name = "n".repeat(201);
    assert_rejected(&run_args(&redis.url(), &[], &name), &[]);
}

#[test]
fn empty_name_is_rejected() {
    let redis = RedisServer::start();
    assert_rejected(&run_args(&redis.url(), &[], ""), &[]);
}

#[test]
fn bad_duration_is_rejected() {
    let redis = RedisServer::start();
    let url = redis.url();
    for opts in [
        ["--ttl", "soon"],
        ["--ttl", "30 parsecs"],
        ["--ttl", "-5s"],
        ["--wait", "x"],
        ["--renew-every", "1 fortnightish"],
        ["--hold-at-least", "abc"],
        ["--kill-after", "1q"],
        ["--max-runtime", "forever"],
    ] {
        assert_rejected(&run_args(&url, &opts, "job"), &[]);
    }
}

#[test]
fn bad_duration_in_environment_is_rejected() {
    let redis = RedisServer::start();
    assert_rejected(
        &run_args(&redis.url(), &[], "job"),
        &[("LOCKRUN_TTL", "soon")],
    );
}

#[test]
fn renew_every_not_shorter_than_ttl_is_rejected() {
    let redis = RedisServer::start();
    let url = redis.url();
    assert_rejected(
        &run_args(&url, &["--ttl", "2s", "--renew-every", "2s"], "job"),
        &[],
    );
    assert_rejected(
        &run_args(&url, &["--ttl", "2s", "--renew-every", "3s"], "job"),
        &[],
    );
    // The default TTL is 30s.
    assert_rejected(&run_args(&url, &["--renew-every", "1m"], "job"), &[]);
}

#[test]
fn unknown_option_is_rejected() {
    let redis = RedisServer::start();
    assert_rejected(&run_args(&redis.url(), &["--frobnicate"], "job"), &[]);
}

#[test]
fn bad_option_values_are_rejected() {
    let redis = RedisServer::start();
    let url = redis.url();
    for opts in [
        ["--kill-signal", "NOSUCHSIG"],
        ["--conflict-exit-code", "abc"],
        ["--conflict-exit-code", "256"],
        ["--log-format", "xml"],
    ] {
        assert_rejected(&run_args(&url, &opts, "job"), &[]);
    }
}

#[test]
fn missing_command_is_rejected() {
    let redis = RedisServer::start();
    let url = redis.url();
    assert_rejected(&["--url", &url, "job"], &[]);
    assert_rejected(&["--url", &url, "job", "--"], &[]);
    assert!(!redis.lock_held("job"));
}

#[test]
fn missing_name_is_rejected() {
    assert_rejected(&[], &[]);
}

#[test]
fn unreachable_server_fails_closed() {
    let port = closed_port();
    let url = format!("redis://127.0.0.1:{port}");
    let f = assert_rejected(&run_args(&url, &[], "job"), &[]);
    assert!(
        f.elapsed < std::time::Duration::from_secs(15),
        "took {:?} to give up on a closed port",
        f.elapsed
    );
}

#[test]
fn unreachable_server_from_environment_fails_closed() {
    let url = format!("redis://127.0.0.1:{}", closed_port());
    assert_rejected(&["job", "--", "sh", "-c", MARK], &[("LOCKRUN_URL", &url)]);
}

#[test]
fn server_refusing_connections_fails_closed() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port());
    proxy.set_mode(Mode::Refuse);
    assert_rejected(&run_args(&proxy.url(), &[], "job"), &[]);
}

#[test]
fn blackholed_server_at_start_fails_closed() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port());
    proxy.set_mode(Mode::Blackhole);
    // Every backend call has a timeout shorter than the lease: with a 2s TTL lockrun must
    // give up long before the test's own deadline.
    assert_rejected(&run_args(&proxy.url(), &["--ttl", "2s"], "job"), &[]);
    assert!(!redis.lock_held("job"));
}

#[test]
fn bad_url_scheme_is_rejected() {
    for url in [
        "http://127.0.0.1:6379",
        "mysql://127.0.0.1:3306",
        "not a url",
        "redis://127.0.0.1:notaport",
        "",
    ] {
        assert_rejected(&run_args(url, &[], "job"), &[]);
    }
}

#[test]
fn wrong_password_fails_closed() {
    let redis = RedisServer::with_password("right-pw-3a9f");
    let url = format!("redis://:wrong-pw-77c1@127.0.0.1:{}", redis.port());
    let f = assert_rejected(&run_args(&url, &[], "job"), &[]);
    assert!(
        !f.stderr.contains("wrong-pw-77c1"),
        "the password appears on stderr:\n{}",
        f.stderr
    );
}

#[test]
fn missing_password_fails_closed() {
    let redis = RedisServer::with_password("right-pw-3a9f");
    assert_rejected(&run_args(&redis.url(), &[], "job"), &[]);
}

#[test]
fn good_input_runs_the_command() {
    // Sanity check for the helpers above: the same command line with a good URL runs the
    // command, so the 125s above are caused by the bad input alone.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut cmd = lockrun();
    cmd.args(run_args(&redis.url(), &[], "job"))
        .env("MARK", s.path("marker"));
    run(cmd).assert_code(0);
    assert!(s.exists("marker"));
}

#[test]
fn command_killed_from_outside_gives_128_plus_n() {
    // A signal lockrun did not send (here SIGKILL from someone else) is reported as 128+N,
    // not as 124.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut cmd = lockrun_run(&redis.url(), "job", &[], &sh(SLEEPER));
    cmd.env("PIDFILE", s.path("pid"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    signal_pid(pid, nix::sys::signal::Signal::SIGKILL);
    lr.wait().assert_code(128 + 9);
    assert!(!redis.lock_held("job"));
}
