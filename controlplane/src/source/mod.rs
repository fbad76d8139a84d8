//! Sources of cluster state. Each named source sends [`SourceEvent`]s: one
//! [`SourceEvent::Replace`] with its whole state once its first read is complete (so
//! nothing partial is ever served), then [`SourceEvent::Apply`] with what changed, per
//! object. Each also publishes whether its cluster answers ([`Reachability`]).

pub mod file;
mod folder;
pub mod kubernetes;
pub mod manifest;

use std::path::PathBuf;
use std::time::Instant;

use tokio::sync::{mpsc, watch};

use crate::model::{ClusterState, ObjectChanges};

/// The name a source gets when `--source` does not give one.
pub const DEFAULT_CLUSTER: &str = "default";

/// A `--source` argument: `[NAME=]file:DIR`, `[NAME=]kubeconfig:PATH[#CONTEXT]` or `[NAME=]in-cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    pub cluster: String,
    pub kind: SourceKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    File(PathBuf),
    Kube(kubernetes::KubeTarget),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error(
        "--source {0:?}: expected [NAME=]file:DIR, [NAME=]kubeconfig:PATH[#CONTEXT] or [NAME=]in-cluster"
    )]
    Malformed(String),
    #[error("--source {0:?}: cluster name {1:?} must be lower-case letters, digits and '-'")]
    BadName(String, String),
}

impl std::str::FromStr for SourceSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let (cluster, rest) = match text.split_once('=') {
            Some((name, rest)) if !name.contains(':') => (name.to_owned(), rest),
            _ => (DEFAULT_CLUSTER.to_owned(), text),
        };
        let valid_name = !cluster.is_empty()
            && cluster.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid_name {
            return Err(SpecError::BadName(text.into(), cluster));
        }
        let Some((scheme, arg)) = rest.split_once(':').or((rest == "in-cluster").then_some((rest, "")))
        else {
            return Err(SpecError::Malformed(text.into()));
        };
        match scheme {
            "file" if !arg.is_empty() => {
                Ok(SourceSpec { cluster, kind: SourceKind::File(PathBuf::from(arg)) })
            }
            "kubeconfig" if !arg.is_empty() => {
                let (path, context) = match arg.split_once('#') {
                    Some((path, context)) if !context.is_empty() => (path, Some(context.to_owned())),
                    Some(_) => return Err(SpecError::Malformed(text.into())),
                    None => (arg, None),
                };
                let target = kubernetes::KubeTarget::Kubeconfig { path: PathBuf::from(path), context };
                Ok(SourceSpec { cluster, kind: SourceKind::Kube(target) })
            }
            "in-cluster" if arg.is_empty() => {
                Ok(SourceSpec { cluster, kind: SourceKind::Kube(kubernetes::KubeTarget::InCluster) })
            }
            _ => Err(SpecError::Malformed(text.into())),
        }
    }
}

impl std::fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            SourceKind::File(dir) => write!(f, "{}=file:{}", self.cluster, dir.display()),
            SourceKind::Kube(target) => write!(f, "{}={target}", self.cluster),
        }
    }
}

/// What a source says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEvent {
    /// Everything the cluster has: its first complete read (or a complete re-read). The
    /// receiver swaps it in whole and finds what differs from what it had.
    Replace(ClusterState),
    /// What changed since the previous event, per object.
    Apply(ObjectChanges),
}

/// A source's event, with the cluster it is about.
#[derive(Debug)]
pub struct Update {
    pub cluster: String,
    pub event: SourceEvent,
}

/// Where one source sends its events.
#[derive(Debug, Clone)]
pub struct EventSender {
    cluster: String,
    tx: mpsc::Sender<Update>,
}

impl EventSender {
    pub fn new(cluster: &str, tx: mpsc::Sender<Update>) -> Self {
        EventSender { cluster: cluster.to_owned(), tx }
    }

    /// Sends one event; false once nobody listens (the control plane is stopping).
    pub async fn send(&self, event: SourceEvent) -> bool {
        self.tx.send(Update { cluster: self.cluster.clone(), event }).await.is_ok()
    }
}

/// Whether a source's cluster answers (its API server, its folder).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reachability {
    /// Since when it has not answered; `None` while it does.
    pub unreachable_since: Option<Instant>,
}

impl Reachability {
    /// Records one attempt; true when that changes whether it is reachable.
    pub fn observe(&mut self, cluster: &str, answered: bool) -> bool {
        match (answered, self.unreachable_since) {
            (true, Some(since)) => {
                tracing::info!(cluster, down_s = since.elapsed().as_secs(), "cluster reachable again");
                self.unreachable_since = None;
                true
            }
            (false, None) => {
                tracing::warn!(cluster, "cluster unreachable");
                self.unreachable_since = Some(Instant::now());
                true
            }
            _ => false,
        }
    }
}

pub type ReachabilityReceiver = watch::Receiver<Reachability>;

/// A source checked and ready to run.
pub enum Prepared {
    File(PathBuf),
    Kube(kubernetes::ApiClient),
}

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("--source {0}: not a folder")]
    NotAFolder(String),
    #[error("--source {spec}")]
    Kube {
        spec: String,
        #[source]
        source: kubernetes::KubeSourceError,
    },
}

/// Checks a source's configuration (the folder exists, the kubeconfig reads).
pub async fn prepare(spec: &SourceSpec) -> Result<Prepared, PrepareError> {
    match &spec.kind {
        SourceKind::File(dir) if dir.is_dir() => Ok(Prepared::File(dir.clone())),
        SourceKind::File(_) => Err(PrepareError::NotAFolder(spec.to_string())),
        SourceKind::Kube(target) => kubernetes::client(target)
            .await
            .map(Prepared::Kube)
            .map_err(|source| PrepareError::Kube { spec: spec.to_string(), source }),
    }
}

/// Starts a source's tasks, sending their events to `events`; they run until the process
/// ends (or nobody listens).
pub fn spawn(cluster: &str, prepared: Prepared, events: mpsc::Sender<Update>) -> ReachabilityReceiver {
    let tx = EventSender::new(cluster, events);
    let (reach_tx, reach_rx) = watch::channel(Reachability::default());
    match prepared {
        Prepared::File(dir) => {
            tokio::spawn(file::run(cluster.to_owned(), dir, tx, reach_tx));
        }
        Prepared::Kube(client) => {
            tokio::spawn(kubernetes::run(cluster.to_owned(), client, tx, reach_tx));
        }
    }
    reach_rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_source_specs() {
        let s: SourceSpec = "file:/tmp/m".parse().expect("valid");
        assert_eq!(s, SourceSpec { cluster: "default".into(), kind: SourceKind::File("/tmp/m".into()) });
        let s: SourceSpec = "east=file:/a".parse().expect("valid");
        assert_eq!(s.cluster, "east");
        assert!(matches!("nothing".parse::<SourceSpec>(), Err(SpecError::Malformed(_))));
        assert!(matches!("Bad_Name=file:/a".parse::<SourceSpec>(), Err(SpecError::BadName(..))));
        let s: SourceSpec = "west=kubeconfig:/k/config#ctx-1".parse().expect("valid");
        let target =
            kubernetes::KubeTarget::Kubeconfig { path: "/k/config".into(), context: Some("ctx-1".into()) };
        assert_eq!(s, SourceSpec { cluster: "west".into(), kind: SourceKind::Kube(target) });
        assert_eq!(s.to_string(), "west=kubeconfig:/k/config#ctx-1");
        let s: SourceSpec = "in-cluster".parse().expect("valid");
        assert_eq!(s.kind, SourceKind::Kube(kubernetes::KubeTarget::InCluster));
        assert!(matches!("kubeconfig:/k#".parse::<SourceSpec>(), Err(SpecError::Malformed(_))));
        assert!(matches!("in-cluster:x".parse::<SourceSpec>(), Err(SpecError::Malformed(_))));
    }
}
