//! A Redis Cluster of the test's own: 6 `redis-server`s with `cluster-enabled yes` on
//! free ports (and free bus ports), joined by `redis-cli --cluster create` as 3
//! masters with one replica each; slots migrated and masters failed over on demand.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use redis::Value;

use super::{free_port, wait_until, RedisServer, WAIT};

/// How long a node may be silent before the others call it failed.
const NODE_TIMEOUT_MS: u64 = 2000;

/// Six nodes, 3 masters and 3 replicas.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Nodes frozen by [`RedisCluster::freeze`]: left out of the test's own queries.
    frozen: Mutex<BTreeSet<usize>>,
}

impl RedisCluster {
    /// Starts the nodes, joins them and waits until every node sees a healthy cluster
    /// and every replica is in sync.
    pub fn start() -> RedisCluster {
        // A node found "not empty" holds a key or knows a node that is not the test's:
        // its port was free when chosen, and another test's client, still pointed at a
        // server of its own that died there, reached it first. New ports then.
        for _ in 0..2 {
            match RedisCluster::try_start() {
                Ok(cluster) => return cluster,
                Err(out) if out.contains("is not empty") => continue,
                Err(out) => panic!("redis-cli --cluster create failed: {out}"),
            }
        }
        RedisCluster::try_start()
            .unwrap_or_else(|out| panic!("redis-cli --cluster create failed: {out}"))
    }

    /// One try of [`RedisCluster::start`]: `Err` holds what `redis-cli --cluster
    /// create` printed when it failed.
    fn try_start() -> Result<RedisCluster, String> {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                RedisServer::with_args(&[
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-port".into(),
                    free_port().to_string(),
                    "--cluster-node-timeout".into(),
                    NODE_TIMEOUT_MS.to_string(),
                    // A replica may be promoted however long its link was down.
                    "--cluster-replica-validity-factor".into(),
                    "0".into(),
                    "--repl-diskless-sync-delay".into(),
                    "0".into(),
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new(super::redis::cli_program())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        if !out.status.success() {
            return Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let cluster = RedisCluster {
            nodes,
            frozen: Mutex::new(BTreeSet::new()),
        };
        cluster.wait_healthy();
        Ok(cluster)
    }

    /// Waits until every node says `cluster_state:ok`, knows 3 masters with slots and
    /// 3 replicas, and every replica's link to its master is up.
    pub fn wait_healthy(&self) {
        wait_until("the cluster is healthy", Duration::from_secs(60), || {
            self.answering().all(|n| {
                let info: String = n.query(redis::cmd("CLUSTER").arg("INFO"));
                let ranges = n.query::<Value>(redis::cmd("CLUSTER").arg("SLOTS"));
                let repl: String = n.query(redis::cmd("INFO").arg("replication"));
                // Every node knows the 3 replicas as such (a master must, before its
                // replica can take over with CLUSTER FAILOVER).
                let all: String = n.query(redis::cmd("CLUSTER").arg("NODES"));
                let replicas = all
                    .lines()
                    .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("slave")))
                    .count();
                replicas == 3
                    && info.contains("cluster_state:ok")
                    && matches!(ranges, Value::Array(r) if r.len() == 3)
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            })
        });
    }

    /// Node `i` (0 to 5).
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// `redis://127.0.0.1:PORT` of node `i`.
    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// True when node `i` holds `key` (a replica too: asked with `READONLY`).
    pub fn has_key(&self, i: usize, key: &str) -> bool {
        let client = redis::Client::open(self.url(i)).expect("node url");
        let mut con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect to a node");
        let _: () = redis::cmd("READONLY").query(&mut con).expect("READONLY");
        let n: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query(&mut con)
            .expect("EXISTS");
        n == 1
    }

    /// The slot of `key`, as the cluster computes it.
    pub fn key_slot(&self, key: &str) -> u16 {
        self.any()
            .query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
    }

    /// The index of the master that serves `slot`, as the first live node sees it.
    pub fn master_of(&self, slot: u16) -> usize {
        let ranges: Vec<(u16, u16, (String, u16))> = self
            .slot_ranges()
            .into_iter()
            .filter(|(first, last, _)| *first <= slot && slot <= *last)
            .collect();
        let [(_, _, (_, port))] = ranges.as_slice() else {
            panic!("slot {slot} is in {} ranges", ranges.len())
        };
        self.index_of(*port)
    }

    /// The index of the replica of master `master`.
    pub fn replica_of(&self, master: usize) -> usize {
        let id = self.id(master);
        (0..self.nodes.len())
            .find(|&i| {
                i != master && self.nodes[i].is_running() && {
                    let me: String = self.nodes[i].query(redis::cmd("CLUSTER").arg("MYID"));
                    let all: String = self.nodes[i].query(redis::cmd("CLUSTER").arg("NODES"));
                    all.lines().any(|l| {
                        let f: Vec<&str> = l.split(' ').collect();
                        f.first() == Some(&me.as_str()) && f.get(3) == Some(&id.as_str())
                    })
                }
            })
            .unwrap_or_else(|| panic!("node {master} has no replica"))
    }

    /// The cluster node id of node `i`.
    pub fn id(&self, i: usize) -> String {
        self.nodes[i].query(redis::cmd("CLUSTER").arg("MYID"))
    }

    /// Moves every key of `slot` from node `from` to node `to`, leaving the slot open
    /// (MIGRATING on `from`, IMPORTING on `to`): [`RedisCluster::finish_migration`]
    /// gives it to `to`.
    pub fn start_migration(&self, slot: u16, from: usize, to: usize) {
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let _: String = dst.query(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(self.id(from)),
        );
        let _: String = src.query(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(self.id(to)),
        );
        let keys: Vec<String> = src.query(
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(1000),
        );
        if !keys.is_empty() {
            let _: String = src.query(
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(dst.port())
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(&keys),
            );
        }
    }

    /// Gives `slot` to node `to` on every master, `to` first (the end of a migration).
    pub fn finish_migration(&self, slot: u16, to: usize) {
        let id = self.id(to);
        let others = self.nodes.iter().enumerate().filter(|(i, _)| *i != to);
        let order = std::iter::once(&self.nodes[to]).chain(others.map(|(_, n)| n));
        for n in order.filter(|n| n.is_running() && !self.is_frozen(n)) {
            let role: String = n.query(redis::cmd("INFO").arg("replication"));
            if role.contains("role:master") {
                let _: String = n.query(
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg("NODE")
                        .arg(&id),
                );
            }
        }
        wait_until("every node sees the slot's new owner", WAIT, || {
            self.answering().all(|n| {
                let ranges = slot_ranges(&n.query(redis::cmd("CLUSTER").arg("SLOTS")));
                ranges.iter().any(|(a, b, (_, port))| {
                    *a <= slot && slot <= *b && *port == self.nodes[to].port()
                })
            })
        });
    }

    /// `CLUSTER FAILOVER` on replica `replica`, and waits until every live node sees
    /// it as the master.
    pub fn failover_to(&self, replica: usize) {
        let _: String = self.nodes[replica].query(redis::cmd("CLUSTER").arg("FAILOVER"));
        self.wait_master(replica);
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Waits until every live node names node `i` as a master of a slot range.
    pub fn wait_master(&self, i: usize) {
        let port = self.nodes[i].port();
        wait_until(
            "every live node sees the new master",
            Duration::from_secs(60),
            || {
                self.answering().all(|n| {
                    let ranges = slot_ranges(&n.query(redis::cmd("CLUSTER").arg("SLOTS")));
                    ranges.iter().any(|(_, _, (_, p))| *p == port)
                })
            },
        );
    }

    fn slot_ranges(&self) -> Vec<(u16, u16, (String, u16))> {
        slot_ranges(&self.any().query(redis::cmd("CLUSTER").arg("SLOTS")))
    }

    /// Freezes node `i` (SIGSTOP): it keeps its connections and answers nothing.
    pub fn freeze(&self, i: usize) {
        self.frozen.lock().unwrap().insert(i);
        self.nodes[i].pause();
    }

    /// Thaws node `i` (SIGCONT).
    pub fn thaw(&self, i: usize) {
        self.nodes[i].resume();
        self.frozen.lock().unwrap().remove(&i);
    }

    fn is_frozen(&self, n: &RedisServer) -> bool {
        let frozen = self.frozen.lock().unwrap();
        frozen.iter().any(|&i| self.nodes[i].port() == n.port())
    }

    /// The nodes that run and are not frozen.
    fn answering(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.is_running() && !self.is_frozen(n))
    }

    fn any(&self) -> &RedisServer {
        self.answering().next().expect("a live node")
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }
}

/// `CLUSTER SLOTS` as (first, last, master).
fn slot_ranges(v: &Value) -> Vec<(u16, u16, (String, u16))> {
    let Value::Array(ranges) = v else {
        panic!("CLUSTER SLOTS gave {v:?}")
    };
    ranges
        .iter()
        .map(|r| {
            let Value::Array(r) = r else {
                panic!("a range {r:?}")
            };
            let int = |v: &Value| match v {
                Value::Int(i) => *i,
                other => panic!("not an integer: {other:?}"),
            };
            let Value::Array(master) = &r[2] else {
                panic!("a master {:?}", r[2])
            };
            let host = match &master[0] {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => panic!("a host {other:?}"),
            };
            (
                int(&r[0]) as u16,
                int(&r[1]) as u16,
                (host, int(&master[1]) as u16),
            )
        })
        .collect()
}
