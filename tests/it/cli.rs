//! The command line: `--help`/`--version`, the default and explicit `run` subcommand, the
//! lock-name rules, options read from `LOCKRUN_*` variables, quiet and JSON logs, and the
//! command line of `status` and `release` (what they do, for every backend, is in the
//! conformance suite).

use crate::support::*;

#[test]
fn help_and_version_exit_0() {
    let mut cmd = lockrun();
    cmd.arg("--help");
    run(cmd).assert_code(0);
    let mut cmd = lockrun();
    cmd.args(["run", "--help"]);
    let f = run(cmd);
    f.assert_code(0);
    for option in ["--ttl", "--wait", "--renew-every", "--password-file"] {
        assert!(
            f.stdout.contains(option),
            "run --help does not list {option}:\n{}",
            f.stdout
        );
    }
    let mut cmd = lockrun();
    cmd.arg("--version");
    let f = run(cmd);
    f.assert_code(0);
    assert!(
        f.stdout.contains(env!("CARGO_PKG_VERSION")),
        "--version prints {:?}",
        f.stdout
    );
}

#[test]
fn explicit_run_subcommand_locks_a_name_like_a_subcommand() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    for name in ["status", "release", "run"] {
        let mut cmd = lockrun();
        cmd.args(["run", "--url", &redis.url(), name, "--"])
            .args(["sh", "-c", r#"echo "$LOCKRUN_LOCK_NAME" >> "$OUT""#])
            .env("OUT", s.path("out"));
        run(cmd).assert_code(0);
    }
    assert_eq!(s.read("out"), "status\nrelease\nrun\n");
}

#[test]
fn command_arguments_are_passed_without_a_shell() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let out = s.path("out");
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &[],
        &[
            "sh",
            "-c",
            r#"printf '%s|' "$@" > "$0""#,
            out.to_str().unwrap(),
            "a b",
            "$HOME",
            "*",
            "--x",
        ],
    ));
    f.assert_code(0);
    assert_eq!(s.read("out"), "a b|$HOME|*|--x|");
}

#[test]
fn name_of_200_bytes_with_every_allowed_character_is_accepted() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let base = "AZaz09._-:/";
    let name: String = base.chars().cycle().take(200).collect();
    let mut cmd = lockrun_run(
        &redis.url(),
        &name,
        &[],
        &sh(r#"echo "$LOCKRUN_LOCK_NAME" > "$OUT""#),
    );
    cmd.env("OUT", s.path("out"));
    run(cmd).assert_code(0);
    assert_eq!(wait_line(&s.path("out")), name);
}

#[test]
fn options_are_read_from_lockrun_environment_variables() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut cmd = lockrun();
    cmd.args(["job", "--", "sh", "-c", HOLD])
        .env("LOCKRUN_URL", redis.url())
        .env("LOCKRUN_TTL", "7s")
        .env("LOCKRUN_KEY_PREFIX", "envtest:");
    let (mut holder, _) = hold(cmd, &s);
    let key = "envtest:{job}";
    assert!(
        redis.exists(key),
        "LOCKRUN_KEY_PREFIX/LOCKRUN_URL were not used"
    );
    let pttl = redis.pttl(key);
    assert!(pttl > 0 && pttl <= 7000, "PTTL {pttl} with LOCKRUN_TTL=7s");
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn command_line_option_overrides_the_environment() {
    let redis = RedisServer::start();
    let bad = format!("redis://127.0.0.1:{}", closed_port());
    let mut cmd = lockrun_run(&redis.url(), "job", &[], &["true"]);
    cmd.env("LOCKRUN_URL", bad);
    run(cmd).assert_code(0);
}

#[test]
fn quiet_successful_run_prints_nothing_on_stderr() {
    // Cron mails whatever a job prints: a quiet successful run must be silent.
    let redis = RedisServer::start();
    let f = run(lockrun_run(&redis.url(), "job", &["-q"], &["true"]));
    f.assert_code(0);
    assert_eq!(f.stderr, "", "stderr of a quiet successful run");
    assert_eq!(f.stdout, "");
}

#[test]
fn json_log_lines_are_objects_with_ts_level_event_and_lock() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);
    let busy = run(lockrun_run(
        &redis.url(),
        "job",
        &["--log-format", "json", "-v"],
        &["true"],
    ));
    busy.assert_code(75);
    s.touch("go");
    holder.wait().assert_code(0);
    let ran = run(lockrun_run(
        &redis.url(),
        "job",
        &["--log-format", "json", "-v"],
        &["true"],
    ));
    ran.assert_code(0);

    let mut events = Vec::new();
    for f in [&busy, &ran] {
        assert!(!f.stderr.trim().is_empty(), "no log lines with -v");
        for line in f.stderr.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line:?}"));
            for field in ["ts", "level", "event", "lock"] {
                assert!(v.get(field).is_some(), "log line lacks {field:?}: {line}");
            }
            assert_eq!(v["lock"], "job", "lock field of {line}");
            events.push(v["event"].as_str().unwrap_or_default().to_string());
        }
    }
    for e in ["busy", "acquired", "exited", "released"] {
        assert!(
            events.iter().any(|x| x == e),
            "no {e:?} event among {events:?}"
        );
    }
}

#[test]
fn status_with_a_bad_name_exits_125() {
    let redis = RedisServer::start();
    let mut cmd = lockrun();
    cmd.args(["status", "--url", &redis.url(), "bad name"]);
    run(cmd).assert_failure(125);
}

#[test]
fn release_without_force_is_refused() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);
    let mut cmd = lockrun();
    cmd.args(["release", "--url", &redis.url(), "job"]);
    let f = run(cmd);
    assert_ne!(f.code, Some(0), "release without --force succeeded");
    f.assert_explained();
    assert!(
        redis.lock_held("job"),
        "release without --force removed the lock"
    );
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn humantime_durations_are_accepted() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &["--ttl", "1m 30s"]);
    let pttl = redis.pttl(&lock_key("job"));
    assert!(
        pttl > 60_000 && pttl <= 90_000,
        "PTTL {pttl} with --ttl '1m 30s'"
    );
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn more_options_are_read_from_lockrun_environment_variables() {
    // LOCKRUN_MAX_RUNTIME, LOCKRUN_KILL_SIGNAL and LOCKRUN_LOG_FORMAT in one run: the
    // command is stopped with USR1 after 1s and every log line is JSON.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let script = r#"
        $SIG{USR1} = sub { open(my $f, ">>", $ENV{GOT}); print $f "USR1\n"; close $f; exit 0 };
        sleep 1 for 1..60;
    "#;
    let mut cmd = lockrun_run(&redis.url(), "job", &[], &["perl", "-e", script]);
    cmd.env("LOCKRUN_MAX_RUNTIME", "1s")
        .env("LOCKRUN_KILL_SIGNAL", "USR1")
        .env("LOCKRUN_LOG_FORMAT", "json")
        .env("GOT", s.path("got"));
    let f = run(cmd);
    f.assert_code(124);
    assert_eq!(s.read("got"), "USR1\n");
    for line in f.stderr.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("LOCKRUN_LOG_FORMAT=json, but {line:?} is not JSON: {e}"));
    }
    assert!(!f.stderr.is_empty(), "no log line for a 124");
}

/// Asserts a refusal before anything started: exit 125 and exactly one line on stderr,
/// which contains `needle`.
fn assert_refused(f: &Finished, needle: &str) {
    f.assert_failure(125);
    let lines: Vec<&str> = f.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "a refusal is one line, got:\n{}", f.stderr);
    assert!(
        lines[0].contains(needle) && lines[0].contains("not started"),
        "the refusal should say {needle:?}: {}",
        lines[0]
    );
}

#[test]
fn durations_out_of_their_range_are_refused_with_the_range() {
    // Against a live server, so that an accepted value would run the command.
    let redis = RedisServer::start();
    let s = Scratch::new();
    for (option, value, range) in [
        ("--ttl", "99ms", "100ms to 24h"),
        ("--ttl", "24h 1s", "100ms to 24h"),
        ("--ttl", "18446744073709551615s", "100ms to 24h"),
        ("--ttl", "292000000000y", "100ms to 24h"),
        ("--renew-every", "1ns", "10ms to 24h"),
        ("--renew-every", "9ms", "10ms to 24h"),
        ("--wait", "366d", "0 to 365d"),
        ("--hold-at-least", "500000000000y", "0 to 24h"),
        ("--kill-after", "25h", "0 to 24h"),
        ("--max-runtime", "366d", "0 (no limit) to 365d"),
    ] {
        let marker = s.path("ran");
        let mut cmd = lockrun_run(&redis.url(), "job", &[option, value], &["touch"]);
        cmd.arg(&marker);
        assert_refused(&run(cmd), range);
        assert!(!marker.exists(), "{option} {value}: the command ran");
        assert!(!redis.exists(&lock_key("job")), "{option} {value}: a lock");
    }
}

#[test]
fn durations_from_the_environment_are_bounded_too() {
    let redis = RedisServer::start();
    for (var, value, range) in [
        ("LOCKRUN_TTL", "48h", "100ms to 24h"),
        ("LOCKRUN_RENEW_EVERY", "1ms", "10ms to 24h"),
        ("LOCKRUN_WAIT", "400d", "0 to 365d"),
        ("LOCKRUN_MAX_RUNTIME", "500000000000y", "365d"),
    ] {
        let mut cmd = lockrun_run(&redis.url(), "job", &[], &["true"]);
        cmd.env(var, value);
        assert_refused(&run(cmd), range);
    }
}

#[test]
fn a_wait_too_long_for_the_clock_is_refused_not_a_panic() {
    // `--wait 500000000000y` on a busy lock used to panic ("overflow when adding
    // duration to instant", exit 134).
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);
    for wait in [
        "500000000000y",
        "18446744073709551615s",
        "99999999999999999999s",
    ] {
        let f = run(lockrun_run(
            &redis.url(),
            "job",
            &["--wait", wait],
            &["true"],
        ));
        assert_refused(&f, "--wait");
    }
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn kill_signals_that_do_not_end_a_process_are_refused() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    for sig in [
        "STOP", "TSTP", "TTIN", "TTOU", "CONT", "CHLD", "WINCH", "URG", "SIGSTOP", "19",
    ] {
        let marker = s.path("ran");
        let mut cmd = lockrun_run(&redis.url(), "job", &["--kill-signal", sig], &["touch"]);
        cmd.arg(&marker);
        let f = run(cmd);
        assert_refused(&f, "TERM, INT, HUP, QUIT, USR1, USR2, KILL");
        assert!(f.stderr.contains("--kill-signal"), "{}", f.stderr);
        assert!(!marker.exists(), "--kill-signal {sig}: the command ran");
    }
}

#[test]
fn port_0_is_refused_in_every_backend_url() {
    let redis = RedisServer::start();
    let live = redis.url();
    let redlock = format!("{live},redis://127.0.0.1:0,{live}");
    for url in [
        "redis://127.0.0.1:0",
        "redis://:s3cret@127.0.0.1:0/1",
        "rediss://127.0.0.1:0",
        "redis+sentinel://127.0.0.1:26379,127.0.0.1:0/mymaster",
        "etcd://127.0.0.1:0",
        "etcd://root:s3cret@127.0.0.1:2379,127.0.0.1:0",
        "postgres://postgres@127.0.0.1:0/test",
        "postgresql://postgres:s3cret@127.0.0.1/test?port=0",
        redlock.as_str(),
    ] {
        let f = run(lockrun_run(url, "job", &[], &["true"]));
        assert_refused(&f, "port 0");
        assert!(!f.stderr.contains("s3cret"), "{}", f.stderr);
    }
    let mut cmd = lockrun();
    cmd.args(["job", "--", "true"])
        .env("LOCKRUN_URL", "redis://127.0.0.1:0");
    assert_refused(&run(cmd), "port 0");
}

#[test]
fn slot_counts_out_of_range_are_refused_in_one_line() {
    // Against a live server, so that an accepted value would run the command.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let marker = s.path("ran");
    for bad in ["0", "1001", "-1", "three", "", "4294967296"] {
        let given = format!("--slots={bad}");
        let mut cmd = lockrun_run(&redis.url(), "job", &[&given], &["touch"]);
        cmd.arg(&marker);
        assert_refused(&run(cmd), "--slots");
        let mut cmd = lockrun_run(&redis.url(), "job", &[], &["touch"]);
        cmd.arg(&marker).env("LOCKRUN_SLOTS", bad);
        assert_refused(&run(cmd), "--slots");
        assert!(!marker.exists(), "--slots {bad:?}: the command ran");
    }
    for sub in ["status", "release"] {
        let mut cmd = lockrun();
        cmd.args([sub, "--url", &redis.url(), "--slots", "0"]);
        if sub == "release" {
            cmd.arg("--force");
        }
        cmd.arg("job");
        let f = run(cmd);
        f.assert_failure(125);
        assert!(f.stderr.contains("--slots"), "{sub}: {}", f.stderr);
    }
    assert!(!redis.exists(&lock_key("job")), "a refused run left a lock");
}

#[test]
fn the_command_learns_its_slot_and_a_plain_lock_is_slot_0() {
    let redis = RedisServer::start();
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &[],
        &sh(r#"echo "$LOCKRUN_SLOT""#),
    ));
    f.assert_code(0);
    assert_eq!(f.stdout.trim(), "0");
    // A LOCKRUN_SLOT inherited from an outer lockrun is replaced, not passed on.
    let mut cmd = lockrun_run(&redis.url(), "inner", &[], &sh(r#"echo "$LOCKRUN_SLOT""#));
    cmd.env("LOCKRUN_SLOT", "7");
    let f = run(cmd);
    f.assert_code(0);
    assert_eq!(f.stdout.trim(), "0");
}
