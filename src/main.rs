//! The `lockrun` binary: everything is in the library (see `lib.rs` for the map).
//!
//! Its `main` is the C one, not Rust's: Rust's start-up would find the main thread's
//! stack guard by reading `/proc/self/maps` and set up a signal stack for a message on
//! stack overflow, on every run (about a tenth of lockrun's own start-up, on the way of
//! every locked command). [`lockrun::prepare_process`] does the rest of what it does
//! (descriptors 0 to 2 open, SIGPIPE ignored); `std::process::exit` flushes stdout.
//! Command-line arguments still come from glibc (Rust reads them at load time).
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
#[allow(unsafe_code)]
// SAFETY: the one C `main` of this program, called by the C library's start-up with the
// usual arguments, which it does not use.
#[no_mangle]
extern "C" fn main(_argc: i32, _argv: *const *const u8) -> i32 {
    lockrun::prepare_process();
    let code = lockrun::main_with(std::env::args_os().collect());
    std::process::exit(i32::from(code))
}
