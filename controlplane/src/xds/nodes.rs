//! What the control plane knows of each connected node, for the admin API:
//! written by the stream tasks, read by `ListNodes`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use tokio::sync::{mpsc, oneshot};

use super::per_type::PerType;
use super::snapshot::ResourceType;

/// Per type and name: the version ACKed and the version NACKed.
pub type Versions = Vec<(ResourceType, String, Option<String>, Option<String>)>;

/// Asks a stream task for its node's versions.
pub type VersionQuery = mpsc::Sender<oneshot::Sender<Versions>>;

#[derive(Debug, Clone, Default)]
pub struct TypeProgress {
    pub acked: usize,
    /// Resources in the response awaiting its ACK.
    pub pending: usize,
    pub in_flight: bool,
    pub last_nack: Option<(String, SystemTime)>,
    /// Since when the node has lacked something (a response was sent and not yet ACKed).
    pub behind_since: Option<Instant>,
    pub sent_at: Option<Instant>,
    pub responses_sent: u64,
}

#[derive(Debug, Clone)]
pub struct NodeEntry {
    pub node: String,
    /// The `--service-proxy-name` the node's agent announced (`""`: none).
    pub proxy_name: String,
    pub peer: Option<SocketAddr>,
    pub connected_since: SystemTime,
    pub types: PerType<TypeProgress>,
    pub query: Option<VersionQuery>,
}

/// Every open stream, by a stream id.
#[derive(Clone, Default)]
pub struct NodeRegistry {
    entries: Arc<Mutex<BTreeMap<u64, NodeEntry>>>,
    next: Arc<AtomicU64>,
}

impl NodeRegistry {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, NodeEntry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new stream; returns its id.
    pub fn open(&self, peer: Option<SocketAddr>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = NodeEntry {
            node: String::new(),
            proxy_name: String::new(),
            peer,
            connected_since: SystemTime::now(),
            types: PerType::default(),
            query: None,
        };
        self.lock().insert(id, entry);
        id
    }

    pub fn close(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Changes what is known of stream `id`.
    pub fn update(&self, id: u64, f: impl FnOnce(&mut NodeEntry)) {
        if let Some(entry) = self.lock().get_mut(&id) {
            f(entry);
        }
    }

    /// Asks the newest stream of `node` for its versions.
    pub async fn versions(&self, node: &str) -> Option<Versions> {
        let query = self.lock().values().rev().find(|e| e.node == node).and_then(|e| e.query.clone())?;
        let (tx, rx) = oneshot::channel();
        query.send(tx).await.ok()?;
        tokio::time::timeout(std::time::Duration::from_secs(5), rx).await.ok()?.ok()
    }

    /// The `--service-proxy-name` of `node`'s newest stream (`""`: none, or not connected).
    pub fn proxy_name(&self, node: &str) -> String {
        self.lock().values().rev().find(|e| e.node == node).map(|e| e.proxy_name.clone()).unwrap_or_default()
    }

    /// Whether some open stream serves `node`.
    pub fn has_node(&self, node: &str) -> bool {
        self.lock().values().any(|e| e.node == node)
    }

    /// Every stream with a node name, by node name.
    pub fn snapshot(&self) -> Vec<NodeEntry> {
        let mut all: Vec<NodeEntry> = self.lock().values().filter(|e| !e.node.is_empty()).cloned().collect();
        all.sort_by(|a, b| a.node.cmp(&b.node));
        all
    }
}
