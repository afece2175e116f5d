//! Random values from the operating system's CSPRNG (`getrandom(2)`): the lock token
//! that proves ownership, waiter ids and jitter. Depends on nothing else in the crate.

use nix::libc;

/// Fills `buf` from the kernel's generator with `getrandom(2)` itself. The `getrandom`
/// crate finds the C library's function with `dlsym`, which finds nothing in a
/// statically linked program (README's install build): it then polls `/dev/random` and
/// reads `/dev/urandom`, five system calls instead of one on every run. The crate still
/// serves where the kernel refuses the call (ENOSYS before Linux 3.17, EPERM from a
/// seccomp filter).
#[allow(unsafe_code)]
pub fn fill(buf: &mut [u8]) -> Result<(), getrandom::Error> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the kernel writes at most `rest.len()` bytes into `rest`.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(n) {
            Ok(n) => done += n,
            Err(_) => match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => {}
                _ => return getrandom::fill(rest),
            },
        }
    }
    Ok(())
}

/// `bytes` random bytes as lower-case hex. If the OS generator fails (it does not on
/// Linux after early boot), the process cannot prove ownership safely, so it aborts
/// with a message rather than fall back to a guessable value.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    if fill(&mut buf).is_err() {
        eprintln!(
            "lockrun: the operating system's random generator failed; cannot make a lock token"
        );
        std::process::exit(125);
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// A random number, for jitter.
pub fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    let _ = fill(&mut buf);
    u64::from_le_bytes(buf)
}

/// A new lock token: 128 random bits.
pub fn lock_token() -> String {
    random_hex(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_hex_and_differ() {
        let a = lock_token();
        let b = lock_token();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn fill_fills_every_byte() {
        // A working generator leaves 16 bytes in a row at zero once in 2^128.
        let mut buf = vec![0u8; 4096];
        fill(&mut buf).unwrap();
        assert!(buf.chunks(16).all(|c| c.iter().any(|&b| b != 0)));
    }
}
