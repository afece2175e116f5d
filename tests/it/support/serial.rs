//! Which tests run side by side. The test harness runs the tests of this one binary on
//! parallel threads (as many as the machine has cores, or `RUST_TEST_THREADS`: at least
//! 6 under `scripts/test`; the rules below hold for any number). Most of them spend
//! their time waiting for processes and may share the machine; a few load it heavily or
//! measure time over long stretches (the soak, many contending lockruns) and run alone.
//!
//! A test that must run alone calls [`alone`] before anything else. Every other test
//! joins the side-by-side group the first time it starts a process through the support
//! code (`lockrun()`, `spawn()`, a server's `start`), without doing anything itself.
//! Both hold their place until the test's thread ends, panic or not: the guard lives in
//! a thread-local that the harness's test thread drops when it exits. Threads a test
//! spawns itself (contending workers) do not join: their test already did.

use std::cell::RefCell;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Readers: tests running side by side; the writer: a test running alone. The standard
/// library's lock makes new readers wait while a writer waits, so a test that asked to
/// run alone is not starved.
static GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// This thread's test runs side by side with others.
    static SIDE_BY_SIDE: RefCell<Option<RwLockReadGuard<'static, ()>>> =
        const { RefCell::new(None) };
    /// This thread's test runs alone.
    static ALONE: RefCell<Option<RwLockWriteGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// True when this thread's test holds a place already.
fn has_place() -> bool {
    SIDE_BY_SIDE.with(|p| p.borrow().is_some()) || ALONE.with(|p| p.borrow().is_some())
}

/// True on a thread the test harness started for one test (it names them after the
/// test); false on the main thread (`--test-threads=1`) and on threads a test spawned.
fn is_test_thread() -> bool {
    std::thread::current()
        .name()
        .is_some_and(|name| name != "main")
}

/// Makes the calling test run alone: waits until every other running test has ended,
/// and keeps new ones from starting until this test ends. Call it first thing in the
/// test, before starting any process.
pub fn alone() {
    if !is_test_thread() {
        return;
    }
    assert!(
        !has_place(),
        "serial::alone() must come before the test starts any process"
    );
    let guard = GATE.write().unwrap_or_else(PoisonError::into_inner);
    ALONE.with(|p| *p.borrow_mut() = Some(guard));
}

/// Joins the calling test to those that run side by side, unless it already holds a
/// place (or is not a test's own thread).
pub(super) fn side_by_side() {
    if !is_test_thread() {
        return;
    }
    if !has_place() {
        let guard = GATE.read().unwrap_or_else(PoisonError::into_inner);
        SIDE_BY_SIDE.with(|p| *p.borrow_mut() = Some(guard));
    }
}
