//! A watch's pauses between failed attempts.
//!
//! kube-rs's `WatchStreamExt::backoff` resets its backoff on every `Ok` item, and a
//! watcher yields `Ok(Event::Init)` *before* each list it tries: a list that fails every
//! time still resets the backoff before each failure, so the watch retries at the backoff's
//! shortest wait forever (eight times a second against an API server that does not serve
//! a CRD). Here only an event that shows the watch working (a listed object, the end of a
//! list, a change) starts the backoff over; `Init` leaves it where it is.

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};

/// `watch` with a pause of `backoff`'s next wait after each error (the error itself is
/// yielded at once); the backoff starts over at the first event that shows the watch works.
pub fn with_backoff<K, B>(
    watch: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    backoff: B,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    B: Backoff + Send + 'static,
{
    let state = (watch.boxed(), backoff, None::<std::time::Duration>);
    futures::stream::unfold(state, |(mut watch, mut backoff, pause)| async move {
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let item = watch.next().await?;
        let pause = match &item {
            Err(_) => backoff.next(),
            Ok(Event::Init) => None,
            Ok(_) => {
                backoff.reset();
                None
            }
        };
        Some((item, (watch, backoff, pause)))
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A backoff of 1 s doubling to 8 s.
    fn doubling() -> watcher::ExponentialBackoff {
        backon::ExponentialBuilder::new()
            .with_min_delay(Duration::from_secs(1))
            .with_max_delay(Duration::from_secs(8))
            .with_factor(2.0)
            .without_max_times()
            .into()
    }

    /// When each item of `items` was taken (seconds from the start).
    async fn taken_at(items: Vec<Result<Event<()>, watcher::Error>>) -> Vec<u64> {
        let start = tokio::time::Instant::now();
        with_backoff(futures::stream::iter(items), doubling())
            .map(|_| (tokio::time::Instant::now() - start).as_secs())
            .collect()
            .await
    }

    fn failed() -> Result<Event<()>, watcher::Error> {
        Err(watcher::Error::NoResourceVersion)
    }

    #[tokio::test(start_paused = true)]
    async fn an_init_before_each_failed_list_does_not_start_the_backoff_over() {
        // What a watcher yields while every list fails: Init, the error, Init, the error…
        let items = (0..5).flat_map(|_| [Ok(Event::Init), failed()]).collect();
        assert_eq!(taken_at(items).await, [0, 0, 1, 1, 3, 3, 7, 7, 15, 15]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_that_completes_starts_the_backoff_over() {
        let items = vec![
            Ok(Event::Init),
            failed(),
            Ok(Event::Init),
            failed(),
            Ok(Event::Init),
            Ok(Event::InitDone),
            failed(),
            Ok(Event::Init),
        ];
        assert_eq!(taken_at(items).await, [0, 0, 1, 1, 3, 3, 3, 4]);
    }
}
