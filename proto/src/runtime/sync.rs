//! Locks whose holder panicked are taken as they are: kpx's locks guard plain data that is
//! consistent between statements (a map, a counter, a queue), so a poisoned lock still
//! holds a value worth reading, and one panic does not become a panic in every thread.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [`Mutex::lock`], a poisoned lock taken as it is.
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_whose_holder_panicked_still_gives_its_value() {
        let shared = std::sync::Arc::new(Mutex::new(1));
        let holder = std::sync::Arc::clone(&shared);
        let panicked = std::thread::spawn(move || {
            let mut value = holder.locked();
            *value = 2;
            panic!("while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*shared.locked(), 2);
    }
}
