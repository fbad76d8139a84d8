//! The outbound side of a stream: what its task hands to the response body, and the
//! walk permit a first-sync chunk holds until HTTP/2 has taken it.

use std::sync::Arc;
use std::time::Duration;

use kpx_proto::sync::Locked as _;
use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;

use super::stream::Response;

/// How long a walk chunk holds its permit while HTTP/2 has not taken all of it: then the
/// permit goes back to the other streams (the chunk waits for its ACK or `--ack-timeout`),
/// so nodes that stopped reading cannot hold every permit and stall everyone's sync.
pub const WALK_LEASE: Duration = Duration::from_secs(5);

/// What a stream task hands to the response body: boxed, so the channel's slots stay small.
pub type Outbound = Result<Box<Sending>, Box<Status>>;

/// A response on its way to the node and, for a walk chunk, its permit.
#[derive(Debug)]
pub struct Sending {
    pub response: Response,
    /// Held until the response body has handed the chunk's last piece to HTTP/2.
    pub permit: Option<WalkPermit>,
}

/// One side's hold on a walk chunk's permit. The permit is made with two holds, one for
/// the stream task and one for the response: it goes back to the other streams as soon as
/// either lets go (is dropped) — the body once the chunk is written, the stream task at
/// the chunk's answer or the end of its lease. So what bounds the initial syncs in
/// flight is chunks being written, and a node slow to ACK holds no permit meanwhile.
#[derive(Debug)]
pub struct WalkPermit(Arc<std::sync::Mutex<Option<OwnedSemaphorePermit>>>);

impl WalkPermit {
    /// The two holds on `permit`.
    pub(super) fn pair(permit: OwnedSemaphorePermit) -> (WalkPermit, WalkPermit) {
        let shared = Arc::new(std::sync::Mutex::new(Some(permit)));
        (WalkPermit(Arc::clone(&shared)), WalkPermit(shared))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<OwnedSemaphorePermit>> {
        self.0.locked()
    }

    /// Whether the permit is still taken.
    pub(super) fn held(&self) -> bool {
        self.slot().is_some()
    }
}

impl Drop for WalkPermit {
    fn drop(&mut self) {
        self.slot().take();
    }
}
