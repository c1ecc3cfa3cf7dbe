//! The memory budget: a shared counter of reserved bytes that never goes
//! over its limit.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::{PagingError, Result};

/// A memory budget that reservations are counted against.
///
/// Code that is about to allocate a large buffer first takes a
/// [`Reservation`] for its size; the reservation gives the bytes back when
/// it is dropped. The ledger only counts: it does not allocate anything
/// itself, so it is exactly as accurate as the reservations taken against
/// it.
///
/// A ledger is thread-safe (a mutex around the counters and a condition
/// variable for waiters) and is shared through an [`Arc`]; every
/// reservation keeps the ledger alive until it is released.
pub struct Ledger {
    budget: u64,
    state: Mutex<State>,
    /// Signalled whenever bytes are released.
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    used: u64,
    peak: u64,
}

impl Ledger {
    /// Creates a ledger allowing at most `budget` bytes to be reserved at
    /// once.
    pub fn new(budget: u64) -> Arc<Ledger> {
        Arc::new(Ledger {
            budget,
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
        })
    }

    /// The total number of bytes that may be reserved at once.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes currently reserved.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// The highest number of bytes that were ever reserved at the same time.
    pub fn peak(&self) -> u64 {
        self.lock().peak
    }

    /// Bytes that can still be reserved right now.
    pub fn available(&self) -> u64 {
        self.budget - self.lock().used
    }

    /// Reserves `bytes` now, or fails with [`PagingError::OverBudget`] if
    /// they do not fit in what is left of the budget. `what` names the
    /// reservation in that error message.
    pub fn reserve(self: &Arc<Self>, bytes: u64, what: &str) -> Result<Reservation> {
        let mut state = self.lock();
        let available = self.budget - state.used;
        if bytes > available {
            return Err(self.over_budget(bytes, available, what));
        }
        Ok(self.take(&mut state, bytes))
    }

    /// Waits until `bytes` fit in the budget, then reserves them.
    ///
    /// Fails at once with [`PagingError::OverBudget`] if `bytes` is larger
    /// than the whole budget, since waiting could never help. Waiters are
    /// woken whenever a reservation is released; there is no queueing, so a
    /// large request can be overtaken by smaller ones that fit sooner.
    pub fn reserve_blocking(self: &Arc<Self>, bytes: u64, what: &str) -> Result<Reservation> {
        let mut state = self.lock();
        if bytes > self.budget {
            let available = self.budget - state.used;
            return Err(self.over_budget(bytes, available, what));
        }
        while bytes > self.budget - state.used {
            state = self
                .freed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        Ok(self.take(&mut state, bytes))
    }

    /// Books `bytes` (which the caller has checked fit) and hands out the
    /// reservation for them.
    fn take(self: &Arc<Self>, state: &mut State, bytes: u64) -> Reservation {
        state.used += bytes;
        state.peak = state.peak.max(state.used);
        Reservation {
            ledger: Arc::clone(self),
            bytes,
        }
    }

    fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut state = self.lock();
        state.used -= bytes;
        drop(state);
        self.freed.notify_all();
    }

    fn over_budget(&self, needed: u64, available: u64, what: &str) -> PagingError {
        PagingError::OverBudget {
            what: what.to_owned(),
            needed,
            available,
            budget: self.budget,
        }
    }

    /// Locks the counters. Nothing panics while holding the lock, but if
    /// something ever did, the counters are still consistent, so a poisoned
    /// lock is simply taken over.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Ledger")
            .field("budget", &self.budget)
            .field("used", &state.used)
            .field("peak", &state.peak)
            .finish()
    }
}

/// Bytes held against a [`Ledger`]. They are given back when the
/// reservation is dropped, which wakes anyone blocked in
/// [`Ledger::reserve_blocking`].
pub struct Reservation {
    ledger: Arc<Ledger>,
    bytes: u64,
}

impl Reservation {
    /// The number of bytes this reservation holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.ledger.release(self.bytes);
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn types_are_send_and_sync() {
        assert_send_sync::<Ledger>();
        assert_send_sync::<Reservation>();
    }

    #[test]
    fn reserve_counts_and_drop_releases() {
        let ledger = Ledger::new(1000);
        assert_eq!(
            (ledger.budget(), ledger.used(), ledger.available()),
            (1000, 0, 1000)
        );

        let a = ledger.reserve(300, "a").unwrap();
        let b = ledger.reserve(500, "b").unwrap();
        assert_eq!(a.bytes(), 300);
        assert_eq!(b.bytes(), 500);
        assert_eq!(
            (ledger.used(), ledger.available(), ledger.peak()),
            (800, 200, 800)
        );

        drop(a);
        assert_eq!(
            (ledger.used(), ledger.available(), ledger.peak()),
            (500, 500, 800)
        );
        let c = ledger.reserve(500, "c").unwrap();
        assert_eq!(
            (ledger.used(), ledger.available(), ledger.peak()),
            (1000, 0, 1000)
        );

        let zero = ledger.reserve(0, "nothing").unwrap();
        assert_eq!(zero.bytes(), 0);
        drop((b, c, zero));
        assert_eq!((ledger.used(), ledger.peak()), (0, 1000));
    }

    #[test]
    fn reserve_over_budget_fails_and_changes_nothing() {
        let ledger = Ledger::new(1000);
        let held = ledger.reserve(700, "held").unwrap();
        match ledger.reserve(301, "layer 7") {
            Err(PagingError::OverBudget {
                what,
                needed,
                available,
                budget,
            }) => {
                assert_eq!(what, "layer 7");
                assert_eq!((needed, available, budget), (301, 300, 1000));
            }
            other => panic!("expected OverBudget, got {other:?}"),
        }
        assert_eq!((ledger.used(), ledger.peak()), (700, 700));
        assert!(ledger.reserve(u64::MAX, "huge").is_err());
        assert_eq!(ledger.used(), 700);
        drop(held);
        assert_eq!(ledger.used(), 0);
    }

    #[test]
    fn reserve_blocking_more_than_budget_fails_at_once() {
        let ledger = Ledger::new(1000);
        // Held so that a wrong implementation would block forever instead
        // of failing.
        let _held = ledger.reserve(10, "held").unwrap();
        match ledger.reserve_blocking(1001, "too big") {
            Err(PagingError::OverBudget {
                needed, available, ..
            }) => assert_eq!((needed, available), (1001, 990)),
            other => panic!("expected OverBudget, got {other:?}"),
        }
        assert_eq!(ledger.used(), 10);
    }

    #[test]
    fn reserve_blocking_waits_for_release() {
        let ledger = Ledger::new(100);
        let held = ledger.reserve(80, "held").unwrap();
        let waiter = {
            let ledger = Arc::clone(&ledger);
            thread::spawn(move || ledger.reserve_blocking(50, "waiter").map(|r| r.bytes()))
        };
        // Whether or not the waiter is already blocked, it can only finish
        // once `held` is gone.
        drop(held);
        assert_eq!(waiter.join().unwrap().unwrap(), 50);
        assert_eq!(ledger.used(), 0);
        assert_eq!(ledger.peak(), 80);
    }

    /// A tiny xorshift generator so the test needs no dependencies.
    fn next_random(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn many_threads_never_exceed_budget() {
        const BUDGET: u64 = 10_000;
        const THREADS: u64 = 8;
        const ROUNDS: usize = 200;
        let ledger = Ledger::new(BUDGET);

        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let ledger = Arc::clone(&ledger);
                thread::spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                    for _ in 0..ROUNDS {
                        let size = next_random(&mut rng) % (BUDGET / 2) + 1;
                        let r = ledger.reserve_blocking(size, "test").unwrap();
                        let used = ledger.used();
                        assert!(used <= BUDGET, "used {used} > budget");
                        assert!(used >= r.bytes());
                        // Try for a second reservation without waiting, so
                        // the non-blocking path races the blocking one too.
                        // Nothing is held while blocking, so no deadlock.
                        let extra = next_random(&mut rng) % (BUDGET / 2) + 1;
                        match ledger.reserve(extra, "extra") {
                            Ok(e) => assert!(ledger.used() <= BUDGET && e.bytes() == extra),
                            Err(PagingError::OverBudget { .. }) => {}
                            Err(e) => panic!("unexpected error {e}"),
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("worker panicked");
        }
        assert!(ledger.peak() <= BUDGET, "peak {} > budget", ledger.peak());
        assert!(ledger.peak() > 0);
        assert_eq!(ledger.used(), 0);
    }
}
