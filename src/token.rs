//! Random values from the operating system's CSPRNG (`getrandom(2)`): the lock token
//! that proves ownership, waiter ids and jitter. Depends on nothing else in the crate.

/// `bytes` random bytes as lower-case hex. If the OS generator fails (it does not on
/// Linux after early boot), the process cannot prove ownership safely, so it aborts
/// with a message rather than fall back to a guessable value.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    if getrandom::fill(&mut buf).is_err() {
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
    let _ = getrandom::fill(&mut buf);
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
}
