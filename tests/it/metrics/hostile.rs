//! The metrics file in a directory that someone else can write (node_exporter's textfile
//! directory often belongs to an unprivileged user, and lockrun often runs as root):
//! nothing is ever written through a symlink, whether sprayed over temporary names or
//! at the final path; the file is 0644 whatever the umask; and a previous "file" that is
//! a FIFO, a symlink to `/dev/zero` or over 64 KiB is not read: lockrun neither hangs nor
//! grows, warns once, and writes a fresh file.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{get, outcome, samples};
use crate::support::*;

/// Long enough for a run of `true` on a loaded machine, far shorter than a hang.
const PROMPTLY: Duration = Duration::from_secs(15);

/// What a root-only file holds before the test (and must hold after it): a last success
/// that must never be carried over from it.
const SECRET: &str = "lockrun_last_success_timestamp_seconds{lock=\"job\"} 1234.000\nroot only\n";

/// A 0600 file outside the metrics directory, standing for one of root's files.
fn root_only_file(s: &Scratch) -> PathBuf {
    let path = s.path("secret");
    fs::write(&path, SECRET).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// Asserts that the root-only file still holds [`SECRET`] with mode 0600.
fn assert_untouched(secret: &Path) {
    assert_eq!(
        fs::read_to_string(secret).unwrap(),
        SECRET,
        "written through a symlink"
    );
    let mode = fs::metadata(secret).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600, "the root-only file's mode changed");
}

/// Asserts that `path` is a regular file (not a symlink) with this run's metrics.
fn assert_fresh_metrics(path: &Path, ran: f64) {
    let meta = fs::symlink_metadata(path).unwrap();
    assert!(
        meta.file_type().is_file(),
        "{} is {:?}",
        path.display(),
        meta.file_type()
    );
    assert_eq!(outcome(&samples(path), "ran"), ran);
}

/// The last success recorded in `path`.
fn last_success(path: &Path) -> f64 {
    get(
        &samples(path),
        "lockrun_last_success_timestamp_seconds{lock=\"job\"}",
    )
}

/// Asserts that lockrun wrote exactly one line, a warning that mentions `what`.
fn assert_one_warning(f: &Finished, what: &str) {
    let lines: Vec<&str> = f
        .stderr
        .lines()
        .filter(|l| l.starts_with("lockrun: "))
        .collect();
    assert_eq!(lines.len(), 1, "expected one warning, got:\n{}", f.stderr);
    assert!(
        lines[0].contains(what),
        "the warning does not say {what:?}: {}",
        lines[0]
    );
    f.assert_explained();
}

/// `cmd` started by `sh -c 'PRELUDE; exec "$@"'` (a umask, a ulimit), with its
/// environment.
fn in_shell(cmd: &Command, prelude: &str) -> Command {
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(format!("{prelude}; exec \"$@\""))
        .arg("sh")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => sh.env(key, v),
            None => sh.env_remove(key),
        };
    }
    sh.stdin(Stdio::null());
    sh
}

/// `lockrun --metrics-file PATH job -- COMMAND` against `redis`.
fn with_metrics(redis: &RedisServer, path: &Path, command: &[&str]) -> Command {
    let file = path.to_str().unwrap();
    lockrun_run(&redis.url(), "job", &["--metrics-file", file], command)
}

#[test]
fn a_symlink_spray_over_temporary_names_writes_nothing_through_them() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let secret = root_only_file(&s);
    let dir = s.path("textfile");
    fs::create_dir(&dir).unwrap();
    let file = dir.join("job.prom");
    let file_arg = file.to_str().unwrap();
    let (mut lr, _) = start_holder(&redis.url(), "job", &s, &["--metrics-file", file_arg]);
    // Every name a temporary file could plausibly have: by pid (lockrun's own, the
    // pids of a busy host, PID 1 in a container), and without one.
    let mut names: Vec<String> = (1..=2000)
        .chain([lr.pid()])
        .map(|pid| format!(".job.prom.{pid}.tmp"))
        .collect();
    names.extend(
        [
            ".job.prom.tmp",
            "job.prom.tmp",
            ".job.prom.swp",
            "job.prom~",
            ".job.prom",
        ]
        .map(String::from),
    );
    names.sort();
    names.dedup();
    for name in &names {
        symlink(&secret, dir.join(name)).unwrap();
    }
    s.touch("go");
    lr.wait().assert_code(0);
    assert_untouched(&secret);
    assert_fresh_metrics(&file, 1.0);
    let left = fs::read_dir(&dir).unwrap().count();
    assert_eq!(left, names.len() + 1, "a temporary file was left behind");
}

#[test]
fn a_symlink_at_the_metrics_path_is_replaced_not_followed() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let secret = root_only_file(&s);
    let file = s.path("job.prom");
    symlink(&secret, &file).unwrap();
    let f = run(with_metrics(&redis, &file, &sh("exit 3")));
    f.assert_code(3);
    assert_one_warning(&f, "symbolic link");
    assert_untouched(&secret);
    assert_fresh_metrics(&file, 1.0);
    assert_eq!(
        last_success(&file),
        0.0,
        "the previous file was read through the link"
    );
}

#[test]
fn the_metrics_file_is_0644_whatever_the_umask() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let file = s.path("job.prom");
    // 077 first: the file is created, then replaced by a run with umask 000.
    for umask in ["077", "000"] {
        let cmd = in_shell(
            &with_metrics(&redis, &file, &["true"]),
            &format!("umask {umask}"),
        );
        run(cmd).assert_code(0);
        let mode = fs::metadata(&file).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644, "mode {mode:o} with umask {umask}");
    }
}

#[test]
fn a_fifo_at_the_metrics_path_does_not_block() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let file = s.path("job.prom");
    // A FIFO that no one will ever open for writing: opening it to read would block.
    let made = Command::new("mkfifo").arg(&file).status().unwrap();
    assert!(made.success(), "mkfifo failed");
    let f = spawn(with_metrics(&redis, &file, &["true"])).wait_for(PROMPTLY);
    f.assert_code(0);
    assert_one_warning(&f, "FIFO");
    assert_fresh_metrics(&file, 1.0);
}

#[test]
fn a_symlink_to_dev_zero_at_the_metrics_path_is_not_read() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let file = s.path("job.prom");
    symlink("/dev/zero", &file).unwrap();
    // An address-space limit, so that a lockrun that reads /dev/zero fails fast instead
    // of growing to the machine's memory.
    let cmd = in_shell(&with_metrics(&redis, &file, &["true"]), "ulimit -v 2000000");
    let f = spawn(cmd).wait_for(PROMPTLY);
    f.assert_code(0);
    assert_one_warning(&f, "symbolic link");
    assert_fresh_metrics(&file, 1.0);
}

#[test]
fn a_metrics_file_over_64_kib_is_not_read() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let file = s.path("job.prom");
    // A well-formed last success, then comments up to 1 MiB.
    let mut text = SECRET.to_string();
    while text.len() < 1 << 20 {
        text.push_str("# padding padding padding padding padding padding padding\n");
    }
    fs::write(&file, text).unwrap();
    let f = spawn(with_metrics(&redis, &file, &sh("exit 3"))).wait_for(PROMPTLY);
    f.assert_code(3);
    assert_one_warning(&f, "64 KiB");
    assert_fresh_metrics(&file, 1.0);
    assert_eq!(last_success(&file), 0.0, "a file over 64 KiB was read");
    assert!(fs::metadata(&file).unwrap().len() < 4096);
}
