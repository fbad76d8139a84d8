//! The Kubernetes source: kube-rs watchers of Services, EndpointSlices
//! (`discovery.k8s.io/v1`), Nodes, ServiceCIDRs (`networking.k8s.io/v1`), ServiceExports
//! and ServiceImports (`multicluster.x-k8s.io`, v1beta1 or v1alpha1: [`mcs_version`]) of one cluster. The last three
//! are optional: an API server that does not serve one (ServiceCIDRs before v1.33, the
//! MCS CRDs not installed), or that does not let kpx list it (RBAC of an older install),
//! has none of it: that list counts as complete and empty, the reason is logged once, and
//! the watcher keeps asking (at most once a minute after the first minute), so a CRD
//! installed later is read then. A 404 counts in any form: a real API server answers an
//! unserved group with plain text, not a `Status` ([`status`]). A watch that fails is
//! logged when it starts failing and when it works again, not at every retry.
//!
//! Each object is turned into the model as soon as it arrives (the same
//! reading, and the same errors naming the field, as the file source), so only
//! what the control plane uses is kept. Nothing is sent until all three
//! initial lists are complete: then the whole [`ClusterState`] once
//! ([`SourceEvent::Replace`]), and after that the objects that changed
//! ([`SourceEvent::Apply`]): a lone change at once, a burst at most once per 50 ms. A relist (a watch that expired with 410 Gone, an API
//! server that restarted) is gathered aside and, when complete, swapped in as what
//! differs from the objects known before: an identical relist sends nothing, and nodes
//! see no churn.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node as KubeNode, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice as KubeSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR as KubeServiceCidr;
use kube::api::DynamicObject;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

mod mcs_version;
mod retry;
mod status;
mod token_review;
pub(crate) use mcs_version::resource as mcs_resource;
pub(crate) use status::{is_forbidden, is_not_found};
pub use token_review::TokenReviews;

use super::manifest::{self, Object};
use super::{EventSender, Reachability, SourceEvent};
use crate::model::{diff_by_key, ClusterState, McsVersion, ObjectChanges, ObjectKey};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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

/// Why a Kubernetes source cannot start; the cause is kube's own error.
#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    #[error("cannot read kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("in-cluster configuration")]
    InCluster(#[source] kube::config::InClusterError),
    #[error("cannot make a Kubernetes client")]
    Client(#[source] kube::Error),
}

/// A client of one cluster's API server (what the rest of the control plane holds of it),
/// with the version of `multicluster.x-k8s.io` it serves as the source's watch last
/// found it (what the MCS writer writes in).
#[derive(Clone)]
pub struct ApiClient {
    client: Client,
    /// True while the API server serves v1alpha1 of the MCS group and not v1beta1.
    mcs_v1alpha1: Arc<AtomicBool>,
}

impl ApiClient {
    fn new(client: Client) -> Self {
        ApiClient { client, mcs_v1alpha1: Arc::default() }
    }

    /// kube-rs's client, for the MCS writer (`mcs::kube`).
    pub(crate) fn kube(&self) -> &Client {
        &self.client
    }

    /// The version of `multicluster.x-k8s.io` to write in.
    pub fn mcs_version(&self) -> McsVersion {
        if self.mcs_v1alpha1.load(Ordering::Relaxed) {
            McsVersion::V1Alpha1
        } else {
            McsVersion::V1Beta1
        }
    }

    fn set_mcs_version(&self, version: McsVersion) {
        self.mcs_v1alpha1.store(version == McsVersion::V1Alpha1, Ordering::Relaxed);
    }
}

/// Loads the target's configuration and makes a client (no request is made yet).
pub async fn client(target: &KubeTarget) -> Result<ApiClient, KubeSourceError> {
    let config = match target {
        KubeTarget::Kubeconfig { path, context } => {
            let fail = |source| KubeSourceError::Kubeconfig { path: path.clone(), source };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(fail)?;
            let options = kube::config::KubeConfigOptions { context: context.clone(), ..Default::default() };
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(fail)?
        }
        KubeTarget::InCluster => kube::Config::incluster().map_err(KubeSourceError::InCluster)?,
    };
    Client::try_from(config).map(ApiClient::new).map_err(KubeSourceError::Client)
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

impl<T: Clone + PartialEq> Kind<T> {
    /// Applies one watch event; `object` is the event's object read into the model
    /// (`None`: unusable, already logged). Records in `changes` what changed in `live`.
    fn apply(
        &mut self,
        event: Event<()>,
        key: Option<ObjectKey>,
        object: Option<T>,
        changes: &mut BTreeMap<ObjectKey, Option<T>>,
    ) {
        match event {
            Event::Init => self.listing = Some(BTreeMap::new()),
            Event::InitApply(()) => {
                if let (Some(listing), Some(key), Some(object)) = (self.listing.as_mut(), key, object) {
                    listing.insert(key, object);
                }
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                // O(objects), at relists only; nothing before the first list is complete.
                if self.synced {
                    changes.extend(diff_by_key(&self.live, &listed));
                }
                self.live = listed;
                self.synced = true;
            }
            Event::Apply(()) => match (key, object) {
                (Some(key), Some(object)) if self.live.get(&key) != Some(&object) => {
                    self.live.insert(key.clone(), object.clone());
                    changes.insert(key, Some(object));
                }
                // An object that became unusable is no longer served.
                (Some(key), None) => self.delete(key, changes),
                _ => {}
            },
            Event::Delete(()) => {
                if let Some(key) = key {
                    self.delete(key, changes);
                }
            }
        }
    }

    fn delete(&mut self, key: ObjectKey, changes: &mut BTreeMap<ObjectKey, Option<T>>) {
        if self.live.remove(&key).is_some() {
            changes.insert(key, None);
        }
    }
}

/// A kind an API server may not serve, or kpx may not be allowed to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
/// (ServiceCIDRs, ServiceExports, ServiceImports)
enum Optional {
    Cidrs,
    Exports,
    Imports,
}

impl Optional {
    /// The resource, as the log lines name it.
    fn resource(self) -> &'static str {
        self.describe().0
    }

    /// The resource, and what its absence costs.
    fn describe(self) -> (&'static str, &'static str) {
        match self {
            Optional::Cidrs => {
                ("servicecidrs.networking.k8s.io/v1", "unallocated Service addresses are not dropped")
            }
            Optional::Exports => ("serviceexports.multicluster.x-k8s.io", "this cluster exports nothing"),
            Optional::Imports => {
                ("serviceimports.multicluster.x-k8s.io", "this cluster's nodes get no ClusterSetIP")
            }
        }
    }

    /// Logs, once per change of state, that the kind is not available, and why.
    fn unavailable(self, cluster: &str, forbidden: bool) {
        let (resource, without) = self.describe();
        if forbidden {
            tracing::warn!(
                cluster,
                resource,
                "not allowed to list {resource} (grant list and watch): none known, {without}"
            );
        } else {
            tracing::info!(
                cluster,
                resource,
                "the API server does not serve {resource}: none known, {without}"
            );
        }
    }
}

/// The kinds of one cluster.
#[derive(Default)]
struct Objects {
    services: Kind<crate::model::Service>,
    slices: Kind<crate::model::EndpointSlice>,
    nodes: Kind<crate::model::Node>,
    service_cidrs: Kind<crate::model::ServiceCidr>,
    exports: Kind<crate::model::ServiceExport>,
    imports: Kind<crate::model::ServiceImport>,
    /// MCS EndpointSlices: from the same watch as `slices`, told apart by their labels.
    mcs_slices: Kind<crate::model::McsSlice>,
    /// The kinds whose list the API server answered with 404 or 403 (each logged once).
    unavailable: std::collections::BTreeSet<Optional>,
    /// The watches whose last attempt failed, with the error (logged when they start failing).
    failing: BTreeMap<&'static str, String>,
}

/// What changed in [`Objects`] since the last event sent (nodes by their key, of no namespace).
#[derive(Default)]
struct Pending {
    services: BTreeMap<ObjectKey, Option<crate::model::Service>>,
    slices: BTreeMap<ObjectKey, Option<crate::model::EndpointSlice>>,
    nodes: BTreeMap<ObjectKey, Option<crate::model::Node>>,
    service_cidrs: BTreeMap<ObjectKey, Option<crate::model::ServiceCidr>>,
    exports: BTreeMap<ObjectKey, Option<crate::model::ServiceExport>>,
    imports: BTreeMap<ObjectKey, Option<crate::model::ServiceImport>>,
    mcs_slices: BTreeMap<ObjectKey, Option<crate::model::McsSlice>>,
}

impl Pending {
    fn into_changes(self) -> ObjectChanges {
        ObjectChanges {
            services: self.services,
            slices: self.slices,
            nodes: self.nodes.into_iter().map(|(k, n)| (k.name, n)).collect(),
            service_cidrs: self.service_cidrs.into_iter().map(|(k, s)| (k.name, s)).collect(),
            exports: self.exports,
            imports: self.imports,
            mcs_slices: self.mcs_slices,
        }
    }
}

impl Objects {
    fn synced(&self) -> bool {
        self.services.synced
            && self.slices.synced
            && self.nodes.synced
            && self.service_cidrs.synced
            && self.exports.synced
            && self.imports.synced
    }

    /// Everything known (once, when the initial lists are complete).
    fn state(&self) -> ClusterState {
        ClusterState {
            services: self.services.live.clone(),
            slices: self.slices.live.clone(),
            nodes: self.nodes.live.iter().map(|(k, n)| (k.name.clone(), n.clone())).collect(),
            service_cidrs: self.service_cidrs.live.iter().map(|(k, s)| (k.name.clone(), s.clone())).collect(),
            exports: self.exports.live.clone(),
            imports: self.imports.live.clone(),
            mcs_slices: self.mcs_slices.live.clone(),
        }
    }

    /// The kind answered 404 or 403: it is complete and empty (what was known of it
    /// is gone, as when its CRD is deleted). False when it was already so.
    fn set_unavailable(&mut self, kind: Optional, pending: &mut Pending) -> bool {
        fn empty<T: Clone + PartialEq>(kind: &mut Kind<T>, changes: &mut BTreeMap<ObjectKey, Option<T>>) {
            kind.apply(Event::Init, None, None, changes);
            kind.apply(Event::InitDone, None, None, changes);
        }
        match kind {
            Optional::Cidrs => empty(&mut self.service_cidrs, &mut pending.service_cidrs),
            Optional::Exports => empty(&mut self.exports, &mut pending.exports),
            Optional::Imports => empty(&mut self.imports, &mut pending.imports),
        }
        self.unavailable.insert(kind)
    }
}

/// A watch event of any of the kinds.
enum Change {
    Service(Box<Event<KubeService>>),
    Slice(Box<Event<KubeSlice>>),
    Node(Box<Event<KubeNode>>),
    ServiceCidr(Box<Event<KubeServiceCidr>>),
    Export(Box<Event<DynamicObject>>),
    Import(Box<Event<DynamicObject>>),
    /// An optional kind's list answered 404 (`forbidden: false`) or 403: none known.
    Unavailable {
        kind: Optional,
        forbidden: bool,
    },
    /// A watch failed; it tries again after its backoff.
    Failed {
        watch: &'static str,
        error: watcher::Error,
    },
}

impl Change {
    /// The watch an event came from, and whether the kind is one an API server may not serve.
    fn watch(&self) -> (&'static str, Option<Optional>) {
        match self {
            Change::Service(_) => ("Services", None),
            Change::Slice(_) => ("EndpointSlices", None),
            Change::Node(_) => ("Nodes", None),
            Change::ServiceCidr(_) => (Optional::Cidrs.resource(), Some(Optional::Cidrs)),
            Change::Export(_) => (Optional::Exports.resource(), Some(Optional::Exports)),
            Change::Import(_) => (Optional::Imports.resource(), Some(Optional::Imports)),
            Change::Unavailable { kind, .. } => (kind.resource(), Some(*kind)),
            Change::Failed { watch, .. } => (watch, None),
        }
    }

    /// Whether this is the start of a list (yielded before the list is asked for).
    fn starts_list(&self) -> bool {
        match self {
            Change::Service(e) => matches!(**e, Event::Init),
            Change::Slice(e) => matches!(**e, Event::Init),
            Change::Node(e) => matches!(**e, Event::Init),
            Change::ServiceCidr(e) => matches!(**e, Event::Init),
            Change::Export(e) | Change::Import(e) => matches!(**e, Event::Init),
            Change::Unavailable { .. } | Change::Failed { .. } => false,
        }
    }

    /// Whether this ends a complete list of an optional kind.
    fn listed(&self) -> bool {
        match self {
            Change::ServiceCidr(e) => matches!(**e, Event::InitDone),
            Change::Export(e) | Change::Import(e) => matches!(**e, Event::InitDone),
            _ => false,
        }
    }
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

/// Reads an API object of `kind` into the model, logging (and dropping) what cannot be used.
fn read<K: serde::Serialize + Resource>(cluster: &str, kind: &str, object: &K) -> Option<Object> {
    let key = key_of(object);
    let mut value = match serde_yaml::to_value(object) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(cluster, kind, object = %key, error = %e, "cannot read object");
            return None;
        }
    };
    // A custom resource's list items may come without their kind.
    if let Some(map) = value.as_mapping_mut() {
        map.insert("kind".into(), kind.into());
    }
    match manifest::object(value)? {
        Ok(object) => Some(object),
        Err(e) => {
            tracing::error!(
                cluster,
                kind,
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

/// At most one event per this long while changes keep coming: a lone change goes out at
/// once, the changes of a burst that follow it within `BATCH` go out together at its end.
const BATCH: Duration = Duration::from_millis(50);

/// Takes the next batch of `changes` into `take`: the next change and what has already
/// arrived behind it; and, when the last batch went out less than `BATCH` ago (`last`),
/// what arrives until then too. False once the stream has ended.
async fn next_batch<S: futures::Stream + Unpin>(
    changes: &mut S,
    last: Option<tokio::time::Instant>,
    mut take: impl FnMut(S::Item),
) -> bool {
    use futures::FutureExt;
    let Some(first) = changes.next().await else { return false };
    take(first);
    while let Some(next) = changes.next().now_or_never() {
        match next {
            Some(next) => take(next),
            None => return true,
        }
    }
    let Some(deadline) = last.map(|at| at + BATCH) else { return true };
    while let Ok(Some(next)) = tokio::time::timeout_at(deadline, changes.next()).await {
        take(next);
    }
    true
}

/// How long a watch waits before it tries again after a failure: 1 s, doubling up to
/// 5 s, and back to 1 s once it works again ([`retry`]). kube-rs's default waits up to 30 s (and only starts from
/// 800 ms again after two minutes without a failure), which suits a client on every node;
/// the control plane is the one client here, and after an API server restart it listed
/// again only up to half a minute later. No retry comes sooner than a second after the last.
fn watch_backoff() -> watcher::ExponentialBackoff {
    backoff(Duration::from_secs(5))
}

/// How long the watch of an optional kind waits after a list refused with 404 or 403:
/// 1 s, doubling up to a minute (seven lists in the first minute, then one a minute), so an
/// API server that will never serve it is hardly asked, and a CRD installed later is read
/// within a minute.
fn optional_backoff() -> watcher::ExponentialBackoff {
    backoff(Duration::from_secs(60))
}

fn backoff(longest: Duration) -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(longest)
        .with_factor(2.0)
        .without_max_times()
        .into()
}

type Changes = futures::stream::BoxStream<'static, Change>;

/// The watch of a kind every API server serves: its events as `change`, failures as
/// [`Change::Failed`] (asked again with [`watch_backoff`]).
fn required<K: 'static + Send>(
    watch: impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    name: &'static str,
    change: fn(Event<K>) -> Change,
) -> Changes {
    retry::with_backoff(watch, watch_backoff())
        .map(move |e| match e {
            Ok(e) => change(e),
            Err(error) => Change::Failed { watch: name, error },
        })
        .boxed()
}

/// The watch of an optional kind: its events as `change`, and a list refused with 404 or
/// 403 (in any form) as [`Change::Unavailable`], asked again with [`optional_backoff`].
fn optional<K: 'static + Send>(
    watch: impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    kind: Optional,
    change: fn(Event<K>) -> Change,
) -> Changes {
    retry::with_backoff(watch, optional_backoff())
        .map(move |e| match e {
            Ok(e) => change(e),
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                if is_not_found(&status) || is_forbidden(&status) =>
            {
                Change::Unavailable { kind, forbidden: is_forbidden(&status) }
            }
            Err(error) => Change::Failed { watch: kind.resource(), error },
        })
        .boxed()
}

/// Watches the cluster until the process ends (or nobody listens), sending on `tx`.
pub async fn run(
    cluster: String,
    api: ApiClient,
    tx: EventSender,
    reachability: watch::Sender<Reachability>,
) {
    let client = api.kube().clone();
    let config = watcher::Config::default();
    let services = required(
        watcher::watcher(Api::<KubeService>::all(client.clone()), config.clone()),
        "Services",
        |e| Change::Service(Box::new(e)),
    );
    let slices = required(
        watcher::watcher(Api::<KubeSlice>::all(client.clone()), config.clone()),
        "EndpointSlices",
        |e| Change::Slice(Box::new(e)),
    );
    let nodes =
        required(watcher::watcher(Api::<KubeNode>::all(client.clone()), config.clone()), "Nodes", |e| {
            Change::Node(Box::new(e))
        });
    let service_cidrs = optional(
        watcher::watcher(Api::<KubeServiceCidr>::all(client.clone()), config.clone()),
        Optional::Cidrs,
        |e| Change::ServiceCidr(Box::new(e)),
    );
    let exports =
        optional(mcs_version::watch(api.clone(), "ServiceExport", config.clone()), Optional::Exports, |e| {
            Change::Export(Box::new(e))
        });
    let imports =
        optional(mcs_version::watch(api.clone(), "ServiceImport", config), Optional::Imports, |e| {
            Change::Import(Box::new(e))
        });
    let mut changes = futures::stream::select_all([services, slices, nodes, service_cidrs, exports, imports]);
    tokio::spawn(probe(cluster.clone(), client, reachability));
    let mut objects = Objects::default();
    let mut waiting_logged = false;
    let mut sent_first = false;
    // When the last event went out (a burst becomes one event per BATCH).
    let mut last_sent = None;
    loop {
        let mut pending = Pending::default();
        let take = |change| handle(&cluster, &mut objects, &mut pending, change);
        if !next_batch(&mut changes, last_sent, take).await {
            return;
        }
        if !objects.synced() {
            if !waiting_logged {
                tracing::info!(
                    cluster,
                    "waiting for the initial lists of Services, EndpointSlices, Nodes, ServiceCIDRs, ServiceExports and ServiceImports"
                );
                waiting_logged = true;
            }
            continue;
        }
        let event = if sent_first {
            let changes = pending.into_changes();
            if changes.is_empty() {
                continue;
            }
            tracing::info!(cluster, changed = changes.len(), "cluster state updated");
            SourceEvent::Apply(changes)
        } else {
            let state = objects.state();
            tracing::info!(
                cluster,
                services = state.services.len(),
                endpoint_slices = state.slices.len(),
                nodes = state.nodes.len(),
                service_cidrs = state.service_cidrs.len(),
                service_exports = state.exports.len(),
                service_imports = state.imports.len(),
                "initial lists complete"
            );
            SourceEvent::Replace(state)
        };
        if !tx.send(event).await {
            return;
        }
        last_sent = Some(tokio::time::Instant::now());
        sent_first = true;
    }
}

/// Logs a watch when it starts failing (with the error) and when it works again, not at
/// every retry; and an optional kind when it becomes unavailable or served again.
fn log_health(cluster: &str, objects: &mut Objects, change: &Change) {
    let (watch, optional) = change.watch();
    match change {
        Change::Failed { error, .. } => {
            let error = error.to_string();
            if objects.failing.insert(watch, error.clone()).is_none() {
                tracing::warn!(cluster, watch, error, "watch of {watch} failed; retrying with backoff");
            } else {
                tracing::debug!(cluster, watch, error, "watch of {watch} failed again");
            }
        }
        Change::Unavailable { .. } => {
            objects.failing.remove(watch);
        }
        // A list about to be tried shows nothing yet.
        _ if change.starts_list() => {}
        _ => {
            if objects.failing.remove(watch).is_some() {
                tracing::info!(cluster, watch, "watch of {watch} works again");
            }
            if let Some(kind) = optional {
                if change.listed() && objects.unavailable.remove(&kind) {
                    tracing::info!(cluster, resource = watch, "{watch} is served now: listed");
                }
            }
        }
    }
}

fn handle(cluster: &str, objects: &mut Objects, pending: &mut Pending, change: Change) {
    log_health(cluster, objects, &change);
    match change {
        Change::Service(event) => {
            apply(cluster, "Service", &mut objects.services, *event, &mut pending.services, |o| match o {
                Object::Service(s) => Some(s),
                _ => None,
            })
        }
        Change::Slice(event) => {
            // One watch, two kinds: each sees every event, and the object if it is of its kind
            // (a slice whose labels change from one kind to the other leaves the first).
            let (event, object) = split(*event);
            let key = object.as_ref().map(key_of);
            let read = match (&event, &object) {
                (Event::Delete(()), _) | (_, None) => None,
                (_, Some(o)) => read(cluster, "EndpointSlice", o),
            };
            let (slice, mcs) = match read {
                Some(Object::EndpointSlice(s)) => (Some(s), None),
                Some(Object::McsSlice(m)) => (None, Some(m)),
                _ => (None, None),
            };
            objects.slices.apply(event.clone(), key.clone(), slice, &mut pending.slices);
            objects.mcs_slices.apply(event, key, mcs, &mut pending.mcs_slices);
        }
        Change::Node(event) => {
            apply(cluster, "Node", &mut objects.nodes, *event, &mut pending.nodes, |o| match o {
                Object::Node(n) => Some(n),
                _ => None,
            })
        }
        Change::ServiceCidr(event) => apply(
            cluster,
            "ServiceCIDR",
            &mut objects.service_cidrs,
            *event,
            &mut pending.service_cidrs,
            |o| match o {
                Object::ServiceCidr(s) => Some(s),
                _ => None,
            },
        ),
        Change::Export(event) => {
            apply(cluster, "ServiceExport", &mut objects.exports, *event, &mut pending.exports, |o| match o {
                Object::ServiceExport(e) => Some(e),
                _ => None,
            })
        }
        Change::Import(event) => {
            apply(cluster, "ServiceImport", &mut objects.imports, *event, &mut pending.imports, |o| match o {
                Object::ServiceImport(i) => Some(i),
                _ => None,
            })
        }
        Change::Unavailable { kind, forbidden } => {
            // Asked again with backoff: once served (or allowed), they are listed then.
            if objects.set_unavailable(kind, pending) {
                kind.unavailable(cluster, forbidden);
            }
        }
        // Logged above; the watcher retries with backoff (and relists after 410 Gone) by itself.
        Change::Failed { .. } => {}
    }
}

/// Applies one event of a kind, reading its object into the model (not for deletions).
fn apply<K, T>(
    cluster: &str,
    kind_name: &str,
    kind: &mut Kind<T>,
    event: Event<K>,
    changes: &mut BTreeMap<ObjectKey, Option<T>>,
    pick: fn(Object) -> Option<T>,
) where
    K: serde::Serialize + Resource,
    T: Clone + PartialEq,
{
    let (event, object) = split(event);
    let key = object.as_ref().map(key_of);
    let model = match (&event, &object) {
        (Event::Delete(()), _) | (_, None) => None,
        (_, Some(o)) => read(cluster, kind_name, o).and_then(pick),
    };
    kind.apply(event, key, model, changes);
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

#[cfg(test)]
mod tests;
