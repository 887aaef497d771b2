//! The one way to take a std lock in Tether. A lock is poisoned when a thread panicked while
//! holding it; every lock here guards data that stays consistent between statements (maps,
//! counters, slots), so the lock is taken anyway rather than spreading the panic to every
//! later caller.
//!
//! `clippy.toml` forbids `Mutex::lock`, `RwLock::read` and `RwLock::write` elsewhere, so this
//! stays the only place that decides what a poisoned lock means.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `locked()` for a `Mutex`: the guard, poisoned or not.
pub trait Lock<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Lock<T> for Mutex<T> {
    #[allow(clippy::disallowed_methods)]
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `read_locked()` / `write_locked()` for an `RwLock`, poisoned or not.
pub trait RwLockExt<T: ?Sized> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    #[allow(clippy::disallowed_methods)]
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    #[allow(clippy::disallowed_methods)]
    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_still_taken() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.locked();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
        let r = RwLock::new(5);
        *r.write_locked() = 6;
        assert_eq!(*r.read_locked(), 6);
    }
}

/// A value read often and replaced whole now and then (a reloaded config): a reader takes
/// the current one (an `Arc`) and lets go of the lock at once.
#[derive(Debug, Default)]
pub struct Live<T>(RwLock<std::sync::Arc<T>>);

impl<T> Live<T> {
    pub fn new(value: std::sync::Arc<T>) -> Self {
        Self(RwLock::new(value))
    }

    /// The current value.
    pub fn get(&self) -> std::sync::Arc<T> {
        self.0.read_locked().clone()
    }

    /// Replaces the value; readers that took the old one keep it.
    pub fn set(&self, value: std::sync::Arc<T>) {
        *self.0.write_locked() = value;
    }
}
