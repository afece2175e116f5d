//! `lockrun list [PATTERN]`: every lock name under the key prefix that is held or has
//! a record of its last run, one line each (or a JSON array of `status --json`
//! objects). The backend gives the names ([`Backend::names`]); each is then asked for
//! its holders and record as `status` asks, so the cost grows with the names under
//! the prefix only. A name held with another `--slots` N than the one given is asked
//! again as one of N slots, so every holder of a semaphore is listed without knowing
//! its N. Part of [`super`].

use serde_json::Value;

use super::{error, print_lines, TIMEOUT};
use crate::backend::url::BackendConfig;
use crate::backend::{AnyBackend, Backend, BackendError, Holder, RunRecord};
use crate::holder::{status_json, status_text};
use crate::outcome::Outcome;

/// One listed name: its holders (by slot) and its last run.
struct Listed {
    name: String,
    holders: Vec<Holder>,
    last: Option<RunRecord>,
}

/// `lockrun list`: prints the names matching `pattern` (a glob: `*`, `?`, `[...]`;
/// every name without one) that are held or have a last run, sorted by name;
/// [`Outcome::Listed`] (0), or [`Outcome::Failed`] (125) if the backend failed.
pub async fn list(cfg: &BackendConfig, pattern: Option<&str>, as_json: bool) -> Outcome {
    let listed = match gather(cfg, pattern).await {
        Ok(l) => l,
        Err(e) => return error(&e),
    };
    if as_json {
        let all: Vec<Value> = listed
            .iter()
            .map(|l| status_json(&l.name, slots_of(&l.holders), &l.holders, l.last.as_ref()))
            .collect();
        print_lines(&[Value::Array(all).to_string()], Outcome::Listed)
    } else {
        let lines: Vec<String> = listed
            .iter()
            .map(|l| {
                let text = status_text(&l.name, slots_of(&l.holders), &l.holders, l.last.as_ref());
                let parts: Vec<&str> = text.lines().map(str::trim).collect();
                parts.join("; ")
            })
            .collect();
        print_lines(&lines, Outcome::Listed)
    }
}

/// The names matching `pattern` with their holders and records, sorted by name; the
/// names with neither are left out (a name the backend lists may have been freed and
/// its record expired since).
async fn gather(cfg: &BackendConfig, pattern: Option<&str>) -> Result<Vec<Listed>, String> {
    let backend = AnyBackend::open(cfg, false);
    let mut names = ask(backend.names()).await?;
    // What is stored under the prefix is not always lockrun's: a name lockrun could
    // not have written is left out.
    names.retain(|n| crate::name::LockName::parse(n).is_ok());
    names.retain(|n| pattern.is_none_or(|p| glob(p.as_bytes(), n.as_bytes())));
    names.sort();
    names.dedup();
    let mut listed = Vec::with_capacity(names.len());
    for name in names {
        let mut holders = holders(cfg, &backend, &name).await?;
        holders.sort_by_key(|h| h.slot);
        let last = ask(backend.last_run(&name)).await?;
        if !holders.is_empty() || last.is_some() {
            listed.push(Listed {
                name,
                holders,
                last,
            });
        }
    }
    Ok(listed)
}

/// The holders of `name`; held with another N than `cfg`'s, asked again as one of N.
async fn holders(
    cfg: &BackendConfig,
    backend: &AnyBackend,
    name: &str,
) -> Result<Vec<Holder>, String> {
    let theirs = match within(backend.inspect(name)).await? {
        Ok(h) => match h.iter().map(|h| h.slots).find(|&n| n != cfg.slots) {
            None => return Ok(h),
            Some(n) => n,
        },
        Err(BackendError::SlotsConflict { theirs, .. }) => theirs,
        Err(e) => return Err(e.to_string()),
    };
    let as_theirs = BackendConfig {
        slots: theirs,
        ..cfg.clone()
    };
    ask(AnyBackend::open(&as_theirs, false).inspect(name)).await
}

/// One request, within [`TIMEOUT`].
async fn ask<T>(
    request: impl std::future::Future<Output = Result<T, BackendError>>,
) -> Result<T, String> {
    within(request).await?.map_err(|e| e.to_string())
}

/// One request's answer, or the line of a backend that did not answer within
/// [`TIMEOUT`].
async fn within<T>(
    request: impl std::future::Future<Output = Result<T, BackendError>>,
) -> Result<Result<T, BackendError>, String> {
    tokio::time::timeout(TIMEOUT, request)
        .await
        .map_err(|_| "the backend did not answer within 5s".into())
}

/// The N the holders were taken with (1 when free).
fn slots_of(holders: &[Holder]) -> u32 {
    holders.first().map_or(1, |h| h.slots)
}

/// Whether `name` matches the shell glob `pattern`: `*` any run of bytes, `?` one
/// byte, `[abc]`, `[a-z]` and `[!...]` one byte of (or not of) a set, `\\x` the byte
/// `x`; anything else itself. (Lock names are ASCII.)
pub(super) fn glob(pattern: &[u8], name: &[u8]) -> bool {
    // Backtracking on the last `*` only: linear in practice, never exponential.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
                continue;
            }
            Some(_) => {
                if let Some(next) = one(pattern, p, name[n]) {
                    p = next;
                    n += 1;
                    continue;
                }
            }
            None => {}
        }
        match star {
            Some((sp, sn)) => {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// Matches byte `c` against the single-byte item at `pattern[p]` (`?`, a set, an
/// escaped or a plain byte); the index after the item if it matches.
fn one(pattern: &[u8], p: usize, c: u8) -> Option<usize> {
    match pattern[p] {
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == c).then_some(p + 2),
        b'[' => {
            let (hit, end) = set(pattern, p + 1, c)?;
            hit.then_some(end)
        }
        b => (b == c).then_some(p + 1),
    }
}

/// A set from just after its `[`: whether `c` is in it, and the index after its `]`;
/// `None` if it has no `]` (then `[` is no set; see [`one`]'s caller).
fn set(pattern: &[u8], mut p: usize, c: u8) -> Option<(bool, usize)> {
    let negated = matches!(pattern.get(p), Some(b'!' | b'^'));
    if negated {
        p += 1;
    }
    let mut hit = false;
    let mut first = true;
    while let Some(&b) = pattern.get(p) {
        if b == b']' && !first {
            return Some((hit != negated, p + 1));
        }
        first = false;
        if pattern.get(p + 1) == Some(&b'-') && pattern.get(p + 2).is_some_and(|&e| e != b']') {
            hit |= (b..=pattern[p + 2]).contains(&c);
            p += 3;
        } else {
            hit |= b == c;
            p += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::glob;

    fn m(p: &str, n: &str) -> bool {
        glob(p.as_bytes(), n.as_bytes())
    }

    #[test]
    fn globs_match_as_the_shell_does() {
        assert!(m("*", "report"));
        assert!(m("rep*", "report"));
        assert!(m("*port", "report"));
        assert!(m("r*p*t", "report"));
        assert!(!m("r*p*x", "report"));
        assert!(m("job?", "job1"));
        assert!(!m("job?", "job"));
        assert!(m("job[0-9]", "job7"));
        assert!(!m("job[!0-9]", "job7"));
        assert!(m("job[ab]", "jobb"));
        assert!(m("a\\*b", "a*b"));
        assert!(!m("a\\*b", "axb"));
        assert!(m("deploy/*", "deploy/web"));
        assert!(!m("deploy", "deploy/web"));
        assert!(m("", "") && !m("", "a"));
        // A `[` without its `]` is no set and matches nothing.
        assert!(!m("a[b", "a[b"));
    }

    #[test]
    fn many_stars_on_a_long_name_do_not_blow_up() {
        let name = "a".repeat(200);
        let pattern = format!("{}b", "*a".repeat(50));
        assert!(!m(&pattern, &name));
    }
}
