//! How many streams are in their first sync, and giving memory back once none is. A wave
//! of first syncs (thousands of nodes connecting at once) writes gigabytes through
//! 64 KiB pieces; the allocator keeps what was freed for a while (glibc's kept about
//! 20 KiB per node at 5,000 nodes until asked), so when the last first sync ends, and none
//! has started for [`SETTLE`], the freed memory is given back at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long no first sync must run before the memory is given back (a wave of nodes
/// that connect one after the other is one wave).
pub const SETTLE: Duration = Duration::from_secs(1);

/// The streams in their first sync, shared by the server and its streams.
#[derive(Clone)]
pub struct Syncs(Arc<Inner>);

struct Inner {
    running: AtomicUsize,
    release_pending: AtomicBool,
    /// What gives the memory back (the allocator's trim; a counter in tests).
    release: fn(),
    releases: AtomicUsize,
}

impl Default for Syncs {
    fn default() -> Self {
        Syncs::with_release(crate::memory::release_freed)
    }
}

/// A stream's hold while it is in its first sync.
pub struct Syncing(Arc<Inner>);

impl Syncs {
    fn with_release(release: fn()) -> Self {
        Syncs(Arc::new(Inner {
            running: AtomicUsize::new(0),
            release_pending: AtomicBool::new(false),
            release,
            releases: AtomicUsize::new(0),
        }))
    }

    /// A first sync starts; it ends when the hold is dropped.
    pub fn enter(&self) -> Syncing {
        self.0.running.fetch_add(1, Ordering::SeqCst);
        Syncing(Arc::clone(&self.0))
    }

    /// How many first syncs run.
    #[cfg(test)]
    pub fn running(&self) -> usize {
        self.0.running.load(Ordering::SeqCst)
    }

    /// How many times the memory was given back.
    #[cfg(test)]
    pub fn releases(&self) -> usize {
        self.0.releases.load(Ordering::SeqCst)
    }
}

impl Drop for Syncing {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) != 1
            || self.0.release_pending.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.0.release_pending.store(false, Ordering::SeqCst);
            return;
        };
        let inner = Arc::clone(&self.0);
        runtime.spawn(async move {
            tokio::time::sleep(SETTLE).await;
            inner.release_pending.store(false, Ordering::SeqCst);
            if inner.running.load(Ordering::SeqCst) != 0 {
                return;
            }
            let started = Instant::now();
            let release = inner.release;
            if tokio::task::spawn_blocking(release).await.is_ok() {
                inner.releases.fetch_add(1, Ordering::SeqCst);
                tracing::debug!(
                    elapsed_us = started.elapsed().as_micros() as u64,
                    "first syncs done: freed memory given back"
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nothing() {}

    async fn settle() {
        tokio::time::sleep(SETTLE * 2).await;
        // Let the blocking release finish.
        for _ in 0..100 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn memory_is_given_back_once_after_the_last_first_sync_of_a_wave() {
        let syncs = Syncs::with_release(nothing);
        let (a, b) = (syncs.enter(), syncs.enter());
        assert_eq!(syncs.running(), 2);
        drop(a);
        settle().await;
        assert_eq!(syncs.releases(), 0, "one still syncs");
        drop(b);
        let c = syncs.enter();
        drop(c);
        assert_eq!(syncs.running(), 0);
        settle().await;
        assert_eq!(syncs.releases(), 1, "the wave's end, once");
    }

    #[tokio::test]
    async fn a_sync_that_starts_within_the_settle_time_postpones_it() {
        let syncs = Syncs::with_release(nothing);
        drop(syncs.enter());
        let again = syncs.enter();
        settle().await;
        assert_eq!(syncs.releases(), 0, "a sync runs again");
        drop(again);
        settle().await;
        assert_eq!(syncs.releases(), 1);
    }
}
