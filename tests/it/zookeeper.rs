//! What only the ZooKeeper backend (`zk://`) has, against real ZooKeeper servers
//! started by the tests: the queue nodes as the server keeps them, the session timeout
//! the server grants, a session the server expired, 50 waiters served in order with
//! one watch each, a 3-member ensemble losing its leader, digest authentication and
//! the chroot. The contract every backend keeps is tested in the conformance suite.
