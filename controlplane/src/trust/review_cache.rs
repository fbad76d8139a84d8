//! TokenReviews remembered for a while, as kube-apiserver's own webhook token
//! authenticator does: every agent dials again from 100 ms after a refusal, and every node
//! of a cluster reconnects at once after a control-plane restart; each dial would be one
//! TokenReview. A token's answer is kept [`ACCEPTED_FOR`] when it named a node (a token is
//! bound to its pod for its whole life, an hour or more) and [`REFUSED_FOR`] when it did
//! not, so a node that keeps dialling with a bad token costs the API server at most one
//! review a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpx_proto::sync::Locked as _;
use tokio::time::Instant;

use super::TokenReviewer;

/// How long an accepted token's node is remembered.
pub const ACCEPTED_FOR: Duration = Duration::from_secs(60);
/// How long a refusal is remembered.
pub const REFUSED_FOR: Duration = Duration::from_secs(1);
/// Tokens remembered at most (a cluster's nodes, with room); expired ones go first.
const MOST: usize = 16_384;

/// A token's SHA-256 (never the token itself: a 64-bit hash could be collided with on
/// purpose, and a token is a credential), and the audience asked for.
type Key = ([u8; 32], String);

/// An answer, and until when it holds.
type Remembered = (Instant, Result<String, String>);

/// A [`TokenReviewer`] that asks `inner` only for tokens it has no fresh answer for.
pub struct CachedReviews {
    inner: Arc<dyn TokenReviewer>,
    answers: Mutex<HashMap<Key, Remembered>>,
}

impl CachedReviews {
    pub fn new(inner: Arc<dyn TokenReviewer>) -> CachedReviews {
        CachedReviews { inner, answers: Mutex::new(HashMap::new()) }
    }

    fn key(token: &str, audience: &str) -> Key {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut hash = [0u8; 32];
        hash.copy_from_slice(digest.as_ref());
        (hash, audience.to_owned())
    }
}

#[tonic::async_trait]
impl TokenReviewer for CachedReviews {
    async fn node_of(&self, token: &str, audience: &str) -> Result<String, String> {
        let key = Self::key(token, audience);
        let now = Instant::now();
        if let Some((until, answer)) = self.answers.locked().get(&key) {
            if *until > now {
                return answer.clone();
            }
        }
        let answer = self.inner.node_of(token, audience).await;
        let keep = if answer.is_ok() { ACCEPTED_FOR } else { REFUSED_FOR };
        let mut answers = self.answers.locked();
        if answers.len() >= MOST {
            answers.retain(|_, (until, _)| *until > now);
            if answers.len() >= MOST {
                answers.clear();
            }
        }
        answers.insert(key, (now + keep, answer.clone()));
        answer
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Accepts the token "good" for node-a; counts the reviews it was asked for.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    #[tonic::async_trait]
    impl TokenReviewer for Counting {
        async fn node_of(&self, token: &str, _audience: &str) -> Result<String, String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            if token == "good" {
                Ok("node-a".into())
            } else {
                Err("invalid bearer token".into())
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_dialling_again_and_again_costs_one_review_a_second_at_most() {
        let inner = Arc::new(Counting::default());
        let cache = CachedReviews::new(Arc::clone(&inner) as Arc<dyn TokenReviewer>);
        // A refused agent's dial loop: 100 ms, 200 ms, 400 ms, 800 ms, then 1.6 s apart.
        for wait in [0, 100, 200, 400, 800, 1600] {
            tokio::time::sleep(Duration::from_millis(wait)).await;
            assert_eq!(cache.node_of("bad", "kpx").await, Err("invalid bearer token".into()));
        }
        // Asked at 0, 1.5 s (the first after the refusal expired) and 3.1 s.
        assert_eq!(inner.0.load(Ordering::SeqCst), 3);
        // An accepted token is reviewed once a minute; another audience is another question.
        for _ in 0..10 {
            assert_eq!(cache.node_of("good", "kpx").await, Ok("node-a".into()));
        }
        assert_eq!(cache.node_of("good", "other").await, Ok("node-a".into()));
        assert_eq!(inner.0.load(Ordering::SeqCst), 5);
        tokio::time::sleep(ACCEPTED_FOR).await;
        assert_eq!(cache.node_of("good", "kpx").await, Ok("node-a".into()));
        assert_eq!(inner.0.load(Ordering::SeqCst), 6);
    }
}
