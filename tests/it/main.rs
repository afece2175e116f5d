//! lockrun's integration tests: one test binary (one link, one run), a module per area,
//! all driving the real `lockrun` binary against real servers started by `support`.
//!
//! - `cli`, `exit_status`: the command line, the lock-name rules, exit statuses;
//! - `supervisor`: signals, the process group, `--max-runtime`, PID 1;
//! - `containment`: nothing of the job outlives lockrun, however lockrun ends (killed,
//!   OOM-killed, its guard killed, its stderr blocked), and no next holder starts beside it;
//! - `lease`, `fencing`, `contention`: the lease, tokens and waiting, against Redis;
//! - `conformance`: the contract of docs/guarantees.md, written once and run against
//!   every backend;
//! - `redis_keys`, `redis_slots`, `redis_eviction`, `redis_cluster`, `redlock`, `sentinel`,
//!   `postgres`, `pgbouncer`, `etcd`, `file_backend`, `auth`, `tls`: what only one backend
//!   has (`pgbouncer`: PostgreSQL through PgBouncer); `postgres_tls`, `etcd_tls`: verified
//!   TLS, client certificates and the line of each refused set-up; `etcd_auth`,
//!   `postgres_grants`: least-privilege etcd users and PostgreSQL roles, and the line of
//!   each missing permission; `key_layout`: an older lockrun's lock (keys before
//!   `PREFIX{NAME}`) is busy for a plain lock;
//!   `redis_acl`, `redis_errors`: the ACL rule the README states, and the line of each
//!   misconfigured Redis connection; `redis_proxies`: Redis behind twemproxy, and servers
//!   without `HELLO` or `SUBSCRIBE`;
//! - `metrics`, `operations`: the metrics file and the logs;
//! - `docs`: the README, man page and examples agree with the code;
//! - `fuzz`: random command lines, URLs and durations: no panic, documented statuses,
//!   one-line refusals;
//! - `soak`: the nemesis soak and its history checker.

mod auth;
mod cli;
mod conformance;
mod containment;
mod contention;
mod docs;
mod etcd;
mod etcd_auth;
mod etcd_tls;
mod exit_status;
mod fencing;
mod file_backend;
mod fuzz;
mod key_layout;
mod lease;
mod metrics;
mod operations;
mod pgbouncer;
mod postgres;
mod postgres_grants;
mod postgres_tls;
mod redis_acl;
mod redis_cluster;
mod redis_errors;
mod redis_eviction;
mod redis_keys;
mod redis_proxies;
mod redis_slots;
mod redlock;
mod sentinel;
mod soak;
mod supervisor;
mod support;
mod tls;
mod zookeeper;
