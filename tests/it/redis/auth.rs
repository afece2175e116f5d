//! Passwords against a `redis-server --requirepass`: every way of giving one that keeps it
//! out of `argv` works (LOCKRUN_URL, LOCKRUN_PASSWORD, --password-file), and a wrong one
//! fails closed (125, command not started) without the password showing on stderr; the
//! command's environment holds no password (no `LOCKRUN_PASSWORD`, `LOCKRUN_URL` without
//! its password).

use crate::support::*;

const PASSWORD: &str = "s3cret-Pw-5e1d";
const WRONG: &str = "wrong-Pw-90ab";

/// A command that records its fencing token in `$OUT`.
const RECORD: &str = r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#;

fn assert_ran(f: &Finished, s: &Scratch) {
    f.assert_code(0);
    parse_token(&wait_line(&s.path("out")));
}

fn assert_refused_without_leak(f: &Finished, s: &Scratch, secret: &str) {
    f.assert_failure(125);
    assert!(!s.exists("out"), "the command ran although auth failed");
    assert!(
        !f.stderr.contains(secret),
        "the password appears on stderr:\n{}",
        f.stderr
    );
}

/// Runs [`RECORD`] under lockrun on `url` with `opts` and the extra environment `env`;
/// returns how it ended and the scratch directory of its "out" file.
fn record_run(url: &str, opts: &[&str], env: &[(&str, &str)]) -> (Finished, Scratch) {
    let s = Scratch::new();
    let mut cmd = lockrun_run(url, "job", opts, &sh(RECORD));
    cmd.env("OUT", s.path("out")).envs(env.iter().copied());
    (run(cmd), s)
}

/// [`record_run`] on `redis` with `password` in a `--password-file` of its owner only,
/// written the way `echo "$PW" > file` would: with a trailing newline.
fn password_file_run(redis: &RedisServer, password: &str) -> (Finished, Scratch) {
    password_file_bytes_run(redis, format!("{password}\n").as_bytes(), 0o600)
}

/// [`record_run`] on `redis` with a `--password-file` holding `bytes`, of mode `mode`.
fn password_file_bytes_run(redis: &RedisServer, bytes: &[u8], mode: u32) -> (Finished, Scratch) {
    use std::os::unix::fs::PermissionsExt;
    let dir = Scratch::new();
    let file = dir.path("pw");
    std::fs::write(&file, bytes).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    let opts = ["--password-file", file.to_str().unwrap()];
    record_run(&redis.url(), &opts, &[])
}

#[test]
fn password_in_url_works() {
    let redis = RedisServer::with_password(PASSWORD);
    let (f, s) = record_run(&redis.url_with_password(), &[], &[]);
    assert_ran(&f, &s);
}

#[test]
fn password_in_lockrun_url_environment_works() {
    let redis = RedisServer::with_password(PASSWORD);
    let s = Scratch::new();
    let mut cmd = lockrun();
    cmd.env("LOCKRUN_URL", redis.url_with_password())
        .env("OUT", s.path("out"))
        .args(["job", "--", "sh", "-c", RECORD]);
    assert_ran(&run(cmd), &s);
}

#[test]
fn password_from_lockrun_password_works() {
    let redis = RedisServer::with_password(PASSWORD);
    let (f, s) = record_run(&redis.url(), &[], &[("LOCKRUN_PASSWORD", PASSWORD)]);
    assert_ran(&f, &s);
}

#[test]
fn password_from_password_file_works() {
    let redis = RedisServer::with_password(PASSWORD);
    let (f, s) = password_file_run(&redis, PASSWORD);
    assert_ran(&f, &s);
}

#[test]
fn wrong_password_from_lockrun_password_fails_closed_without_showing_it() {
    let redis = RedisServer::with_password(PASSWORD);
    let (f, s) = record_run(&redis.url(), &[], &[("LOCKRUN_PASSWORD", WRONG)]);
    assert_refused_without_leak(&f, &s, WRONG);
}

#[test]
fn wrong_password_in_url_fails_closed_without_showing_it() {
    let redis = RedisServer::with_password(PASSWORD);
    let url = format!("redis://:{WRONG}@127.0.0.1:{}", redis.port());
    let (f, s) = record_run(&url, &[], &[]);
    assert_refused_without_leak(&f, &s, WRONG);
}

#[test]
fn wrong_password_file_fails_closed_without_showing_it() {
    let redis = RedisServer::with_password(PASSWORD);
    let (f, s) = password_file_run(&redis, WRONG);
    assert_refused_without_leak(&f, &s, WRONG);
}

#[test]
fn missing_password_file_fails_closed() {
    let redis = RedisServer::with_password(PASSWORD);
    let missing = Scratch::new().path("no-such-password-file");
    let opts = ["--password-file", missing.to_str().unwrap()];
    let (f, s) = record_run(&redis.url(), &opts, &[]);
    f.assert_failure(125);
    assert!(!s.exists("out"));
}

#[test]
fn no_password_against_requirepass_fails_closed() {
    let redis = RedisServer::with_password(PASSWORD);
    let (f, s) = record_run(&redis.url(), &[], &[]);
    assert_refused_without_leak(&f, &s, PASSWORD);
}

#[test]
fn status_uses_lockrun_password() {
    let redis = RedisServer::with_password(PASSWORD);
    let mut cmd = lockrun();
    cmd.env("LOCKRUN_PASSWORD", PASSWORD)
        .args(["status", "--url", &redis.url(), "job"]);
    // Free lock: status 1, not 125.
    run(cmd).assert_code(1);
}

#[test]
fn an_acl_user_confined_to_the_lockrun_keys_can_lock() {
    let redis = RedisServer::start();
    redis.acl_user(
        "locker",
        &["on", ">s3cret", "~lockrun:*", "&lockrun:*", "+@all"],
    );
    let url = format!("redis://locker:s3cret@127.0.0.1:{}", redis.port());
    run(lockrun_run(&url, "job", &[], &["sh", "-c", "exit 6"])).assert_code(6);
    // The same user with the password from the environment, and waiting (pub/sub).
    let url = format!("redis://locker@127.0.0.1:{}", redis.port());
    let mut cmd = lockrun_run(&url, "job", &["--wait", "5s"], &["true"]);
    cmd.env("LOCKRUN_PASSWORD", "s3cret");
    run(cmd).assert_code(0);
}

#[test]
fn an_acl_user_without_the_needed_commands_fails_closed_and_says_so() {
    let redis = RedisServer::start();
    redis.acl_user("reader", &["on", ">pw", "~*", "+@read", "+hello", "+ping"]);
    let s = Scratch::new();
    let url = format!("redis://reader:pw@127.0.0.1:{}", redis.port());
    let mut cmd = lockrun_run(&url, "job", &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("marker"), "the command ran without the lock");
    assert!(
        f.stderr.contains("does not let user \"reader\" run EVAL")
            && f.stderr.contains("ACL SETUSER reader +eval "),
        "{}",
        f.stderr
    );
    assert!(
        !f.stderr.contains(":pw@"),
        "the URL with its password leaked:\n{}",
        f.stderr
    );
}

/// Runs `env` under lockrun on `url` with `opts` and the environment `env`; returns the
/// command's environment, one `NAME=value` a line.
fn command_environment(url: &str, opts: &[&str], env: &[(&str, &str)]) -> String {
    let s = Scratch::new();
    let mut cmd = lockrun_run(url, "job", opts, &sh(r#"env > "$OUT""#));
    cmd.env("OUT", s.path("out")).envs(env.iter().copied());
    let f = run(cmd);
    f.assert_code(0);
    s.read("out")
}

fn assert_no_password(environment: &str, secret: &str) {
    assert!(
        !environment.contains(secret),
        "the command's environment holds the password:\n{environment}"
    );
    assert!(
        !environment
            .lines()
            .any(|l| l.starts_with("LOCKRUN_PASSWORD=")),
        "the command got LOCKRUN_PASSWORD:\n{environment}"
    );
}

#[test]
fn the_command_gets_lockrun_url_without_its_password() {
    let redis = RedisServer::with_password(PASSWORD);
    let s = Scratch::new();
    let mut cmd = lockrun();
    cmd.env("LOCKRUN_URL", redis.url_with_password())
        .env("LOCKRUN_TTL", "7s")
        .env("OUT", s.path("out"))
        .args(["job", "--", "sh", "-c", r#"env > "$OUT""#]);
    run(cmd).assert_code(0);
    let environment = s.read("out");
    assert_no_password(&environment, PASSWORD);
    let url = format!("LOCKRUN_URL=redis://127.0.0.1:{}\n", redis.port());
    assert!(environment.contains(&url), "{url:?} in:\n{environment}");
    assert!(
        environment.contains("LOCKRUN_TTL=7s\n"),
        "the other LOCKRUN_* variables stay:\n{environment}"
    );
}

#[test]
fn the_command_gets_no_lockrun_password() {
    let redis = RedisServer::with_password(PASSWORD);
    let dir = Scratch::new();
    std::fs::write(dir.path("pw"), format!("{PASSWORD}\n")).unwrap();
    let file = dir.path("pw");
    let env = [
        ("LOCKRUN_PASSWORD", PASSWORD),
        ("LOCKRUN_KEY_PREFIX", "jobs:"),
    ];
    let environment = command_environment(&redis.url(), &[], &env);
    assert_no_password(&environment, PASSWORD);
    assert!(environment.contains("LOCKRUN_KEY_PREFIX=jobs:\n"));
    // A job that calls lockrun itself finds the password in the file.
    let env = [("LOCKRUN_PASSWORD_FILE", file.to_str().unwrap())];
    let environment = command_environment(&redis.url(), &[], &env);
    let passed = format!("LOCKRUN_PASSWORD_FILE={}\n", file.display());
    assert!(environment.contains(&passed), "{environment}");
}

#[test]
fn every_url_of_a_lockrun_url_list_loses_its_password_and_a_doubtful_one_is_left_out() {
    // With --url given, LOCKRUN_URL is not lockrun's backend, but the command gets it.
    let redis = RedisServer::start();
    let list = "redis://:pw-one@h1:1,redis://user:pw-two@h2:2,redis://:pw/three@h3:3";
    let environment = command_environment(&redis.url(), &[], &[("LOCKRUN_URL", list)]);
    assert!(!environment.contains("pw-"), "{environment}");
    assert!(!environment.contains("three"), "{environment}");
    assert!(
        environment.contains("LOCKRUN_URL=redis://h1:1,redis://user@h2:2\n"),
        "{environment}"
    );
    let environment =
        command_environment(&redis.url(), &[], &[("LOCKRUN_URL", "redis://:pw/x@h:1")]);
    assert!(
        !environment.contains("LOCKRUN_URL="),
        "a URL that cannot be taken apart is left out:\n{environment}"
    );
}

/// Asserts that `f` failed with 125 and one line that says `why`, without running the
/// command.
fn assert_refused_in_one_line(f: &Finished, s: &Scratch, why: &str) {
    f.assert_failure(125);
    assert!(!s.exists("out"), "the command ran");
    assert_eq!(f.stderr.lines().count(), 1, "one line:\n{}", f.stderr);
    assert!(f.stderr.contains(why), "{why:?} in:\n{}", f.stderr);
}

#[test]
fn a_password_file_readable_by_others_works_with_one_warning() {
    let redis = RedisServer::with_password(PASSWORD);
    let (f, s) = password_file_bytes_run(&redis, format!("{PASSWORD}\n").as_bytes(), 0o644);
    assert_ran(&f, &s);
    assert_eq!(f.stderr.lines().count(), 1, "one warning:\n{}", f.stderr);
    assert!(
        f.stderr.contains("group or others") && f.stderr.contains("0644"),
        "{}",
        f.stderr
    );
    let (f, s) = password_file_bytes_run(&redis, format!("{PASSWORD}\n").as_bytes(), 0o640);
    assert_ran(&f, &s);
    assert!(f.stderr.contains("group or others"), "{}", f.stderr);
}

#[test]
fn a_password_file_of_its_owner_only_gives_no_warning() {
    let redis = RedisServer::with_password(PASSWORD);
    for mode in [0o600, 0o400] {
        let (f, s) = password_file_bytes_run(&redis, format!("{PASSWORD}\n").as_bytes(), mode);
        assert_ran(&f, &s);
        assert_eq!(f.stderr, "", "mode {mode:o}");
    }
}

#[test]
fn an_empty_password_file_is_refused() {
    let redis = RedisServer::with_password(PASSWORD);
    for bytes in ["", "\n", "\nsecond line\n"] {
        let (f, s) = password_file_bytes_run(&redis, bytes.as_bytes(), 0o600);
        assert_refused_in_one_line(&f, &s, "empty");
    }
}

#[test]
fn a_password_file_over_4_kib_is_refused() {
    let redis = RedisServer::with_password(PASSWORD);
    let mut bytes = format!("{PASSWORD}\n").into_bytes();
    bytes.resize(4097, b'#');
    let (f, s) = password_file_bytes_run(&redis, &bytes, 0o600);
    assert_refused_in_one_line(&f, &s, "4 KiB");
    bytes.truncate(4096);
    let (f, s) = password_file_bytes_run(&redis, &bytes, 0o600);
    assert_ran(&f, &s);
}

#[test]
fn dev_zero_as_the_password_file_is_refused_without_reading_it_all() {
    let redis = RedisServer::with_password(PASSWORD);
    let s = Scratch::new();
    let inner = lockrun_run(
        &redis.url(),
        "job",
        &["--password-file", "/dev/zero"],
        &sh(RECORD),
    );
    // A safety net for this machine should lockrun ever read it all again.
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", r#"ulimit -v 4000000; exec "$0" "$@""#])
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .env("OUT", s.path("out"))
        .stdin(std::process::Stdio::null());
    let f = spawn(cmd).wait_for(std::time::Duration::from_secs(10));
    assert_refused_in_one_line(&f, &s, "not a regular file");
}
