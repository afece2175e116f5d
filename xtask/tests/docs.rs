//! The committed man page and completions are what `cargo xtask docs` writes now (a
//! change to `src/cli.rs` or `man/sections.roff` must come with them regenerated), and
//! the man page renders without a warning.

use std::io::Write;
use std::process::{Command, Stdio};

use xtask::{generate, root, stale, MAN_PAGE};

/// Panics, saying how to fix it, unless the committed `path` is up to date.
fn assert_up_to_date(path: &str) {
    let root = root();
    let files = generate(&root).expect("read man/sections.roff");
    let file = files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} is not generated"));
    if let Some(why) = stale(&root, file) {
        panic!("{why}");
    }
}

#[test]
fn man_page_is_up_to_date() {
    assert_up_to_date(MAN_PAGE);
}

#[test]
fn bash_completion_is_up_to_date() {
    assert_up_to_date("packaging/completions/lockrun.bash");
}

#[test]
fn zsh_completion_is_up_to_date() {
    assert_up_to_date("packaging/completions/_lockrun");
}

#[test]
fn fish_completion_is_up_to_date() {
    assert_up_to_date("packaging/completions/lockrun.fish");
}

#[test]
fn man_page_renders_without_groff_warnings() {
    let sections = std::fs::read_to_string(root().join(xtask::MAN_SECTIONS)).expect("read");
    let page = xtask::man_page(&sections);
    let mut groff = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run groff ({e}): install Debian's groff-base (.ci/run does)")
        });
    groff
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("write to groff");
    let out = groff.wait_with_output().expect("wait for groff");
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && warnings.trim().is_empty(),
        "groff -man -ww finds problems in the man page ({}):\n{warnings}",
        out.status
    );
}
