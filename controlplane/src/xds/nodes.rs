//! What the control plane knows of each connected node, for the admin API:
//! written by the stream tasks, read by `ListNodes`.

use kpx_proto::sync::Locked as _;
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

/// Every open stream, by a stream id. Each stream writes its own entry (its
/// [`StreamEntry`]), so a response or an ACK takes no lock shared with other streams.
#[derive(Clone, Default)]
pub struct NodeRegistry {
    entries: Arc<Mutex<BTreeMap<u64, Arc<Mutex<NodeEntry>>>>>,
    next: Arc<AtomicU64>,
}

/// One stream's entry in the registry, written by its stream; gone from the registry when
/// the stream closes.
pub struct StreamEntry {
    id: u64,
    entry: Arc<Mutex<NodeEntry>>,
    registry: NodeRegistry,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.locked()
}

impl StreamEntry {
    /// Changes what is known of the stream.
    pub fn update<R>(&self, f: impl FnOnce(&mut NodeEntry) -> R) -> R {
        f(&mut locked(&self.entry))
    }

    /// The stream closed: its entry leaves the registry, which is returned.
    pub fn close(self) -> NodeRegistry {
        self.registry.clone()
    }
}

impl Drop for StreamEntry {
    fn drop(&mut self) {
        locked(&self.registry.entries).remove(&self.id);
    }
}

impl NodeRegistry {
    /// Every entry, each read under its own lock.
    fn each<R>(&self, mut f: impl FnMut(&NodeEntry) -> Option<R>) -> Vec<R> {
        let entries: Vec<Arc<Mutex<NodeEntry>>> = locked(&self.entries).values().cloned().collect();
        entries.iter().filter_map(|e| f(&locked(e))).collect()
    }

    /// A new stream's entry (removed from the registry when dropped).
    pub fn open(&self, peer: Option<SocketAddr>) -> StreamEntry {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Mutex::new(NodeEntry {
            node: String::new(),
            proxy_name: String::new(),
            peer,
            connected_since: SystemTime::now(),
            types: PerType::default(),
            query: None,
        }));
        locked(&self.entries).insert(id, Arc::clone(&entry));
        StreamEntry { id, entry, registry: self.clone() }
    }

    /// Asks the newest stream of `node` for its versions.
    pub async fn versions(&self, node: &str) -> Option<Versions> {
        let query = self.each(|e| (e.node == node).then(|| e.query.clone())).into_iter().next_back()??;
        let (tx, rx) = oneshot::channel();
        query.send(tx).await.ok()?;
        tokio::time::timeout(std::time::Duration::from_secs(5), rx).await.ok()?.ok()
    }

    /// The `--service-proxy-name` of `node`'s newest stream (`""`: none, or not connected).
    pub fn proxy_name(&self, node: &str) -> String {
        self.each(|e| (e.node == node).then(|| e.proxy_name.clone())).pop().unwrap_or_default()
    }

    /// Whether some open stream serves `node`.
    pub fn has_node(&self, node: &str) -> bool {
        !self.each(|e| (e.node == node).then_some(())).is_empty()
    }

    /// Every stream with a node name, by node name.
    pub fn snapshot(&self) -> Vec<NodeEntry> {
        let mut all: Vec<NodeEntry> = self.each(|e| (!e.node.is_empty()).then(|| e.clone()));
        all.sort_by(|a, b| a.node.cmp(&b.node));
        all
    }
}
