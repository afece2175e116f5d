//! Lock names to file names: one file per (`--key-prefix`, `NAME`) pair, injective by
//! construction and always a safe single path component. Part of [`super`]; depends on
//! nothing else.
//!
//! The file name is `ENC(prefix)` `=` `ENC(name)`, where `ENC` keeps the bytes
//! `A-Z a-z 0-9 - _ : .` as they are, writes `/` as `+` and every other byte as `%`
//! and two lower-case hex digits (`=` is `%3d`, `+` is `%2b`, `%` is `%25`), and escapes
//! a `.` that would begin the file name. So:
//! - `=` appears exactly once, between the two parts: the pair can be read back from
//!   the file name, and two different pairs never share a file (`a:` + `b` is
//!   `a:=b`, `a` + `:b` is `a=:b`; `a/b`, `a:b`, `a_b` are `a+b`, `a:b`, `a_b`);
//! - no file name is `.` or `..`, begins with `.` (lock files are never hidden, and
//!   the backend's own temporary files, which are, never clash with one), or holds `/`;
//! - a lock name (1 to 200 bytes of `A-Z a-z 0-9 . _ - : /`) keeps its length, so the
//!   file name fits the 255 bytes of a Linux file name when the prefix takes at most
//!   [`MAX_PREFIX`] bytes once written this way.
//!
//! The record of the lock's last run (`super::last`) is the file of the same name with
//! `@` in place of `=` ([`record_file_name`]): of the same length, so it fits whenever
//! the lock file does, never a lock file's name (which has an `=`, and no `@`: `ENC`
//! writes `@` as `%40`), never another pair's record, and never hidden.

/// The most bytes the written form of `--key-prefix` may take: 255 (the longest file
/// name) − 1 (`=`) − 200 (the longest lock name).
pub const MAX_PREFIX: usize = 54;

/// The longest file name Linux file systems take.
const MAX_FILE_NAME: usize = 255;

/// The file name of lock `name` under `prefix`, or `None` if it would be longer than
/// a file name may be (a prefix longer than [`MAX_PREFIX`] allows, see [`check_prefix`]).
pub fn file_name(prefix: &str, name: &str) -> Option<String> {
    let mut out = encode(prefix, true);
    out.push('=');
    out.push_str(&encode(name, false));
    (out.len() <= MAX_FILE_NAME).then_some(out)
}

/// The file name of the record of lock `name`'s last run under `prefix`: the lock
/// file's name with `@` for its `=` (see the module documentation); `None` when the
/// lock file's name would be too long.
pub fn record_file_name(prefix: &str, name: &str) -> Option<String> {
    file_name(prefix, name).map(|f| f.replacen('=', "@", 1))
}

/// The lock name whose lock file or record file under `prefix` is `file`, if it is
/// one (the inverse of [`file_name`] and [`record_file_name`]).
pub fn name_of(prefix: &str, file: &str) -> Option<String> {
    let rest = file.strip_prefix(&encode(prefix, true))?;
    let name = rest.strip_prefix('=').or_else(|| rest.strip_prefix('@'))?;
    let mut bytes = Vec::with_capacity(name.len());
    let mut it = name.bytes();
    while let Some(b) = it.next() {
        match b {
            b'%' => {
                let hex = [it.next()?, it.next()?];
                bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b'+' => bytes.push(b'/'),
            b'=' | b'@' => return None,
            b => bytes.push(b),
        }
    }
    let name = String::from_utf8(bytes).ok()?;
    // Only what `encode` writes reads back: no other spelling of the same name.
    (file == file_name(prefix, &name)? || file == record_file_name(prefix, &name)?).then_some(name)
}

/// Checks that `prefix` leaves room for every lock name; the refusal says what to do.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    let len = encode(prefix, true).len();
    if len > MAX_PREFIX {
        return Err(format!(
            "--key-prefix is too long for the file backend: it becomes {len} bytes of the \
             lock file's name, at most {MAX_PREFIX} fit (bytes other than A-Z a-z 0-9 - _ : . / \
             take 3 each); use a shorter prefix"
        ));
    }
    Ok(())
}

/// `s` written as described in the module documentation; `first` says that `s` begins
/// the file name (a leading `.` is escaped).
fn encode(s: &str, first: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'.' if first && i == 0 => out.push_str("%2e"),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b':' | b'.' => {
                out.push(b as char)
            }
            b'/' => out.push('+'),
            _ => out.push_str(&format!("%{b:02x}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The pair a file name was made from: the inverse of [`file_name`] (and, with
    /// `sep` `@`, of [`record_file_name`]), which proves it injective.
    fn decode(file: &str, sep: char) -> Option<(String, String)> {
        let (prefix, name) = file.split_once(sep)?;
        Some((decode_part(prefix)?, decode_part(name)?))
    }

    fn decode_part(s: &str) -> Option<String> {
        let mut bytes = Vec::new();
        let mut it = s.bytes();
        while let Some(b) = it.next() {
            match b {
                b'%' => {
                    let hex = [it.next()?, it.next()?];
                    let hex = std::str::from_utf8(&hex).ok()?;
                    bytes.push(u8::from_str_radix(hex, 16).ok()?);
                }
                b'+' => bytes.push(b'/'),
                b'=' | b'@' => return None,
                b => bytes.push(b),
            }
        }
        String::from_utf8(bytes).ok()
    }

    /// Every string of up to `len` characters of `alphabet`.
    fn strings(alphabet: &[&str], len: usize) -> Vec<String> {
        let mut all = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..len {
            last = last
                .iter()
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            all.extend(last.iter().cloned());
        }
        all
    }

    #[test]
    fn the_name_reads_back_from_its_lock_and_record_files_only() {
        for (prefix, name) in [("lockrun:", "a/b:c"), (".x", "report"), ("p=q", "j-1.2_3")] {
            let lock = file_name(prefix, name).unwrap();
            let record = record_file_name(prefix, name).unwrap();
            assert_eq!(name_of(prefix, &lock).as_deref(), Some(name));
            assert_eq!(name_of(prefix, &record).as_deref(), Some(name));
            assert_eq!(name_of("other:", &lock), None);
        }
        // Another spelling of the same name is not lockrun's file.
        assert_eq!(name_of("p:", "p:=a%2fb"), None);
        assert_eq!(name_of("p:", "p:=a%2"), None);
        assert_eq!(name_of("p:", ".p:=a.tmp"), None);
    }

    #[test]
    fn tricky_pairs_get_different_files() {
        let pairs = [
            ("a:", "b"),
            ("a", ":b"),
            ("a/", "b"),
            ("a", "/b"),
            ("", "a/b"),
            ("", "a:b"),
            ("", "a_b"),
            ("a=", "b"),
            ("a+", "b"),
            ("a%2f", "b"),
            ("a%", "2fb"),
            (".", "x"),
            ("%2e", "x"),
            ("lockrun:", "x"),
            ("lockrun", ":x"),
        ];
        let mut seen = HashMap::new();
        for (prefix, name) in pairs {
            let file = file_name(prefix, name).unwrap();
            if let Some(other) = seen.insert(file.clone(), (prefix, name)) {
                panic!("{other:?} and {:?} share {file}", (prefix, name));
            }
        }
        assert_eq!(file_name("", "a/b").unwrap(), "=a+b");
        assert_eq!(record_file_name("", "a/b").unwrap(), "@a+b");
        assert_eq!(record_file_name("a@", "b").unwrap(), "a%40@b");
        assert_eq!(
            file_name("lockrun:", "team/job").unwrap(),
            "lockrun:=team+job"
        );
    }

    #[test]
    fn every_short_pair_reads_back_so_no_two_pairs_share_a_file() {
        let prefixes = strings(&["a", ".", "/", ":", "_", "=", "%", "+", "-", "é"], 3);
        let names = strings(&["a", ".", "/", ":", "_", "-"], 3);
        let mut seen = std::collections::HashSet::new();
        for p in &prefixes {
            for n in names.iter().filter(|n| !n.is_empty()) {
                let file = file_name(p, n).unwrap();
                assert_eq!(decode(&file, '='), Some((p.clone(), n.clone())), "{file}");
                let record = record_file_name(p, n).unwrap();
                assert_eq!(
                    decode(&record, '@'),
                    Some((p.clone(), n.clone())),
                    "{record}"
                );
                assert!(!record.contains('=') && !file.contains('@'), "{record}");
                assert!(seen.insert(file) && seen.insert(record));
            }
        }
    }

    #[test]
    fn no_name_makes_a_hidden_file_a_path_or_a_name_too_long() {
        let longest_prefix = "p".repeat(MAX_PREFIX);
        let long_names = ["/".repeat(200), ".".repeat(200), "a".repeat(200)];
        for prefix in ["", ".", "..", "/", "a/..", &longest_prefix] {
            for name in [".", "..", "../x", "/", "a/../b", ".hidden"]
                .into_iter()
                .chain(long_names.iter().map(String::as_str))
            {
                let file = file_name(prefix, name).unwrap();
                assert!(!file.starts_with('.'), "{file}");
                assert!(!file.contains('/') && !file.contains('\0'), "{file}");
                assert!(file.len() <= MAX_FILE_NAME, "{}", file.len());
                let record = record_file_name(prefix, name).unwrap();
                assert!(!record.starts_with('.') && record.len() == file.len());
            }
        }
    }

    #[test]
    fn a_prefix_too_long_for_every_name_is_refused() {
        assert!(check_prefix("lockrun:").is_ok());
        assert!(check_prefix(&"p".repeat(MAX_PREFIX)).is_ok());
        let e = check_prefix(&"p".repeat(MAX_PREFIX + 1)).unwrap_err();
        assert!(e.contains("--key-prefix") && e.contains("54"), "{e}");
        // An escaped byte takes three: 18 of them fit, 19 do not.
        assert!(check_prefix(&"=".repeat(18)).is_ok());
        assert!(check_prefix(&"=".repeat(19)).is_err());
        assert!(check_prefix(&"/".repeat(MAX_PREFIX)).is_ok());
        assert_eq!(
            file_name(&"p".repeat(MAX_PREFIX + 1), &"a".repeat(200)),
            None
        );
        assert_eq!(
            record_file_name(&"p".repeat(MAX_PREFIX + 1), &"a".repeat(200)),
            None
        );
    }
}
