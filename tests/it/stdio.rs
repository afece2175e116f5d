//! lockrun's own stdin, stdout and stderr: started with them closed, a run still locks,
//! and no file of its own (the lock file, the socket to its guard) takes their place;
//! `status` and `list` printing into a pipe whose reader has gone end quietly with their
//! own status, and a stdout that cannot be written is one line and 125.

use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};

use crate::support::*;

#[test]
fn started_with_stdin_stdout_and_stderr_closed_a_run_locks_and_keeps_its_files() {
    let s = Scratch::new();
    let url = format!("file://{}", s.path("locks").display());
    std::fs::create_dir(s.path("locks")).unwrap();
    // The shell closes lockrun's descriptors 0 to 2 before it executes it; lockrun logs
    // (-v) to its stderr, and its command (a shell: `$$` keeps the descriptors it
    // inherited while the substitution runs) says where its own 0 to 2 lead.
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        r#"exec "$LR" -v --url "$URL" job -- sh -c 'echo "$(readlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2)" > "$OUT"' 0<&- 1>&- 2>&-"#,
    ])
    .env("LR", lockrun_binary())
    .env("URL", &url)
    .env("OUT", s.path("fds"));
    run(cmd).assert_code(0);
    let fds = std::fs::read_to_string(s.path("fds")).expect("the command ran");
    assert_eq!(
        fds.lines().collect::<Vec<_>>(),
        ["/dev/null"; 3],
        "the command's descriptors 0 to 2 (lockrun's own): {fds}"
    );
    // The lock file and the record are intact: nothing was written into them as if
    // they were stdout or stderr.
    run(lockrun_run(&url, "job", &[], &["true"])).assert_code(0);
    let f = run({
        let mut c = lockrun();
        c.args(["status", "--url", &url, "job"]);
        c
    });
    f.assert_code(1);
    assert!(f.stdout.contains("exit status 0"), "status: {}", f.stdout);
}

/// Runs `lockrun ARGS` with stdout a pipe whose reading end is closed; its exit code and
/// stderr.
fn into_a_closed_pipe(args: &[&str]) -> (Option<i32>, String) {
    let (read, write): (OwnedFd, OwnedFd) = nix::unistd::pipe().expect("pipe");
    drop(read);
    let mut cmd = lockrun();
    cmd.args(args)
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped());
    finish(cmd)
}

/// Spawns `cmd` and waits for it (at most `WAIT`): its exit code and stderr.
fn finish(mut cmd: Command) -> (Option<i32>, String) {
    let mut child = cmd.spawn().expect("spawn lockrun");
    let mut status = None;
    wait_until("lockrun to exit", WAIT, || {
        status = child.try_wait().expect("wait");
        status.is_some()
    });
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.unwrap().code(), err)
}

#[test]
fn status_and_list_into_a_pipe_whose_reader_has_gone_end_quietly_with_their_status() {
    let s = Scratch::new();
    std::fs::create_dir(s.path("locks")).unwrap();
    let url = format!("file://{}", s.path("locks").display());
    run(lockrun_run(&url, "job", &[], &["true"])).assert_code(0);
    for (args, code) in [
        (vec!["status", "--url", &url, "job"], 1),
        (vec!["status", "--json", "--url", &url, "job"], 1),
        (vec!["list", "--url", &url], 0),
        (vec!["list", "--json", "--url", &url], 0),
    ] {
        let (got, stderr) = into_a_closed_pipe(&args);
        assert_eq!(got, Some(code), "{args:?}: stderr {stderr}");
        assert_eq!(stderr, "", "{args:?}");
    }
}

#[test]
fn status_into_a_full_device_is_one_line_and_125() {
    let s = Scratch::new();
    std::fs::create_dir(s.path("locks")).unwrap();
    let url = format!("file://{}", s.path("locks").display());
    let mut cmd = lockrun();
    cmd.args(["status", "--url", &url, "job"])
        .stdout(
            std::fs::File::options()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .stderr(Stdio::piped());
    let (code, stderr) = finish(cmd);
    assert_eq!(code, Some(125), "stderr: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().collect::<Vec<_>>(),
        ["lockrun: cannot write to stdout: No space left on device (os error 28)"]
    );
}
