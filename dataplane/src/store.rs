//! The node's state on disk (sled), so a node that restarts while the control
//! plane is away programs its Services from what it last accepted.
//!
//! Each record carries its version and the resource's protobuf bytes. Every
//! commit is flushed before the delta is ACKed. A record that cannot be read
//! back makes the whole store count as empty: the node then resumes with no
//! versions and the control plane sends everything again.

use std::path::Path;

use kpx_proto::types::{NodeConfig, ServiceView};

use crate::state::{ChangeSet, NodeState, Versioned};

const SERVICE_PREFIX: &[u8] = b"svc/";
const NODE_KEY: &[u8] = b"node";
const FORMAT_KEY: &[u8] = b"format";
const FORMAT: &[u8] = b"kpx-state-v1";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error("state store: {0}")]
    Sled(#[from] sled::Error),
}

/// Why a stored state was thrown away.
#[derive(Debug, thiserror::Error)]
#[error("record {key:?}: {reason}")]
pub struct Damaged {
    pub key: String,
    pub reason: String,
}

pub struct Store {
    db: sled::Db,
    tree: sled::Tree,
}

impl Store {
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let path = dir.join("state.sled");
        let db = sled::open(&path).map_err(|source| Store::open_error(&path, source))?;
        let tree = db.open_tree("resources").map_err(|source| Store::open_error(&path, source))?;
        Ok(Store { db, tree })
    }

    fn open_error(path: &Path, source: sled::Error) -> StoreError {
        StoreError::Open { path: path.display().to_string(), source }
    }

    /// Reads the stored state. A damaged store is reported and yields an empty state.
    pub fn load(&self) -> Result<Result<NodeState, Damaged>, StoreError> {
        let mut state = NodeState::default();
        let format = self.tree.get(FORMAT_KEY)?;
        if format.is_none() && self.tree.len() <= 1 {
            return Ok(Ok(state));
        }
        if format.as_deref() != Some(FORMAT) {
            return Ok(Err(Damaged {
                key: "format".into(),
                reason: "missing or unknown store format".into(),
            }));
        }
        for item in self.tree.iter() {
            let (key, value) = item?;
            let key_text = String::from_utf8_lossy(&key).into_owned();
            let damaged = |reason: String| Damaged { key: key_text.clone(), reason };
            if key.as_ref() == FORMAT_KEY {
                continue;
            }
            let (version, body) = match split_record(&value) {
                Some(r) => r,
                None => return Ok(Err(damaged("truncated record".into()))),
            };
            if let Some(name) = key.strip_prefix(SERVICE_PREFIX) {
                let value = match ServiceView::decode(body) {
                    Ok(v) => v,
                    Err(e) => return Ok(Err(damaged(e.to_string()))),
                };
                if value.resource_name().as_bytes() != name {
                    return Ok(Err(damaged("record does not hold the Service its key names".into())));
                }
                state.services.insert(value.resource_name(), Versioned { version, value });
            } else if key.as_ref() == NODE_KEY {
                match NodeConfig::decode(body) {
                    Ok(value) => state.node = Some(Versioned { version, value }),
                    Err(e) => return Ok(Err(damaged(e.to_string()))),
                }
            } else {
                return Ok(Err(damaged("unknown key".into())));
            }
        }
        Ok(Ok(state))
    }

    /// Writes what changed in one batch and flushes it to disk.
    pub fn commit(&self, state: &NodeState, changes: &ChangeSet) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        batch.insert(FORMAT_KEY, FORMAT);
        for name in &changes.services {
            let key = [SERVICE_PREFIX, name.as_bytes()].concat();
            match state.services.get(name) {
                Some(svc) => batch.insert(key, record(&svc.version, &svc.value.encode())),
                None => batch.remove(key),
            }
        }
        if changes.node {
            match &state.node {
                Some(node) => batch.insert(NODE_KEY, record(&node.version, &node.value.encode())),
                None => batch.remove(NODE_KEY),
            }
        }
        self.tree.apply_batch(batch)?;
        self.db.flush()?;
        Ok(())
    }

    /// Replaces everything stored with `state` (after a damaged load).
    pub fn replace_all(&self, state: &NodeState) -> Result<(), StoreError> {
        self.tree.clear()?;
        let changes = ChangeSet { services: state.services.keys().cloned().collect(), node: true };
        self.commit(state, &changes)
    }
}

#[cfg(test)]
impl Store {
    /// Writes raw bytes under `key` (a test's way to damage a record).
    pub(crate) fn insert_raw(&self, key: &[u8], value: &[u8]) {
        self.tree.insert(key, value).expect("insert");
        self.db.flush().expect("flush");
    }
}

/// `<version length: u16 BE><version><body>`.
fn record(version: &str, body: &[u8]) -> Vec<u8> {
    let len = u16::try_from(version.len()).unwrap_or(u16::MAX);
    let mut out = Vec::with_capacity(2 + version.len() + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&version.as_bytes()[..usize::from(len)]);
    out.extend_from_slice(body);
    out
}

fn split_record(bytes: &[u8]) -> Option<(String, &[u8])> {
    let len = usize::from(u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]));
    let version = std::str::from_utf8(bytes.get(2..2 + len)?).ok()?.to_owned();
    if version.is_empty() {
        return None;
    }
    Some((version, &bytes[2 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_proto::types::{Endpoint, Protocol, ServicePort};

    fn svc(name: &str) -> Versioned<ServiceView> {
        Versioned {
            version: format!("v-{name}"),
            value: ServiceView::new(
                "c",
                "ns",
                name,
                vec!["10.96.0.1".parse().expect("ip")],
                vec![ServicePort::new(
                    "",
                    Protocol::Udp,
                    53,
                    vec![Endpoint {
                        address: "10.0.0.1".parse().expect("ip"),
                        port: 5353,
                        node_name: "n".into(),
                        terminating: false,
                        cluster: String::new(),
                    }],
                )],
            ),
        }
    }

    #[test]
    fn commits_survive_reopen_and_removals_are_removed() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut state = NodeState::default();
        state.services.insert("c/ns/a".into(), svc("a"));
        state.services.insert("c/ns/b".into(), svc("b"));
        {
            let store = Store::open(dir.path()).expect("open");
            store.replace_all(&state).expect("commit");
            state.services.remove("c/ns/b");
            let changes = ChangeSet { services: ["c/ns/b".to_owned()].into(), node: false };
            store.commit(&state, &changes).expect("commit");
        }
        let store = Store::open(dir.path()).expect("reopen");
        assert_eq!(store.load().expect("read").expect("intact"), state);
    }

    #[test]
    fn a_damaged_record_is_reported_not_trusted() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path()).expect("open");
        let mut state = NodeState::default();
        state.services.insert("c/ns/a".into(), svc("a"));
        store.replace_all(&state).expect("commit");
        store.tree.insert(b"svc/c/ns/a", &b"\x00\x02v1\xff\xff\xff"[..]).expect("corrupt");
        let damaged = store.load().expect("read").expect_err("damaged");
        assert_eq!(damaged.key, "svc/c/ns/a");
    }
}
