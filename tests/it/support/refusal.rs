//! The one harness for refused set-ups (docs/guarantees.md: a set-up that cannot work is
//! refused at once, in one line, before the command runs): a [`Refusal`] says how lockrun
//! is pointed at a server and what its line must and must not say; [`Refusal::check`]
//! runs it and asserts the rest through [`Finished::assert_refused_in_one_line`].

use std::time::Duration;

use super::{lockrun_run, sh, spawn, Finished, Scratch};

/// One refused set-up: how lockrun is pointed at a server, and what its line must say.
pub struct Refusal {
    /// Names the case in a failure.
    pub what: &'static str,
    /// The `--url`.
    pub url: String,
    /// Environment variables besides the URL (passwords, TLS files, `HOME`).
    pub env: Vec<(&'static str, String)>,
    /// What the line must hold.
    pub says: Vec<&'static str>,
    /// What the line must not hold (besides the secrets given to [`Refusal::check`]).
    pub never: Vec<&'static str>,
}

impl Refusal {
    /// Runs lockrun on the case's URL with `opts` and its environment, for a command that
    /// marks that it ran, and asserts: the command did not run; exit 125 and one line,
    /// given within `within`, holding every `says` and none of `never` nor `secrets`
    /// (passwords, key material), and no Rust debug formatting (`()`). The run itself
    /// may take up to 20 s before it counts as hung.
    pub fn check(&self, opts: &[&str], within: Duration, secrets: &[&str]) -> Finished {
        let s = Scratch::new();
        let mut cmd = lockrun_run(&self.url, "job", opts, &sh(r#"touch "$RAN""#));
        cmd.env("RAN", s.path("ran"));
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let f = spawn(cmd).wait_for(Duration::from_secs(20));
        let what = format!("{} {opts:?}", self.what);
        assert!(!s.exists("ran"), "{what}: the command ran");
        let never: Vec<&str> = self
            .never
            .iter()
            .copied()
            .chain(secrets.iter().copied())
            .chain(["()"])
            .collect();
        f.assert_refused_in_one_line(&what, within, &self.says, &never);
        f
    }
}
