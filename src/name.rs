//! The lock name and its rule, which every backend's keys rely on. A leaf: it depends
//! on nothing in the crate.

use thiserror::Error;

/// A name that breaks the rule (the first 64 characters of it).
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid lock name {0:?}: use 1 to 200 bytes of A-Z a-z 0-9 . _ - : /")]
pub struct BadName(String);

/// A valid lock name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockName(String);

impl LockName {
    /// Checks the naming rule: 1 to 200 bytes of `A-Z a-z 0-9 . _ - : /`.
    pub fn parse(name: &str) -> Result<LockName, BadName> {
        let ok_char =
            |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/');
        if (1..=200).contains(&name.len()) && name.chars().all(ok_char) {
            Ok(LockName(name.to_owned()))
        } else {
            Err(BadName(name.chars().take(64).collect()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_follow_the_rule() {
        for good in ["job", "a", "nightly/backup:db-1.v2_x", &"x".repeat(200)] {
            assert!(LockName::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "has space",
            "semi;colon",
            "{brace}",
            "ünï",
            &"x".repeat(201),
        ] {
            assert!(LockName::parse(bad).is_err(), "{bad}");
        }
    }
}
