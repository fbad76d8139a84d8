//! Sources of cluster state. Each named source publishes whole, consistent
//! [`ClusterState`] snapshots on a watch channel; `None` until its first
//! complete read, so nothing partial is ever served.

pub mod file;
pub mod manifest;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::model::ClusterState;

/// The name a source gets when `--source` does not give one.
pub const DEFAULT_CLUSTER: &str = "default";

/// A `--source` argument: `[NAME=]file:DIR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    pub cluster: String,
    pub kind: SourceKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    File(PathBuf),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("--source {0:?}: expected [NAME=]file:DIR")]
    Malformed(String),
    #[error("--source {0:?}: the {1} source is not available in this build (use file:DIR)")]
    Unsupported(String, String),
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
            "kubeconfig" | "in-cluster" => Err(SpecError::Unsupported(text.into(), scheme.into())),
            _ => Err(SpecError::Malformed(text.into())),
        }
    }
}

impl std::fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            SourceKind::File(dir) => write!(f, "{}=file:{}", self.cluster, dir.display()),
        }
    }
}

/// What a running source publishes.
pub type StateReceiver = watch::Receiver<Option<Arc<ClusterState>>>;

/// Starts a source's task; it runs until the process ends.
pub fn spawn(spec: &SourceSpec) -> StateReceiver {
    let (tx, rx) = watch::channel(None);
    match &spec.kind {
        SourceKind::File(dir) => {
            tokio::spawn(file::run(spec.cluster.clone(), dir.clone(), tx));
        }
    }
    rx
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
        assert!(matches!("kubeconfig:/k".parse::<SourceSpec>(), Err(SpecError::Unsupported(..))));
    }
}
