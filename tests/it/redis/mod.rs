//! What only the Redis backends have, against `redis-server`s of the tests' own: the
//! keys (`keys`), semaphore slots (`slots`), eviction (`eviction`), Redis Cluster
//! (`cluster`), Redlock over several servers (`redlock`), Sentinel and failover
//! (`sentinel`), passwords (`auth`), `rediss://` (`tls`), the ACL rule the docs state
//! (`acl`), the line of each misconfigured connection (`errors`), the last run's record
//! (`records`), the lock granted to a waiter by a release (`grants`), Redis behind
//! twemproxy or without `HELLO` or `SUBSCRIBE` (`proxies`), and a hostile server
//! (`hostile`). The contract every backend keeps is tested in the
//! conformance suite.

mod acl;
mod auth;
mod cluster;
mod errors;
mod eviction;
mod grants;
mod hostile;
mod keys;
mod proxies;
mod records;
mod redlock;
mod sentinel;
mod slots;
mod tls;
