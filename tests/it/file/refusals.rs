//! The file backend refuses (125, one line saying what to fix, the command not run) a
//! lock directory or lock file that would let another user in, a file that is not
//! lockrun's (left as it is: no counter is ever reset), and URLs it cannot take.

use std::fs;
use std::os::unix::fs::{chown, lchown, symlink, PermissionsExt};
use std::path::Path;

use super::admin;
use crate::support::*;

/// A user other than the tests' (root).
const NOBODY: u32 = 65534;

/// Runs a command on "job" at `url`: it must be refused with a line containing `says`,
/// without running the command; `status` and `release --force` refuse too.
fn refused(url: &str, says: &str) {
    let s = Scratch::new();
    let mut cmd = lockrun_run(url, "job", &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("marker"), "the command ran");
    let line = f.lockrun_line().unwrap_or_default();
    assert!(
        line.contains(says),
        "the refusal does not say {says:?}: {line}"
    );
    for (sub, args) in [("status", &["job"][..]), ("release", &["--force", "job"])] {
        let mut cmd = lockrun();
        cmd.arg(sub).arg("--url").arg(url).args(args);
        run(cmd).assert_failure(125);
    }
}

fn mkdir(path: &Path, mode: u32) {
    fs::create_dir(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn url(path: &Path) -> String {
    format!("file://{}", path.display())
}

#[test]
fn a_directory_that_is_a_symlink_is_refused() {
    let f = FileService::start();
    mkdir(&f.root().join("real"), 0o700);
    symlink(f.root().join("real"), f.dir()).unwrap();
    refused(&f.lock_url(), "symbolic link");
}

#[test]
fn a_directory_that_is_a_file_is_refused() {
    let f = FileService::start();
    fs::write(f.dir(), "x").unwrap();
    refused(&f.lock_url(), "not a directory");
}

#[test]
fn a_directory_of_another_user_is_refused() {
    let f = FileService::start();
    mkdir(&f.dir(), 0o700);
    chown(f.dir(), Some(NOBODY), None).unwrap();
    refused(&f.lock_url(), "belongs to uid 65534");
}

#[test]
fn a_directory_others_may_write_is_refused() {
    let f = FileService::start();
    for mode in [0o770, 0o702, 0o1777] {
        let dir = f.root().join(format!("locks-{mode:o}"));
        mkdir(&dir, mode);
        refused(&url(&dir), "chmod go-w");
    }
}

#[test]
fn a_directory_whose_parent_another_user_may_write_is_refused() {
    let f = FileService::start();
    // Group-writable, not sticky: a member of the group could swap the lock directory.
    let parent = f.root().join("shared");
    mkdir(&parent, 0o775);
    refused(
        &url(&parent.join("locks")),
        "would let another user move it",
    );
    // A parent of another user's, reached through a symlink.
    let theirs = f.root().join("theirs");
    mkdir(&theirs, 0o755);
    chown(&theirs, Some(NOBODY), None).unwrap();
    mkdir(&theirs.join("locks"), 0o700);
    symlink(&theirs, f.root().join("link")).unwrap();
    refused(&url(&f.root().join("link/locks")), "uid 65534");
    // Sticky, as /tmp: fine.
    let sticky = f.root().join("sticky");
    mkdir(&sticky, 0o1777);
    let ok = run(lockrun_run(
        &url(&sticky.join("locks")),
        "job",
        &[],
        &["true"],
    ));
    ok.assert_code(0);
}

#[test]
fn a_directory_under_another_users_open_directory_is_refused_before_it_is_made() {
    let f = FileService::start();
    for (name, owner, mode) in [("theirs", NOBODY, 0o777), ("shared", 0, 0o775)] {
        let parent = f.root().join(name);
        mkdir(&parent, mode);
        chown(&parent, Some(owner), None).unwrap();
        refused(
            &url(&parent.join("locks")),
            "would let another user move it",
        );
        assert!(
            !parent.join("locks").exists(),
            "the refused directory under {name} was made"
        );
    }
}

#[test]
fn a_symlink_of_another_user_on_the_path_is_refused_and_nothing_is_made() {
    let f = FileService::start();
    // They could point it elsewhere between two runs: two lock directories, two
    // holders at once.
    let real = f.root().join("real");
    mkdir(&real, 0o755);
    let link = f.root().join("link");
    symlink(&real, &link).unwrap();
    lchown(&link, Some(NOBODY), Some(NOBODY)).unwrap();
    refused(
        &url(&link.join("locks")),
        &format!(
            "{} on its path is a symbolic link of uid 65534",
            link.display()
        ),
    );
    assert!(
        !real.join("locks").exists(),
        "the refused directory was made"
    );
}

#[test]
fn a_symlink_of_roots_on_the_path_is_followed() {
    let f = FileService::start();
    let real = f.root().join("real");
    mkdir(&real, 0o755);
    // Relative, through another link of root's, and with a `..`.
    mkdir(&real.join("sub"), 0o755);
    symlink("real/sub/..", f.root().join("link")).unwrap();
    symlink(f.root().join("link"), f.root().join("link2")).unwrap();
    let url = url(&f.root().join("link2/locks"));
    run(lockrun_run(&url, "job", &[], &["true"])).assert_code(0);
    assert!(real.join("locks/lockrun:=job").is_file());
    let mut status = lockrun();
    status.arg("status").arg("--url").arg(&url).arg("job");
    run(status).assert_code(1);
}

#[test]
fn a_lock_file_that_is_a_symlink_is_refused_and_its_target_left_alone() {
    let f = FileService::start();
    mkdir(&f.dir(), 0o700);
    let target = f.root().join("precious");
    fs::write(&target, "keep me\n").unwrap();
    symlink(&target, f.lock_file("job")).unwrap();
    refused(&f.lock_url(), "symbolic link");
    assert_eq!(fs::read_to_string(&target).unwrap(), "keep me\n");
}

#[test]
fn a_lock_file_that_is_not_a_regular_file_is_refused_without_hanging() {
    let f = FileService::start();
    mkdir(&f.dir(), 0o700);
    // Opening a FIFO for reading would block until a writer came.
    nix::unistd::mkfifo(
        &f.lock_file("job"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    refused(&f.lock_url(), "not a regular file");
}

#[test]
fn a_lock_file_of_another_user_or_that_others_may_read_or_write_is_refused() {
    let f = FileService::start();
    run(lockrun_run(&f.lock_url(), "job", &[], &["true"])).assert_code(0);
    let file = f.lock_file("job");
    // Read is enough: one who may open the file may hold a read lock on byte 0, and
    // every run would be busy.
    for mode in [0o620, 0o640, 0o604] {
        fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
        refused(&f.lock_url(), &format!("chmod 600 {}", file.display()));
    }
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    chown(&file, Some(NOBODY), None).unwrap();
    refused(&f.lock_url(), "belongs to uid 65534");
}

#[test]
fn a_file_that_is_not_lockruns_is_refused_and_left_as_it_is() {
    let f = FileService::start();
    mkdir(&f.dir(), 0o700);
    let file = f.lock_file("job");
    for text in [
        "#!/bin/sh\necho hello\n",
        "lockrun lock file 1\nfencing_token 07\n",
    ] {
        fs::write(&file, text).unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        refused(&f.lock_url(), "is not a lockrun lock file");
        // Its advice keeps the counter: removing the file would start tokens at 1.
        let out = run(lockrun_run(&f.lock_url(), "job", &[], &["true"]));
        let line = out.lockrun_line().unwrap_or_default();
        assert!(line.contains("repair it"), "{line}");
        assert!(
            !line.contains("remove") && !line.contains("move it away"),
            "{line}"
        );
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            text,
            "the file was changed"
        );
    }
}

#[test]
fn file_urls_lockrun_cannot_take_are_refused_in_one_line() {
    let f = FileService::start();
    for (bad, says) in [
        ("file://otherhost/x", "names a host"),
        ("file:///a/../b", ".."),
        ("file:///x?mode=1", "query"),
        ("file://user:s3cret@/x", "user or password"),
        ("file:///", "names /"),
    ] {
        let mut cmd = lockrun_run(bad, "job", &[], &["true"]);
        cmd.current_dir(f.root());
        let out = run(cmd);
        out.assert_failure(125);
        let line = out.lockrun_line().unwrap_or_default();
        assert!(
            line.contains(says) && !line.contains("s3cret"),
            "{bad}: {line}"
        );
    }
    // A password meant for another backend is not silently ignored.
    let mut cmd = lockrun_run(&f.lock_url(), "job", &[], &["true"]);
    cmd.env("LOCKRUN_PASSWORD", "pw");
    let out = run(cmd);
    out.assert_failure(125);
    assert!(out.stderr.contains("LOCKRUN_PASSWORD"), "{}", out.stderr);
    assert!(!f.dir().exists(), "a refused run made the lock directory");
    run(admin(&f, "status", &["job"])).assert_code(1);
}
