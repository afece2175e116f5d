//! The one connection slot every backend keeps its connection in: made lazily by the
//! first call that needs it, forgotten after any failure or abandoned call, made
//! afresh by the next call. Depends on nothing else in the crate.
//!
//! Why a failed or abandoned call forgets the connection: the driver bounds every call
//! with a timeout shorter than the lease left, and a call dropped by that timeout
//! leaves its connection in an unknown state (a request half sent, an answer still to
//! come, a socket hung in a partition). Reusing it could make the next call, say the
//! renewal that must land before the deadline, wait behind the dead one.
//!
//! Each connection has a *generation*. A call remembers the generation it used, and a
//! failure only forgets the connection if it is still that one, so a late failure of an
//! old connection never drops a new, healthy one. The generation grows at each
//! forgetting, which also tells a multi-member backend (etcd) which member is next.
//!
//! The slot's mutex is held only for a few instructions, never across an await.

use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// What a backend keeps per connection: the client, and anything that lives and dies
/// with it (a subscription, a task driving the socket).
pub trait Connection {
    /// Called once when the slot forgets this connection: stop what drives it. The
    /// connection itself is dropped when its last user is done with it.
    fn discard(&self) {}
}

/// A lazily made, shared connection. See the module documentation.
pub struct Slot<C: Connection> {
    inner: Mutex<Inner<C>>,
}

struct Inner<C> {
    conn: Option<Arc<C>>,
    generation: u64,
}

impl<C: Connection> Default for Slot<C> {
    fn default() -> Self {
        Slot {
            inner: Mutex::new(Inner {
                conn: None,
                generation: 0,
            }),
        }
    }
}

impl<C: Connection> Slot<C> {
    fn inner(&self) -> MutexGuard<'_, Inner<C>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The generation the current (or next) connection has.
    pub fn generation(&self) -> u64 {
        self.inner().generation
    }

    /// The current connection and its generation, if one is made, without checking
    /// it out.
    pub fn current(&self) -> Option<(Arc<C>, u64)> {
        let inner = self.inner();
        inner.conn.clone().map(|c| (c, inner.generation))
    }

    /// The connection for one call: the current one, or a new one from `connect`
    /// (given the generation it will have). The call must end with
    /// [`InUse::settle`] or [`InUse::keep`]; dropped before that (abandoned), the
    /// connection is forgotten. A connection that could not be made moves the
    /// generation on too.
    pub async fn get<E, F, Fut>(&self, connect: F) -> Result<InUse<'_, C>, E>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<C, E>>,
    {
        let generation = {
            let inner = self.inner();
            if let Some(conn) = &inner.conn {
                return Ok(InUse::new(self, conn.clone(), inner.generation));
            }
            inner.generation
        };
        let made = match connect(generation).await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                self.reset(generation);
                return Err(e);
            }
        };
        let mut inner = self.inner();
        if inner.generation == generation {
            // Two calls may have connected at once: keep the last, discard the other.
            if let Some(old) = inner.conn.replace(made.clone()) {
                old.discard();
            }
        }
        Ok(InUse::new(self, made, generation))
    }

    /// Forgets connection `generation` if it is still the current one.
    pub fn reset(&self, generation: u64) {
        let mut inner = self.inner();
        if inner.generation == generation {
            inner.generation = generation.wrapping_add(1);
            if let Some(old) = inner.conn.take() {
                old.discard();
            }
        }
    }

    /// Takes the current connection out (to close it politely); the next call makes
    /// a new one.
    pub fn take(&self) -> Option<Arc<C>> {
        let mut inner = self.inner();
        inner.generation = inner.generation.wrapping_add(1);
        inner.conn.take()
    }
}

impl<C: Connection> Drop for Slot<C> {
    fn drop(&mut self) {
        if let Some(conn) = self.inner().conn.take() {
            conn.discard();
        }
    }
}

/// A connection checked out for one call. Forgotten by its slot if dropped before the
/// call settled (the caller's timeout abandoned it) or if it settled with an error.
pub struct InUse<'a, C: Connection> {
    slot: &'a Slot<C>,
    conn: Arc<C>,
    generation: u64,
    armed: bool,
}

impl<'a, C: Connection> InUse<'a, C> {
    fn new(slot: &'a Slot<C>, conn: Arc<C>, generation: u64) -> Self {
        InUse {
            slot,
            conn,
            generation,
            armed: true,
        }
    }

    /// The generation of this connection.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Ends the call with `result`: the connection stays for the next call if it is
    /// `Ok`, and is forgotten if it is an error.
    pub fn settle<T, E>(mut self, result: Result<T, E>) -> Result<T, E> {
        self.armed = result.is_err();
        result
    }

    /// Ends the call and keeps the connection (an error that says nothing about the
    /// connection, such as "no such table").
    pub fn keep(mut self) {
        self.armed = false;
    }
}

impl<C: Connection> Deref for InUse<'_, C> {
    type Target = C;
    fn deref(&self) -> &C {
        &self.conn
    }
}

impl<C: Connection> Drop for InUse<'_, C> {
    fn drop(&mut self) {
        if self.armed {
            self.slot.reset(self.generation);
        }
    }
}

/// Wake-ups that arrive on a connection (Redis pushes, PostgreSQL notifications),
/// and whether the connection has subscribed to them. They live and die with their
/// connection: a new connection must subscribe again.
pub struct Wakeups<T> {
    receiver: Mutex<Option<T>>,
    subscribed: AtomicBool,
}

impl<T> Wakeups<T> {
    /// Wake-ups that will arrive on `receiver` once subscribed.
    pub fn new(receiver: Option<T>) -> Self {
        Wakeups {
            receiver: Mutex::new(receiver),
            subscribed: AtomicBool::new(false),
        }
    }

    /// True once the connection has subscribed.
    pub fn is_subscribed(&self) -> bool {
        self.subscribed.load(Ordering::Relaxed)
    }

    /// Records that the connection has subscribed.
    pub fn set_subscribed(&self) {
        self.subscribed.store(true, Ordering::Relaxed);
    }

    fn receiver(&self) -> MutexGuard<'_, Option<T>> {
        self.receiver.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// True if the current connection of `slot` has subscribed to its wake-ups.
pub fn subscribed<C: Connection, T>(slot: &Slot<C>, wakeups: fn(&C) -> &Wakeups<T>) -> bool {
    slot.current()
        .is_some_and(|(c, _)| wakeups(&c).is_subscribed())
}

/// Waits up to `slice` for a wake-up on the current connection of `slot`: `next`
/// reads the receiver until a wake-up (`Some`) or the connection's end (`None`,
/// which forgets the connection: the next call reconnects and subscribes again).
/// Without a subscribed connection, it just sleeps `slice`. Returning early is always
/// allowed: the caller asks the backend again.
pub async fn wait_for_wakeup<C, T, F>(
    slot: &Slot<C>,
    wakeups: fn(&C) -> &Wakeups<T>,
    slice: Duration,
    mut next: F,
) where
    C: Connection,
    F: AsyncFnMut(&mut T) -> Option<()>,
{
    let taken = slot.current().and_then(|(conn, generation)| {
        let w = wakeups(&conn);
        let receiver = w.is_subscribed().then(|| w.receiver().take()).flatten();
        receiver.map(|r| (conn, generation, r))
    });
    let Some((conn, generation, receiver)) = taken else {
        tokio::time::sleep(slice).await;
        return;
    };
    // Woken, timed out, or dropped (a caller racing several waits): the receiver goes
    // back for the next wait.
    let mut back = PutBack {
        wakeups: wakeups(&conn),
        receiver: Some(receiver),
    };
    let Some(receiver) = back.receiver.as_mut() else {
        return;
    };
    if let Ok(None) = tokio::time::timeout(slice, next(receiver)).await {
        back.receiver = None;
        slot.reset(generation);
    }
}

/// A receiver taken out of its [`Wakeups`] for one wait, put back when the wait ends
/// however it ends.
struct PutBack<'a, T> {
    wakeups: &'a Wakeups<T>,
    receiver: Option<T>,
}

impl<T> Drop for PutBack<'_, T> {
    fn drop(&mut self) {
        if let Some(r) = self.receiver.take() {
            *self.wakeups.receiver() = Some(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Fake {
        id: u64,
        discarded: Arc<AtomicUsize>,
    }

    impl Connection for Fake {
        fn discard(&self) {
            self.discarded.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn connect(
        discarded: &Arc<AtomicUsize>,
    ) -> impl FnOnce(u64) -> std::future::Ready<Result<Fake, ()>> + '_ {
        move |id| {
            std::future::ready(Ok(Fake {
                id,
                discarded: discarded.clone(),
            }))
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_settled_call_keeps_the_connection_and_an_error_forgets_it() {
        let slot = Slot::<Fake>::default();
        let d = Arc::new(AtomicUsize::new(0));
        block_on(async {
            let c = slot.get(connect(&d)).await.unwrap();
            assert_eq!(c.id, 0);
            c.settle(Ok::<(), ()>(())).unwrap();
            assert!(slot.current().is_some());
            let c = slot.get(connect(&d)).await.unwrap();
            assert_eq!(c.id, 0, "reused");
            let _ = c.settle(Err::<(), ()>(()));
            assert!(slot.current().is_none());
            assert_eq!(d.load(Ordering::SeqCst), 1);
            let c = slot.get(connect(&d)).await.unwrap();
            assert_eq!(c.id, 1, "a new generation");
            c.keep();
        });
    }

    #[test]
    fn an_abandoned_call_forgets_the_connection() {
        let slot = Slot::<Fake>::default();
        let d = Arc::new(AtomicUsize::new(0));
        block_on(async {
            drop(slot.get(connect(&d)).await.unwrap());
        });
        assert!(slot.current().is_none());
        assert_eq!(slot.generation(), 1);
    }

    #[test]
    fn a_late_failure_of_an_old_connection_spares_the_new_one() {
        let slot = Slot::<Fake>::default();
        let d = Arc::new(AtomicUsize::new(0));
        block_on(async {
            let old = slot.get(connect(&d)).await.unwrap();
            slot.reset(old.generation());
            let new = slot.get(connect(&d)).await.unwrap();
            new.keep();
            drop(old); // fails late: generation 0 is long gone
            assert_eq!(slot.current().map(|(c, _)| c.id), Some(1));
        });
    }

    struct Pushy {
        wakeups: Wakeups<tokio::sync::mpsc::UnboundedReceiver<()>>,
    }

    impl Connection for Pushy {}

    fn pushes(p: &Pushy) -> &Wakeups<tokio::sync::mpsc::UnboundedReceiver<()>> {
        &p.wakeups
    }

    #[test]
    fn a_wait_dropped_before_its_end_puts_the_receiver_back() {
        let slot = Slot::<Pushy>::default();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let made = Pushy {
                wakeups: Wakeups::new(Some(rx)),
            };
            let c = slot
                .get(|_| std::future::ready(Ok::<_, ()>(made)))
                .await
                .unwrap();
            c.wakeups.set_subscribed();
            c.keep();
            // Lost a race (Redlock waits on every server and takes the first).
            let wait = wait_for_wakeup(&slot, pushes, Duration::from_secs(60), async |r| {
                r.recv().await
            });
            assert!(tokio::time::timeout(Duration::from_millis(20), wait)
                .await
                .is_err());
            tx.send(()).unwrap();
            // The next wait still hears the wake-up.
            let woken = wait_for_wakeup(&slot, pushes, Duration::from_secs(60), async |r| {
                r.recv().await
            });
            assert!(tokio::time::timeout(Duration::from_secs(5), woken)
                .await
                .is_ok());
        });
    }

    #[test]
    fn a_failed_connect_moves_the_generation_on() {
        let slot = Slot::<Fake>::default();
        let r = block_on(slot.get(|_| std::future::ready(Err::<Fake, &str>("refused"))));
        assert!(r.is_err());
        assert_eq!(slot.generation(), 1);
    }
}
