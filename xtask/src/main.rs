//! `cargo xtask TASK`: lockrun's developer tasks (the alias is in `.cargo/config.toml`).
//!
//! - `docs`: writes `man/lockrun.1` and the shell completions under
//!   `packaging/completions/`, generated from `src/cli.rs` and `man/sections.roff`.

use std::process::ExitCode;

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("docs") => match xtask::write(&xtask::root()) {
            Ok(written) => {
                for path in written {
                    println!("wrote {path}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask docs: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: cargo xtask docs   (writes the man page and the completions)");
            ExitCode::from(2)
        }
    }
}
