//! Where the server reads the time: request deadlines are set and checked
//! against a [`Clock`], the system's monotonic clock unless a test gives
//! one it moves by hand.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The system's monotonic clock ([`Clock::default`]), or a manual one
/// that stands still until [`Clock::advance`] moves it, so a test decides
/// when a request's deadline passes.
#[derive(Clone, Default)]
pub struct Clock {
    manual: Option<Arc<Mutex<Instant>>>,
}

impl Clock {
    /// A clock that starts at the present instant and then moves only when
    /// advanced.
    pub fn manual() -> Self {
        Self {
            manual: Some(Arc::new(Mutex::new(Instant::now()))),
        }
    }

    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(t) => *t.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Moves a manual clock forward by `by`; the system clock cannot be
    /// moved (a no-op).
    pub fn advance(&self, by: Duration) {
        if let Some(t) = &self.manual {
            *t.lock().unwrap_or_else(|e| e.into_inner()) += by;
        }
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.manual {
            None => f.write_str("Clock::System"),
            Some(_) => write!(f, "Clock::Manual({:?})", self.now()),
        }
    }
}

/// Two clocks are equal when they are the system clock or the same manual
/// clock.
impl PartialEq for Clock {
    fn eq(&self, other: &Self) -> bool {
        match (&self.manual, &other.manual) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let c = Clock::manual();
        let t = c.now();
        assert_eq!(c.now(), t);
        let same = c.clone();
        same.advance(Duration::from_secs(5));
        assert_eq!(c.now(), t + Duration::from_secs(5));
        assert_eq!(c, same);
        assert_ne!(c, Clock::manual());
        assert_ne!(c, Clock::default());
        assert_eq!(Clock::default(), Clock::default());
        // The system clock ignores advances and never goes back.
        let system = Clock::default();
        let before = system.now();
        system.advance(Duration::from_secs(3600));
        assert!(system.now() < before + Duration::from_secs(3600));
    }
}
