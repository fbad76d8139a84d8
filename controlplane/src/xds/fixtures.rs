//! What the xds tests build their snapshots from.

use std::sync::Arc;

use super::snapshot::{BuildOptions, Snapshot};
use crate::source::manifest::state_of;

/// `n` Services `s0000…` of cluster `c`, the one numbered `changed` on port 81.
pub fn services(n: usize, changed: Option<usize>) -> String {
    (0..n)
        .map(|i| {
            let port = if Some(i) == changed { 81 } else { 80 };
            format!(
                "kind: Service\nmetadata: {{name: s{i:04}}}\nspec: {{clusterIP: 10.96.{}.{}, ports: [{{port: {port}}}]}}\n---\n",
                i / 250,
                i % 250 + 1
            )
        })
        .collect()
}

/// The snapshot of cluster `c` holding `yaml`, built on `previous` (so it knows what
/// changed since).
pub fn next(yaml: &str, previous: &Snapshot) -> Arc<Snapshot> {
    let clusters = [("c".to_owned(), Arc::new(state_of(yaml)))].into_iter().collect();
    Arc::new(Snapshot::build(&clusters, previous, &BuildOptions::default()))
}
