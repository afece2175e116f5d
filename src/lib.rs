//! lockrun: run a command under a named distributed lock.
//!
//! A map of the crate, in the order a run flows through it:
//!
//! - [`app`]: what `main.rs` calls ([`main_with`]): parses, builds a current-thread
//!   runtime (the thread that spawns the command must outlive it, for the
//!   parent-death signal) and dispatches.
//! - [`cli`]: the command line as typed (clap). [`config`] checks it into a
//!   [`config::RunConfig`]: the only configuration the rest of the code sees (the
//!   constructors from the clap structs live on the command line's side,
//!   `cli/checked.rs`, so that `config` never sees `cli`). The backend URLs are checked
//!   by the parser of their scheme, found in the registry [`backend::registry::KINDS`]
//!   (the `--url` help is built from it too).
//! - [`backend`]: the [`backend::Backend`] trait (acquire, renew, release, inspect)
//!   with typed results, [`backend::AnyBackend`] holding any of them, what every
//!   backend shares about URLs ([`backend::url`]: the leaf below them all) and one
//!   folder per backend, each owning its URL, options, connection and requests:
//!   [`backend::redis`] (one Lua script a step; Sentinel and the Redlock quorum in
//!   its folder), [`backend::postgres`] (a lease row) and [`backend::etcd`] (a
//!   lease, over lockrun's own small gRPC client). Every backend keeps its connection
//!   in one [`backend::conn::Slot`]: made lazily, forgotten after a failed or
//!   abandoned call. [`backend::file`] has no server and no connection: a lock file
//!   per name in a directory of this host. [`backend::zookeeper`] keeps one session
//!   for the whole run instead (the session is the lease: forgetting it would free
//!   the lock): an ephemeral sequential node per acquirer, in ZooKeeper's queue recipe.
//! - [`run`]: the async driver. It acquires (`run/acquire.rs` carries out what the
//!   pure acquire policy `run/policy.rs` decides: take, wait, retry with a new token,
//!   give up), spawns the command through [`supervisor`], then (`run/supervise.rs`)
//!   feeds timer ticks ([`clock`]: a [`clock::BootInstant`] on `CLOCK_BOOTTIME`),
//!   renewal replies and child exits into the pure lease machine [`lease`], and
//!   carries out what it decides: renew, send the kill signal, SIGKILL. When the
//!   command's whole process group is gone, it releases the lock.
//! - [`supervisor`]: process group, parent-death signal, subreaper, signal forwarding
//!   and the only `waitpid` in the program.
//! - [`outcome`]: how a run (or `status`, `release --force`) ended and its exit
//!   status; [`metrics`]: the `--metrics-file` written after every run; [`log`]: text
//!   or JSON lines on stderr; [`admin`]: `status` and `release --force`; [`holder`]:
//!   how a lock's holder is shown (unknown fields left out); [`token`]: randomness;
//!   [`name`]: the lock name's rule; [`units`]: durations in messages.
//!
//! Imports point down one order of layers, checked by `scripts/layers`: the leaves
//! (`units`, `name`, `clock`, `token`, `outcome`, `log`), the backend interface and
//! `backend::url`, the backends, the registry, `config`, the lease and the process,
//! `run` and `admin`, `cli`, and `app` at the top.
//!
//! Public are only the modules the binary's tools and the integration tests use:
//! `backend`, `cli`, `config`, `outcome`, `supervisor`, and [`main_with`]. Errors are
//! typed in the library; only the setup steps of the dispatch (the runtime, the
//! checked configuration of `status` and `release`) use `anyhow`, with context, and
//! such an error is printed once, as `lockrun: {err:#}`.

mod admin;
mod app;
pub mod backend;
pub mod cli;
mod clock;
pub mod config;
mod holder;
mod lease;
mod log;
mod metrics;
mod name;
pub mod outcome;
mod run;
pub mod supervisor;
mod token;
mod units;

pub use app::{main_with, prepare_process};
