//! The Kubernetes source: kube-rs watchers of Services, EndpointSlices
//! (`discovery.k8s.io/v1`) and Nodes of one cluster.
//!
//! Each object is turned into the model as soon as it arrives (the same
//! reading, and the same errors naming the field, as the file source), so only
//! what the control plane uses is kept. Nothing is published until all three
//! initial lists are complete; after that a whole [`ClusterState`] is published
//! per batch of events. A relist (a watch that expired with 410 Gone, an API
//! server that restarted) is gathered aside and swapped in when complete, and an
//! identical relist publishes nothing: nodes see no churn.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node as KubeNode, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice as KubeSlice;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

use super::manifest::{self, Object};
use super::Reachability;
use crate::model::{ClusterState, ObjectKey};

/// Where the API server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeTarget {
    /// A kubeconfig file and, optionally, one of its contexts (else its current one).
    Kubeconfig { path: PathBuf, context: Option<String> },
    /// The service account of the pod the control plane runs in.
    InCluster,
}

impl std::fmt::Display for KubeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KubeTarget::Kubeconfig { path, context: None } => write!(f, "kubeconfig:{}", path.display()),
            KubeTarget::Kubeconfig { path, context: Some(c) } => {
                write!(f, "kubeconfig:{}#{c}", path.display())
            }
            KubeTarget::InCluster => f.write_str("in-cluster"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    #[error("cannot read kubeconfig {path}: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("in-cluster configuration: {0}")]
    InCluster(String),
    #[error("cannot make a Kubernetes client: {0}")]
    Client(String),
}

/// Loads the target's configuration and makes a client (no request is made yet).
pub async fn client(target: &KubeTarget) -> Result<Client, KubeSourceError> {
    let config = match target {
        KubeTarget::Kubeconfig { path, context } => {
            let fail = |reason: String| KubeSourceError::Kubeconfig { path: path.clone(), reason };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| fail(e.to_string()))?;
            let options = kube::config::KubeConfigOptions { context: context.clone(), ..Default::default() };
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| fail(e.to_string()))?
        }
        KubeTarget::InCluster => {
            kube::Config::incluster().map_err(|e| KubeSourceError::InCluster(e.to_string()))?
        }
    };
    Client::try_from(config).map_err(|e| KubeSourceError::Client(e.to_string()))
}

/// One kind's objects, in the model, by key.
struct Kind<T> {
    live: BTreeMap<ObjectKey, T>,
    /// A list in progress (first sync or relist), swapped in when complete.
    listing: Option<BTreeMap<ObjectKey, T>>,
    synced: bool,
}

impl<T> Default for Kind<T> {
    fn default() -> Self {
        Kind { live: BTreeMap::new(), listing: None, synced: false }
    }
}

impl<T> Kind<T> {
    /// Applies one watch event; `object` is the event's object read into the model
    /// (`None`: unusable, already logged). True when what is live changed.
    fn apply(&mut self, event: Event<()>, key: Option<ObjectKey>, object: Option<T>) -> bool {
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Event::InitApply(()) => {
                if let (Some(listing), Some(key), Some(object)) = (self.listing.as_mut(), key, object) {
                    listing.insert(key, object);
                }
                false
            }
            Event::InitDone => {
                self.live = self.listing.take().unwrap_or_default();
                self.synced = true;
                true
            }
            Event::Apply(()) => match (key, object) {
                (Some(key), Some(object)) => {
                    self.live.insert(key, object);
                    true
                }
                // An object that became unusable is no longer served.
                (Some(key), None) => self.live.remove(&key).is_some(),
                _ => false,
            },
            Event::Delete(()) => key.is_some_and(|key| self.live.remove(&key).is_some()),
        }
    }
}

/// The three kinds of one cluster.
#[derive(Default)]
struct Objects {
    services: Kind<crate::model::Service>,
    slices: Kind<crate::model::EndpointSlice>,
    nodes: Kind<crate::model::Node>,
}

impl Objects {
    fn synced(&self) -> bool {
        self.services.synced && self.slices.synced && self.nodes.synced
    }

    fn state(&self) -> ClusterState {
        ClusterState {
            services: self.services.live.clone(),
            slices: self.slices.live.clone(),
            nodes: self.nodes.live.iter().map(|(k, n)| (k.name.clone(), n.clone())).collect(),
        }
    }
}

/// A watch event of any of the three kinds.
enum Change {
    Service(Box<Event<KubeService>>),
    Slice(Box<Event<KubeSlice>>),
    Node(Box<Event<KubeNode>>),
}

/// The event without its object, and the object.
fn split<K>(event: Event<K>) -> (Event<()>, Option<K>) {
    match event {
        Event::Init => (Event::Init, None),
        Event::InitDone => (Event::InitDone, None),
        Event::InitApply(k) => (Event::InitApply(()), Some(k)),
        Event::Apply(k) => (Event::Apply(()), Some(k)),
        Event::Delete(k) => (Event::Delete(()), Some(k)),
    }
}

fn key_of<K: Resource>(object: &K) -> ObjectKey {
    ObjectKey { namespace: object.namespace().unwrap_or_default(), name: object.name_any() }
}

/// Reads an API object into the model, logging (and dropping) what cannot be used.
fn read<K: serde::Serialize + Resource<DynamicType = ()>>(cluster: &str, object: &K) -> Option<Object> {
    let key = key_of(object);
    let value = match serde_yaml::to_value(object) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(cluster, kind = %K::kind(&()), object = %key, error = %e, "cannot read object");
            return None;
        }
    };
    match manifest::object(value)? {
        Ok(object) => Some(object),
        Err(e) => {
            tracing::error!(
                cluster,
                kind = %K::kind(&()),
                object = %key,
                field = %e.field,
                reason = %e.reason,
                "skipping object: {}: {}",
                e.field,
                e.reason
            );
            None
        }
    }
}

/// How long events are gathered before one state is published.
const BATCH: Duration = Duration::from_millis(50);

/// Watches the cluster until the process ends, publishing on `tx`.
pub async fn run(
    cluster: String,
    client: Client,
    tx: watch::Sender<Option<Arc<ClusterState>>>,
    reachability: watch::Sender<Reachability>,
) {
    let config = watcher::Config::default();
    let services = watcher::watcher(Api::<KubeService>::all(client.clone()), config.clone())
        .default_backoff()
        .map(|e| e.map(|e| Change::Service(Box::new(e))));
    let slices = watcher::watcher(Api::<KubeSlice>::all(client.clone()), config.clone())
        .default_backoff()
        .map(|e| e.map(|e| Change::Slice(Box::new(e))));
    let nodes = watcher::watcher(Api::<KubeNode>::all(client.clone()), config)
        .default_backoff()
        .map(|e| e.map(|e| Change::Node(Box::new(e))));
    let mut changes = futures::stream::select_all([services.boxed(), slices.boxed(), nodes.boxed()]);
    tokio::spawn(probe(cluster.clone(), client, reachability));
    let mut objects = Objects::default();
    let mut waiting_logged = false;
    loop {
        let Some(first) = changes.next().await else { return };
        let mut changed = handle(&cluster, &mut objects, first);
        // Gather what else arrives right away, so a burst becomes one state.
        let deadline = tokio::time::Instant::now() + BATCH;
        while let Ok(Some(next)) = tokio::time::timeout_at(deadline, changes.next()).await {
            changed |= handle(&cluster, &mut objects, next);
        }
        if !objects.synced() {
            if !waiting_logged {
                tracing::info!(
                    cluster,
                    "waiting for the initial lists of Services, EndpointSlices and Nodes"
                );
                waiting_logged = true;
            }
            continue;
        }
        if !changed && tx.borrow().is_some() {
            continue;
        }
        let state = objects.state();
        tx.send_if_modified(|current| {
            let differs = current.as_deref() != Some(&state);
            if differs {
                tracing::info!(
                    cluster,
                    services = state.services.len(),
                    endpoint_slices = state.slices.len(),
                    nodes = state.nodes.len(),
                    "cluster state updated"
                );
                *current = Some(Arc::new(state));
            }
            differs
        });
    }
}

fn handle(cluster: &str, objects: &mut Objects, change: Result<Change, watcher::Error>) -> bool {
    match change {
        Ok(Change::Service(event)) => apply(cluster, &mut objects.services, *event, |o| match o {
            Object::Service(s) => Some(s),
            _ => None,
        }),
        Ok(Change::Slice(event)) => apply(cluster, &mut objects.slices, *event, |o| match o {
            Object::EndpointSlice(s) => Some(s),
            _ => None,
        }),
        Ok(Change::Node(event)) => apply(cluster, &mut objects.nodes, *event, |o| match o {
            Object::Node(n) => Some(n),
            _ => None,
        }),
        Err(e) => {
            // The watcher retries with backoff (and relists after 410 Gone) by itself.
            tracing::warn!(cluster, error = %e, "watch failed; retrying");
            false
        }
    }
}

/// Applies one event of a kind, reading its object into the model (not for deletions).
fn apply<K, T>(cluster: &str, kind: &mut Kind<T>, event: Event<K>, pick: fn(Object) -> Option<T>) -> bool
where
    K: serde::Serialize + Resource<DynamicType = ()>,
{
    let (event, object) = split(event);
    let key = object.as_ref().map(key_of);
    let model = match (&event, &object) {
        (Event::Delete(()), _) | (_, None) => None,
        (_, Some(o)) => read(cluster, o).and_then(pick),
    };
    kind.apply(event, key, model)
}

/// How often the API server is asked whether it answers.
const PROBE_PERIOD: Duration = Duration::from_secs(2);

/// Keeps `reachability` up to date by asking the API server its version.
async fn probe(cluster: String, client: Client, reachability: watch::Sender<Reachability>) {
    loop {
        let answered = tokio::time::timeout(PROBE_PERIOD * 2, client.apiserver_version()).await;
        let ok = matches!(answered, Ok(Ok(_)));
        reachability.send_if_modified(|r| r.observe(&cluster, ok));
        tokio::time::sleep(PROBE_PERIOD).await;
    }
}
