//! lockrun's integration tests: one test binary (one link, one run), a module per area,
//! all driving the real `lockrun` binary against real servers started by `support`.
//!
//! - `cli`, `exit_status`: the command line, the lock-name rules, exit statuses;
//! - `stdio`: lockrun started with its stdin, stdout and stderr closed, or printing into
//!   a pipe nobody reads or a full device;
//! - `supervisor`: signals, the process group, `--max-runtime`, PID 1;
//! - `containment`: nothing of the job outlives lockrun, however lockrun ends (killed,
//!   OOM-killed, its guard killed, its stderr blocked), and no next holder starts beside it;
//! - `lease`, `fencing`, `contention`: the lease, tokens and waiting, against Redis;
//! - `conformance`: the contract of docs/guarantees.md, written once and run against
//!   every backend;
//! - a folder per backend for what only it has: `redis` (Redis, Redlock, Sentinel,
//!   Cluster, proxies, passwords, TLS, ACL and the line of each misconfigured
//!   connection), `postgres` (and PgBouncer, TLS, roles with few grants), `etcd` (and
//!   TLS, users with few permissions), `zookeeper`, `file`, `mysql` (MariaDB: crash
//!   and restart, passwords, grants); `key_layout`: an older
//!   lockrun's lock (keys before `PREFIX{NAME}`) is busy for a plain lock;
//! - `metrics`, `operations`: the metrics file and the logs;
//! - `docs`: the README, man page and examples agree with the code;
//! - `fuzz`: random command lines, URLs and durations: no panic, documented statuses,
//!   one-line refusals;
//! - `soak`: the nemesis soak and its history checker.

mod cli;
mod conformance;
mod containment;
mod contention;
mod docs;
mod etcd;
mod exit_status;
mod fencing;
mod file;
mod fuzz;
mod key_layout;
mod lease;
mod list;
mod metrics;
mod mysql;
mod once_per;
mod operations;
mod ping;
mod postgres;
mod redis;
mod soak;
mod splay;
mod stdio;
mod supervisor;
mod support;
mod zookeeper;
