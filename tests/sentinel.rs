//! Redis behind Sentinel (`redis+sentinel://`): lockrun asks the Sentinels for the
//! master, follows a failover, and keeps fencing tokens increasing across it.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

/// A process killed on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis(args: &[String]) -> Daemon {
    Daemon(
        Command::new("redis-server")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server"),
    )
}

fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    cmd.query(&mut con).ok()
}

fn master_port(sentinel: u16) -> Option<u16> {
    let addr: Option<(String, u16)> = query(
        sentinel,
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("mymaster"),
    )?;
    addr.map(|(_, p)| p)
}

/// A master, one replica and one Sentinel, each on its own free port.
struct Cluster {
    master: Option<Daemon>,
    master_port: u16,
    replica_port: u16,
    sentinel_port: u16,
    _replica: Daemon,
    _sentinel: Daemon,
    _dir: tempfile::TempDir,
}

fn data_node(port: u16, dir: &Path, extra: &[String]) -> Daemon {
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(["--dir".to_owned(), dir.display().to_string()]);
    args.extend(extra.iter().cloned());
    redis(&args)
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let (master_port, replica_port, sentinel_port) = (free_port(), free_port(), free_port());
        let m_dir = dir.path().join("m");
        let r_dir = dir.path().join("r");
        std::fs::create_dir_all(&m_dir).unwrap();
        std::fs::create_dir_all(&r_dir).unwrap();
        let master = data_node(master_port, &m_dir, &[]);
        wait_until("the master answers", WAIT, || {
            query::<String>(master_port, &redis::cmd("PING")).is_some()
        });
        let replica = data_node(
            replica_port,
            &r_dir,
            &[
                "--replicaof".into(),
                "127.0.0.1".into(),
                master_port.to_string(),
            ],
        );
        wait_until("the replica is in sync", WAIT, || {
            query::<String>(replica_port, redis::cmd("INFO").arg("replication"))
                .is_some_and(|i| i.contains("master_link_status:up"))
        });
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds mymaster 500\n\
                 sentinel failover-timeout mymaster 2000\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let sentinel = redis(&[conf.display().to_string(), "--sentinel".into()]);
        wait_until(
            "the Sentinel knows the master and its replica",
            Duration::from_secs(30),
            || {
                master_port_is(sentinel_port, master_port)
                    && query::<Vec<redis::Value>>(
                        sentinel_port,
                        redis::cmd("SENTINEL").arg("replicas").arg("mymaster"),
                    )
                    .is_some_and(|r| !r.is_empty())
            },
        );
        Cluster {
            master: Some(master),
            master_port,
            replica_port,
            sentinel_port,
            _replica: replica,
            _sentinel: sentinel,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/mymaster", self.sentinel_port)
    }

    fn kill_master_and_wait_for_failover(&mut self) {
        drop(self.master.take());
        let (sentinel, replica) = (self.sentinel_port, self.replica_port);
        wait_until(
            "the Sentinel promoted the replica",
            Duration::from_secs(60),
            || master_port_is(sentinel, replica),
        );
    }
}

fn master_port_is(sentinel: u16, port: u16) -> bool {
    master_port(sentinel) == Some(port)
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
    let cluster = Cluster::start();
    let s = Scratch::new();
    let token = token_run(&cluster.url(), &s, &[]);
    assert!(token > 0);
    // The lock lived on the master, not on the replica the Sentinel also knows.
    let fence: Option<String> = query(cluster.master_port, redis::cmd("GET").arg(fence_key("job")));
    assert_eq!(fence, Some(token.to_string()));
    let mut status = lockrun();
    status.args(["status", "--url", &cluster.url(), "job"]);
    run(status).assert_code(1);
}

#[test]
fn locking_follows_a_failover_and_tokens_keep_increasing() {
    let mut cluster = Cluster::start();
    let s = Scratch::new();
    let before = token_run(&cluster.url(), &s, &[]);
    cluster.kill_master_and_wait_for_failover();
    let after = token_run(&cluster.url(), &s, &["--wait", "20s"]);
    assert!(
        after > before,
        "token {after} after the failover is not above {before}"
    );
    let fence: Option<String> = query(
        cluster.replica_port,
        redis::cmd("GET").arg(fence_key("job")),
    );
    assert_eq!(
        fence,
        Some(after.to_string()),
        "the promoted replica holds the lock now"
    );
}

#[test]
fn a_holder_keeps_its_lock_across_a_failover() {
    let mut cluster = Cluster::start();
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
        query::<i64>(
            cluster.replica_port,
            redis::cmd("EXISTS").arg(lock_key("job")),
        ) == Some(1)
    });
    cluster.kill_master_and_wait_for_failover();
    // Renewals now go to the promoted replica, where the lock (and our token) lives on.
    let f = holder.wait_for(Duration::from_secs(60));
    f.assert_code(3);
}

#[test]
fn an_unknown_master_name_fails_closed() {
    let cluster = Cluster::start();
    let s = Scratch::new();
    let url = format!(
        "redis+sentinel://127.0.0.1:{}/nosuchmaster",
        cluster.sentinel_port
    );
    let mut cmd = lockrun_run(&url, "job", &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(f.stderr.contains("nosuchmaster"), "{}", f.stderr);
    assert!(!s.exists("marker"));
}
