//! lockrun's developer tasks. Today one: the files generated from the command line
//! definitions in lockrun's `src/cli.rs`, rendered in memory here:
//!
//! - `man/lockrun.1`, from clap and the hand-written `man/sections.roff` (see `man`);
//! - the bash, zsh and fish completions under `packaging/completions/`, from
//!   `clap_complete`.
//!
//! `cargo xtask docs` (the binary, through the alias in `.cargo/config.toml`) writes them;
//! this crate's tests compare them with the committed files. Nothing here is a
//! dependency of the lockrun binary.

mod man;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;
use lockrun::cli::Cli;

pub use man::man_page;

/// The man page, relative to the workspace root.
pub const MAN_PAGE: &str = "man/lockrun.1";

/// The hand-written sections appended to the generated part of the man page.
pub const MAN_SECTIONS: &str = "man/sections.roff";

/// Where each shell's completion script lives.
pub const COMPLETIONS: [(Shell, &str); 3] = [
    (Shell::Bash, "packaging/completions/lockrun.bash"),
    (Shell::Zsh, "packaging/completions/_lockrun"),
    (Shell::Fish, "packaging/completions/lockrun.fish"),
];

/// The command that writes the generated files.
pub const REGENERATE: &str = "cargo xtask docs";

/// One generated file.
pub struct Generated {
    /// Its path, relative to the workspace root.
    pub path: &'static str,
    /// What it should hold.
    pub text: String,
}

/// The workspace root: the folder of lockrun's `Cargo.toml`, above this crate.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in a folder of the workspace")
        .to_path_buf()
}

/// One shell's completion script.
pub fn completion(shell: Shell) -> String {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "lockrun", &mut buf);
    String::from_utf8(buf).expect("completion is UTF-8")
}

/// Every generated file, rendered from the clap definitions and the hand-written
/// sections under `root`.
pub fn generate(root: &Path) -> io::Result<Vec<Generated>> {
    let sections = fs::read_to_string(root.join(MAN_SECTIONS))?;
    let mut files = vec![Generated {
        path: MAN_PAGE,
        text: man_page(&sections),
    }];
    files.extend(COMPLETIONS.map(|(shell, path)| Generated {
        path,
        text: completion(shell),
    }));
    Ok(files)
}

/// Writes every generated file under `root`; returns their paths.
pub fn write(root: &Path) -> io::Result<Vec<&'static str>> {
    let mut written = Vec::new();
    for file in generate(root)? {
        let path = root.join(file.path);
        if let Some(folder) = path.parent() {
            fs::create_dir_all(folder)?;
        }
        fs::write(&path, &file.text)?;
        written.push(file.path);
    }
    Ok(written)
}

/// Why the committed copy of `file` under `root` is not what generating gives (with the
/// first line that differs and how to fix it), or `None` when it is.
pub fn stale(root: &Path, file: &Generated) -> Option<String> {
    let how_to_fix = format!(
        "run `{REGENERATE}` and commit {} (it is generated from src/cli.rs and \
         {MAN_SECTIONS}; do not edit it by hand)",
        file.path
    );
    let committed = match fs::read_to_string(root.join(file.path)) {
        Ok(text) => text,
        Err(e) => return Some(format!("{} cannot be read ({e}): {how_to_fix}", file.path)),
    };
    if committed == file.text {
        return None;
    }
    let (old, new): (Vec<_>, Vec<_>) = (committed.lines().collect(), file.text.lines().collect());
    let line = old
        .iter()
        .zip(&new)
        .position(|(c, g)| c != g)
        .unwrap_or(old.len().min(new.len()));
    let at = |lines: &[&str]| {
        lines
            .get(line)
            .copied()
            .unwrap_or("<end of file>")
            .to_owned()
    };
    Some(format!(
        "{} is out of date with the clap definitions: first difference at line {}\n\
         committed: {:?}\ngenerated: {:?}\n{how_to_fix}",
        file.path,
        line + 1,
        at(&old),
        at(&new),
    ))
}
