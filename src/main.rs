//! The `lockrun` binary: everything is in the library (see `lib.rs` for the map).
//!
//! Its `main` is the C one, not Rust's: Rust's start-up would find the main thread's
//! stack guard by reading `/proc/self/maps` and set up a signal stack for a message on
//! stack overflow, on every run (about a tenth of lockrun's own start-up, on the way of
//! every locked command). [`lockrun::prepare_process`] does the rest of what it does
//! (descriptors 0 to 2 open, SIGPIPE ignored); `std::process::exit` flushes stdout.
//! The arguments are the ones the C library passes to `main`, whatever the C library.
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
#[allow(unsafe_code)]
// SAFETY: the one C `main` of this program, called once by the C library's start-up
// with `argc` pointers to NUL-terminated strings in `argv`, alive for the whole run.
#[no_mangle]
extern "C" fn main(argc: i32, argv: *const *const std::ffi::c_char) -> i32 {
    use std::os::unix::ffi::OsStringExt;
    lockrun::prepare_process();
    let args = (0..usize::try_from(argc).unwrap_or(0))
        .map(|i| {
            // SAFETY: `i` < `argc`, so `argv[i]` is one of the C library's strings.
            let arg = unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) };
            std::ffi::OsString::from_vec(arg.to_bytes().to_vec())
        })
        .collect();
    let code = lockrun::main_with(args);
    std::process::exit(i32::from(code))
}
