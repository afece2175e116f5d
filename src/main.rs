//! The `lockrun` binary: everything is in the library (see `lib.rs` for the map).

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(lockrun::main_with(std::env::args_os().collect()))
}
