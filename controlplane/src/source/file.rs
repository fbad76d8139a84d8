//! The file source: a folder of Kubernetes manifests, read whole at start and
//! again whenever a file in it changes (polled; a change is seen within
//! [`POLL_PERIOD`]). Unusable documents are logged with file, document and
//! field, and skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::manifest::{self, Object};
use crate::model::{ClusterState, ObjectKey};

pub const POLL_PERIOD: Duration = Duration::from_millis(250);
/// How long a changed folder must stay unchanged before it is read.
const SETTLE: Duration = Duration::from_millis(100);

/// What identifies a folder's content without reading it: each file's path, size and mtime.
type Fingerprint = BTreeMap<PathBuf, (u64, Option<SystemTime>)>;

/// The objects read from each file, with the size and mtime they were read at: a change
/// re-parses only the files that changed.
type ParsedFiles = BTreeMap<PathBuf, ((u64, Option<SystemTime>), Arc<Vec<Object>>)>;

pub async fn run(
    cluster: String,
    dir: PathBuf,
    tx: watch::Sender<Option<Arc<ClusterState>>>,
    reachability: watch::Sender<super::Reachability>,
) {
    let mut last: Option<Fingerprint> = None;
    let mut parsed = ParsedFiles::new();
    loop {
        let listed = fingerprint(&dir);
        reachability.send_if_modified(|r| r.observe(&cluster, listed.is_ok()));
        match listed {
            Ok(print) if last.as_ref() != Some(&print) => {
                // Let a writer finish: read only once the folder has been still for a moment.
                tokio::time::sleep(SETTLE).await;
                if fingerprint(&dir).ok().as_ref() != Some(&print) {
                    continue;
                }
                let started = std::time::Instant::now();
                let state = read_files(&cluster, &print, &mut parsed);
                tracing::info!(
                    cluster,
                    dir = %dir.display(),
                    services = state.services.len(),
                    endpoint_slices = state.slices.len(),
                    nodes = state.nodes.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "manifests read"
                );
                tx.send_if_modified(|current| {
                    let changed = current.as_deref() != Some(&state);
                    if changed {
                        *current = Some(Arc::new(state));
                    }
                    changed
                });
                last = Some(print);
            }
            Ok(_) => {}
            Err(e) => {
                if last.is_some() || tx.borrow().is_none() {
                    tracing::warn!(cluster, dir = %dir.display(), error = %e, "cannot list manifest folder");
                }
                last = None;
            }
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

fn is_manifest(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"))
}

fn fingerprint(dir: &Path) -> std::io::Result<Fingerprint> {
    let mut print = Fingerprint::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !is_manifest(&path) {
            continue;
        }
        // A file removed between listing and stat simply drops out.
        if let Ok(meta) = std::fs::metadata(&path) {
            if meta.is_file() {
                print.insert(path, (meta.len(), meta.modified().ok()));
            }
        }
    }
    Ok(print)
}

/// The usable objects of one file; bad documents are logged and left out.
fn parse_file(cluster: &str, path: &Path) -> Vec<Object> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(cluster, file = %path.display(), error = %e, "cannot read manifest");
            return Vec::new();
        }
    };
    let mut objects = Vec::new();
    for result in manifest::parse(&text) {
        match result {
            Ok(object) => objects.push(object),
            Err(e) => tracing::error!(
                cluster,
                file = %path.display(),
                document = e.document,
                object = e.object.trim().trim_start_matches('(').trim_end_matches(')'),
                field = %e.field,
                reason = %e.reason,
                "skipping manifest document: {e}"
            ),
        }
    }
    objects
}

/// Reads every manifest of the folder into one state (later definitions of the same object
/// win), parsing only the files whose size or mtime changed since `parsed` saw them.
fn read_files(cluster: &str, files: &Fingerprint, parsed: &mut ParsedFiles) -> ClusterState {
    parsed.retain(|path, _| files.contains_key(path));
    let mut state = ClusterState::default();
    for (path, print) in files {
        let objects = match parsed.get(path) {
            Some((seen, objects)) if seen == print => Arc::clone(objects),
            _ => {
                let objects = Arc::new(parse_file(cluster, path));
                parsed.insert(path.clone(), (*print, Arc::clone(&objects)));
                objects
            }
        };
        for object in objects.iter() {
            match object {
                Object::Service(s) => {
                    state.services.insert(s.key.clone(), s.clone());
                }
                Object::EndpointSlice(s) => {
                    let key = ObjectKey { namespace: s.namespace.clone(), name: s.name.clone() };
                    state.slices.insert(key, s.clone());
                }
                Object::Node(n) => {
                    state.nodes.insert(n.name.clone(), n.clone());
                }
            }
        }
    }
    state
}
