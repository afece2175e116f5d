//! Redis behind Sentinel (`redis+sentinel://`): lockrun asks the Sentinels for the
//! master, follows a failover, and keeps fencing tokens increasing across it; a
//! semaphore's slots and its limit key live on across it too. Sentinels with a password
//! of their own (the URL's, `LOCKRUN_PASSWORD` or `LOCKRUN_SENTINEL_PASSWORD`), and
//! `rediss+sentinel://` (TLS to the Sentinels and the master, across a failover too).

use std::time::Duration;

use crate::support::*;

/// How long the Sentinel waits for a silent master before failing it over.
const DOWN_AFTER: Duration = Duration::from_millis(500);

/// The fencing token `server` holds for "job", if any.
fn fence_on(server: &RedisServer) -> Option<String> {
    server.query(redis::cmd("GET").arg(fence_key("job")))
}

fn token_run(url: &str, s: &Scratch, opts: &[&str]) -> u64 {
    let mut cmd = lockrun_run(
        url,
        "job",
        opts,
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    cmd.env("OUT", s.path("out"));
    run(cmd).assert_code(0);
    s.read("out").trim().parse().unwrap()
}

#[test]
fn sentinel_url_locks_on_the_master() {
    let cluster = Sentinel::start(DOWN_AFTER);
    let s = Scratch::new();
    let token = token_run(&cluster.url(), &s, &[]);
    assert!(token > 0);
    // The lock lived on the master, not on the replica the Sentinel also knows.
    let fence = fence_on(cluster.master());
    assert_eq!(fence, Some(token.to_string()));
    let mut status = lockrun();
    status.args(["status", "--url", &cluster.url(), "job"]);
    run(status).assert_code(1);
}

#[test]
fn locking_follows_a_failover_and_tokens_keep_increasing() {
    let mut cluster = Sentinel::start(DOWN_AFTER);
    let s = Scratch::new();
    let before = token_run(&cluster.url(), &s, &[]);
    cluster.kill_master_and_wait_for_failover();
    let after = token_run(&cluster.url(), &s, &["--wait", "20s"]);
    assert!(
        after > before,
        "token {after} after the failover is not above {before}"
    );
    let fence = fence_on(cluster.replica());
    assert_eq!(
        fence,
        Some(after.to_string()),
        "the promoted replica holds the lock now"
    );
}

#[test]
fn a_holder_keeps_its_lock_across_a_failover() {
    let mut cluster = Sentinel::start(DOWN_AFTER);
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &cluster.url(),
        "job",
        &["--ttl", "10s"],
        &sh(r#"touch "$STARTED"; sleep 8; exit 3"#),
    );
    cmd.env("STARTED", s.path("started"));
    let mut holder = spawn(cmd);
    wait_until("the holder started", WAIT, || s.exists("started"));
    // Let the lock reach the replica before the master dies.
    wait_until("the lock is replicated", WAIT, || {
        cluster.replica().exists(&lock_key("job"))
    });
    cluster.kill_master_and_wait_for_failover();
    // Renewals now go to the promoted replica, where the lock (and our token) lives on.
    let f = holder.wait_for(Duration::from_secs(60));
    f.assert_code(3);
}

#[test]
fn an_unknown_master_name_fails_closed() {
    let cluster = Sentinel::start(DOWN_AFTER);
    let s = Scratch::new();
    let url = format!(
        "redis+sentinel://127.0.0.1:{}/nosuchmaster",
        cluster.sentinel_port()
    );
    let mut cmd = lockrun_run(&url, "job", &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(f.stderr.contains("nosuchmaster"), "{}", f.stderr);
    assert!(!s.exists("marker"));
}

#[test]
fn a_semaphores_slots_live_on_across_a_failover() {
    let mut cluster = Sentinel::start(DOWN_AFTER);
    let opts = ["--slots", "2", "--ttl", "10s"];
    let mut holders: Vec<(Running, Scratch)> = (0..2)
        .map(|_| {
            let s = Scratch::new();
            let (lr, _) = hold(lockrun_run(&cluster.url(), "job", &opts, &sh(HOLD)), &s);
            (lr, s)
        })
        .collect();
    assert!(
        cluster.master().exists(&slot_key("job", 1)),
        "slot 1 is not on the master"
    );
    wait_until("the slots are replicated", WAIT, || {
        let r = cluster.replica();
        r.exists(&slot_key("job", 0))
            && r.exists(&slot_key("job", 1))
            && r.exists(&limit_key("job"))
    });
    cluster.kill_master_and_wait_for_failover();
    wait_until("the promoted replica says it is a master", WAIT, || {
        let role: Vec<redis::Value> = cluster.replica().query(&redis::cmd("ROLE"));
        role.first() == Some(&redis::Value::BulkString(b"master".to_vec()))
    });
    // On the promoted replica both slots are held, with the holders' N.
    let s = Scratch::new();
    let mut busy = lockrun_run(
        &cluster.url(),
        "job",
        &["--slots", "2"],
        &sh(r#"touch "$MARKER""#),
    );
    busy.env("MARKER", s.path("marker"));
    run(busy).assert_failure(75);
    let f = run(lockrun_run(
        &cluster.url(),
        "job",
        &[],
        &sh(r#"touch "$MARKER""#),
    ));
    f.assert_failure(125);
    assert!(f.stderr.contains("--slots 2"), "{}", f.stderr);
    assert!(!s.exists("marker"), "a third holder ran");
    for (lr, s) in &mut holders {
        s.touch("go");
        lr.wait_for(Duration::from_secs(60)).assert_code(0);
    }
}

/// How long a refusal may take to be said.
const PROMPT: Duration = Duration::from_secs(2);

/// Runs lockrun on `url` with `env`, expecting it to refuse at once with one line (125),
/// with no password in it (they all end in `-pw`), and not to start the command;
/// returns that line.
fn refused_at_once(what: &'static str, url: &str, env: &[(&'static str, &str)]) -> String {
    let case = Refusal {
        what,
        url: url.to_owned(),
        env: env.iter().map(|&(k, v)| (k, v.to_owned())).collect(),
        says: vec![],
        never: vec!["-pw"],
    };
    case.check(&[], PROMPT, &[]).stderr.trim().to_owned()
}

/// A run whose command writes its environment to `$OUT`.
fn env_run(url: &str, s: &Scratch) -> std::process::Command {
    let mut cmd = lockrun_run(url, "job", &[], &sh(r#"env > "$OUT""#));
    cmd.env("OUT", s.path("out"));
    cmd
}

#[test]
fn sentinels_with_a_password_of_their_own() {
    let cluster = Sentinel::start_secured(
        DOWN_AFTER,
        Security {
            master_password: Some("master-pw".into()),
            sentinel_password: Some("sentinel-pw".into()),
            ..Security::default()
        },
    );
    let sentinel = format!("Sentinel 127.0.0.1:{}", cluster.sentinel_port());
    // The master's password in the URL (given in LOCKRUN_URL, as a job would), the
    // Sentinels' in the variable: it works, and the command sees neither.
    let s = Scratch::new();
    let mut cmd = lockrun();
    cmd.arg("job")
        .arg("--")
        .args(sh(
            r#"echo "$LOCKRUN_FENCING_TOKEN" > "$TOKEN"; env > "$OUT""#,
        ))
        .env("LOCKRUN_URL", cluster.url_with(":master-pw"))
        .env("LOCKRUN_SENTINEL_PASSWORD", "sentinel-pw")
        .env("TOKEN", s.path("token"))
        .env("OUT", s.path("out"));
    run(cmd).assert_code(0);
    let env = s.read("out");
    assert!(
        !env.contains("master-pw") && !env.contains("sentinel-pw"),
        "the command got a password:\n{env}"
    );
    assert!(
        env.contains(&format!("LOCKRUN_URL={}", cluster.url())),
        "LOCKRUN_URL is not passed on cleaned:\n{env}"
    );
    let fence = fence_on(cluster.master());
    assert_eq!(fence.as_deref(), Some(s.read("token").trim()));

    // The master's password in LOCKRUN_PASSWORD; status too.
    let s = Scratch::new();
    let mut cmd = env_run(&cluster.url(), &s);
    cmd.env("LOCKRUN_PASSWORD", "master-pw")
        .env("LOCKRUN_SENTINEL_PASSWORD", "sentinel-pw");
    run(cmd).assert_code(0);
    assert!(!s.read("out").contains("-pw"), "{}", s.read("out"));
    let mut status = lockrun();
    status
        .args(["status", "--url", &cluster.url_with(":master-pw"), "job"])
        .env("LOCKRUN_SENTINEL_PASSWORD", "sentinel-pw");
    run(status).assert_code(1);

    // A wrong Sentinel password: one line, naming the Sentinel.
    let line = refused_at_once(
        "a wrong Sentinel password",
        &cluster.url_with(":master-pw"),
        &[("LOCKRUN_SENTINEL_PASSWORD", "wrong-pw")],
    );
    assert!(
        line.contains(&format!("{sentinel} refused authentication"))
            && line.contains("WRONGPASS")
            && line.contains("LOCKRUN_SENTINEL_PASSWORD"),
        "{line}"
    );

    // No variable: the Sentinel is given the master's password, and says no.
    let line = refused_at_once(
        "the master's password only",
        &cluster.url_with(":master-pw"),
        &[],
    );
    assert!(
        line.contains(&format!("{sentinel} refused authentication"))
            && line.contains("master's user and password")
            && line.contains("LOCKRUN_SENTINEL_PASSWORD"),
        "{line}"
    );

    // No password at all.
    let line = refused_at_once("no password", &cluster.url(), &[]);
    assert!(
        line.contains(&format!("{sentinel} refused authentication"))
            && line.contains("NOAUTH")
            && line.contains("needs a password"),
        "{line}"
    );

    // The Sentinel lets us in, the master does not: the line names the master.
    let line = refused_at_once(
        "a wrong master password",
        &cluster.url(),
        &[
            ("LOCKRUN_PASSWORD", "wrong-pw"),
            ("LOCKRUN_SENTINEL_PASSWORD", "sentinel-pw"),
        ],
    );
    assert!(
        line.contains(&format!(
            "Redis at 127.0.0.1:{} (the Sentinels' mymaster) refused the password",
            cluster.master_proxy().port()
        )),
        "{line}"
    );
    assert!(!line.contains("Sentinel 127.0.0.1"), "{line}");
}

#[test]
fn one_password_for_the_sentinels_and_the_master() {
    let cluster = Sentinel::start_secured(
        DOWN_AFTER,
        Security {
            master_password: Some("shared-pw".into()),
            sentinel_password: Some("shared-pw".into()),
            ..Security::default()
        },
    );
    let s = Scratch::new();
    run(env_run(&cluster.url_with(":shared-pw"), &s)).assert_code(0);
    let mut cmd = env_run(&cluster.url(), &s);
    cmd.env("LOCKRUN_PASSWORD", "shared-pw");
    run(cmd).assert_code(0);
    assert!(!s.read("out").contains("shared-pw"), "{}", s.read("out"));
    assert!(cluster.master().exists(&fence_key("job")));
}

#[test]
fn a_sentinel_without_a_password_answers_when_the_master_has_one() {
    // As before Sentinel passwords: the master's password goes to the Sentinel too,
    // which refuses the AUTH and answers all the same.
    let cluster = Sentinel::start_secured(
        DOWN_AFTER,
        Security {
            master_password: Some("master-pw".into()),
            ..Security::default()
        },
    );
    let s = Scratch::new();
    let token = token_run(&cluster.url_with(":master-pw"), &s, &[]);
    let fence = fence_on(cluster.master());
    assert_eq!(fence, Some(token.to_string()));
}

#[test]
fn rediss_sentinel_speaks_tls_to_the_sentinels_and_the_master() {
    let mut cluster = Sentinel::start_secured(
        DOWN_AFTER,
        Security {
            tls: Some(TlsFiles::generate(false)),
            ..Security::default()
        },
    );
    let url = cluster.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    let ca = cluster.tls_files().path("ca.pem");
    let ca_env = ca.display().to_string();
    // The Sentinel hands out the proxy in front of the master's TLS port: only TLS
    // gets through to the master.
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &url,
        "job",
        &[],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    cmd.env("OUT", s.path("out")).env("LOCKRUN_TLS_CA", &ca);
    run(cmd).assert_code(0);
    let before: u64 = s.read("out").trim().parse().unwrap();
    let fence = fence_on(cluster.master());
    assert_eq!(fence, Some(before.to_string()));

    // Without the CA: the Sentinel's certificate is not trusted, and nothing is sent in
    // plain text instead.
    let line = refused_at_once("no LOCKRUN_TLS_CA", &url, &[]);
    assert!(
        line.contains(&format!("Sentinel {}", url.split('/').nth(2).unwrap()))
            && line.contains("LOCKRUN_TLS_CA"),
        "{line}"
    );

    // The wrong scheme for the port: a line that says which to use.
    let plain_at_tls = url.replace("rediss+sentinel://", "redis+sentinel://");
    let line = refused_at_once("redis+sentinel:// at a TLS port", &plain_at_tls, &[]);
    assert!(
        line.contains("speaks TLS on that port: use rediss+sentinel://"),
        "{line}"
    );
    let tls_at_plain = format!(
        "rediss+sentinel://127.0.0.1:{}/mymaster",
        cluster.sentinel_port()
    );
    let line = refused_at_once(
        "rediss+sentinel:// at a plain port",
        &tls_at_plain,
        &[("LOCKRUN_TLS_CA", &ca_env)],
    );
    assert!(
        line.contains("answers without TLS on that port: use redis+sentinel://"),
        "{line}"
    );

    // After a failover, the promoted replica is reached over TLS too (the Sentinel
    // knows it by its TLS port).
    cluster.kill_master_and_wait_for_failover();
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &url,
        "job",
        &["--wait", "20s"],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    cmd.env("OUT", s.path("out")).env("LOCKRUN_TLS_CA", &ca);
    run(cmd).assert_code(0);
    let after: u64 = s.read("out").trim().parse().unwrap();
    assert!(after > before, "token {after} is not above {before}");
    let fence = fence_on(cluster.replica());
    assert_eq!(fence, Some(after.to_string()));
}

#[test]
fn client_certificates_and_a_sentinel_acl_user() {
    // Every server and the Sentinel demand a client certificate; the Sentinel knows only
    // the ACL user `watcher`, the master has a password of its own.
    let cluster = Sentinel::start_secured(
        DOWN_AFTER,
        Security {
            master_password: Some("master-pw".into()),
            sentinel_user: Some(("watcher".into(), "watcher-pw".into())),
            tls: Some(TlsFiles::generate(true)),
            ..Security::default()
        },
    );
    let file = |name: &str| cluster.tls_files().path(name).display().to_string();
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let s = Scratch::new();
    let mut cmd = env_run(&cluster.url_with(":master-pw"), &s);
    cmd.env("LOCKRUN_TLS_CA", &ca)
        .env("LOCKRUN_TLS_CERT", &cert)
        .env("LOCKRUN_TLS_KEY", &key)
        .env("LOCKRUN_SENTINEL_USER", "watcher")
        .env("LOCKRUN_SENTINEL_PASSWORD", "watcher-pw");
    run(cmd).assert_code(0);
    assert!(!s.read("out").contains("-pw"), "{}", s.read("out"));
    assert!(cluster.master().exists(&fence_key("job")));
    let url = cluster.url_with(":master-pw");

    // The right password for another user of the Sentinel's.
    let line = refused_at_once(
        "another Sentinel user's password",
        &url,
        &[
            ("LOCKRUN_TLS_CA", &ca),
            ("LOCKRUN_TLS_CERT", &cert),
            ("LOCKRUN_TLS_KEY", &key),
            ("LOCKRUN_SENTINEL_USER", "default"),
            ("LOCKRUN_SENTINEL_PASSWORD", "watcher-pw"),
        ],
    );
    assert!(
        line.contains("Sentinel 127.0.0.1:") && line.contains("refused authentication"),
        "{line}"
    );

    // No client certificate: refused, at once, in one line.
    let watcher = [
        ("LOCKRUN_SENTINEL_USER", "watcher"),
        ("LOCKRUN_SENTINEL_PASSWORD", "watcher-pw"),
    ];
    let line = refused_at_once(
        "no client certificate",
        &url,
        &[("LOCKRUN_TLS_CA", &ca), watcher[0], watcher[1]],
    );
    assert!(
        line.contains("Sentinel 127.0.0.1:")
            && line.contains("demands a client certificate")
            && line.contains("LOCKRUN_TLS_CERT"),
        "{line}"
    );

    // A client certificate of another CA's.
    let stranger = TlsFiles::generate(true);
    let (stray_cert, stray_key) = (
        stranger.path("client.pem").display().to_string(),
        stranger.path("client.key").display().to_string(),
    );
    let line = refused_at_once(
        "a client certificate of another CA's",
        &url,
        &[
            ("LOCKRUN_TLS_CA", &ca),
            ("LOCKRUN_TLS_CERT", &stray_cert),
            ("LOCKRUN_TLS_KEY", &stray_key),
            watcher[0],
            watcher[1],
        ],
    );
    assert!(
        line.contains("Sentinel 127.0.0.1:")
            && line.contains("does not trust the client certificate of LOCKRUN_TLS_CERT"),
        "{line}"
    );
}
