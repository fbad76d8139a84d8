//! The file source: a folder of Kubernetes manifests, read whole at start; then,
//! whenever files in it change (polled; a change is seen within [`POLL_PERIOD`]), those
//! files are read again and the objects that changed are sent ([`super::folder`]).
//! Unusable documents are logged with file, document and field, and skipped.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

use super::folder::{Folder, Listing};
use super::manifest::{self, Object};
use super::{EventSender, SourceEvent};

pub const POLL_PERIOD: Duration = Duration::from_millis(250);
/// How long a changed folder must stay unchanged before it is read.
const SETTLE: Duration = Duration::from_millis(100);

/// Polls `dir` until the process ends (or nobody listens): the whole state once first
/// read, then the objects that changed.
pub async fn run(
    cluster: String,
    dir: PathBuf,
    tx: EventSender,
    reachability: watch::Sender<super::Reachability>,
) {
    let mut last: Option<Listing> = None;
    let mut folder = Folder::default();
    let mut sent_first = false;
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
                let changes = folder.update(&print, |path| parse_file(&cluster, path));
                let changed = changes.len();
                let event = if !sent_first {
                    // Read into an empty folder: the changes are every object it defines.
                    let state = changes.into_state();
                    tracing::info!(
                        cluster,
                        dir = %dir.display(),
                        services = state.services.len(),
                        endpoint_slices = state.slices.len(),
                        nodes = state.nodes.len(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "manifests read"
                    );
                    Some(SourceEvent::Replace(state))
                } else {
                    tracing::info!(
                        cluster,
                        dir = %dir.display(),
                        changed,
                        elapsed_us = started.elapsed().as_micros() as u64,
                        "manifests read"
                    );
                    (!changes.is_empty()).then_some(SourceEvent::Apply(changes))
                };
                if let Some(event) = event {
                    if !tx.send(event).await {
                        return;
                    }
                    sent_first = true;
                }
                last = Some(print);
            }
            Ok(_) => {}
            Err(e) => {
                if last.is_some() || !sent_first {
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

fn fingerprint(dir: &Path) -> std::io::Result<Listing> {
    let mut print = Listing::new();
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
