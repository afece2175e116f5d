//! The fencing examples (`packaging/examples/`) run under lockrun against a real Redis
//! and a private PostgreSQL cluster, refuse a stale token, and appear in
//! `docs/fencing.md` as they are.

use std::process::Command;

use super::{read, root};
use crate::support::*;

/// The fencing examples that `docs/fencing.md` shows and a test runs.
const FENCING_EXAMPLES: [&str; 2] = [
    "packaging/examples/fenced-write-postgres.sh",
    "packaging/examples/fenced-write-redis.sh",
];

/// The page that shows them.
const FENCING_PAGE: &str = "docs/fencing.md";

#[test]
fn the_fencing_page_shows_the_fencing_examples_as_they_are() {
    let page = read(FENCING_PAGE);
    for rel in FENCING_EXAMPLES {
        let script = read(rel);
        assert!(
            page.contains(&script),
            "{FENCING_PAGE} does not show {rel} verbatim: copy the file into its code block"
        );
    }
}

/// Runs a fencing example under lockrun and returns lockrun's result.
fn run_fenced(url: &str, script: &str, env: &[(&str, &str)]) -> Finished {
    let path = root().join(script);
    let mut cmd = lockrun_run(url, "report", &[], &["sh", path.to_str().expect("utf-8")]);
    cmd.envs(env.iter().copied());
    run(cmd)
}

/// Runs a fencing example as a holder that lost the lock long ago would: with a stale
/// token, and no lockrun around it.
fn run_stale(script: &str, token: u64, env: &[(&str, &str)]) -> Finished {
    let mut cmd = Command::new("sh");
    cmd.arg(root().join(script))
        .env("LOCKRUN_FENCING_TOKEN", token.to_string())
        .envs(env.iter().copied());
    run(cmd)
}

#[test]
fn the_redis_fencing_example_refuses_a_stale_token() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [("DATA_REDIS_URL", url.as_str())];
    let script = FENCING_EXAMPLES[1];
    let fence = || -> u64 {
        let fence = redis
            .hget("report:result", "fence")
            .expect("no result written");
        fence.parse().expect("a numeric fence")
    };
    run_fenced(&url, script, &env).assert_code(0);
    let first = fence();
    let body = redis.hget("report:result", "body");
    let stale = run_stale(script, first - 1, &env);
    stale.assert_code(1);
    assert!(
        stale.stderr.contains("stale fencing token"),
        "{}",
        stale.stderr
    );
    assert_eq!(
        (fence(), redis.hget("report:result", "body")),
        (first, body)
    );
    run_fenced(&url, script, &env).assert_code(0);
    assert!(fence() > first, "the next holder's write did not land");
}

/// A schema in a private PostgreSQL cluster for one test (stopped with it).
struct PgSchema {
    _server: PrivatePg,
    url: String,
    name: String,
}

impl PgSchema {
    fn create() -> PgSchema {
        let server = PrivatePg::start();
        let url = format!("postgresql://postgres@127.0.0.1:{}/postgres", server.port());
        let name = "lockrun_docs".to_owned();
        let schema = PgSchema {
            _server: server,
            url,
            name,
        };
        schema.psql(&format!("CREATE SCHEMA {}", schema.name));
        schema
    }

    /// The environment that makes the example's unqualified table land in this schema.
    fn env(&self) -> [(&'static str, String); 2] {
        [
            ("DATABASE_URL", self.url.clone()),
            ("PGOPTIONS", format!("-c search_path={}", self.name)),
        ]
    }

    fn psql(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args([
                self.url.as_str(),
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .args(["-c", sql])
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql ({e}): install postgresql-client"));
        assert!(
            out.status.success(),
            "psql {} -c {sql:?} failed: {}",
            self.url,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

#[test]
fn the_postgres_fencing_example_refuses_a_stale_token() {
    let redis = RedisServer::start();
    let schema = PgSchema::create();
    let env = schema.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let script = FENCING_EXAMPLES[0];
    let row = || schema.psql(&format!("SELECT fence, body FROM {}.report", schema.name));
    let fence = |row: &str| -> u64 {
        let fence = row.split('|').next().expect("a row");
        fence.parse().expect("a numeric fence")
    };
    run_fenced(&redis.url(), script, &env).assert_code(0);
    let first = row();
    let stale = run_stale(script, fence(&first) - 1, &env);
    stale.assert_code(1);
    assert!(
        stale.stderr.contains("stale fencing token"),
        "{}",
        stale.stderr
    );
    assert_eq!(row(), first, "a stale token changed the row");
    run_fenced(&redis.url(), script, &env).assert_code(0);
    assert!(
        fence(&row()) > fence(&first),
        "the next holder's write did not land"
    );
}
