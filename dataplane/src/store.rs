//! The node's state on disk (sled), so a node that restarts while the control
//! plane is away programs its Services from what it last accepted.
//!
//! Each record carries its version, a checksum and the resource's protobuf bytes; a
//! manifest record, written in the same batch as every change, holds how many records
//! there are and the XOR of their checksums, so a store that lost or changed records in
//! the middle is caught, not just a record that does not decode. Every commit is flushed
//! before the delta is ACKed. A store that is damaged in any way — a record or the
//! manifest that does not check out, or a database sled cannot open at all (that one is
//! moved aside) — is reported as [`Damaged`]: the node then resumes with no versions and
//! the control plane sends everything again.

use std::path::{Path, PathBuf};

use kpx_proto::types::{NodeConfig, ServiceView};
use xxhash_rust::xxh3::xxh3_64;

use crate::state::{ChangeSet, NodeState, Versioned};

const SERVICE_PREFIX: &[u8] = b"svc/";
const NODE_KEY: &[u8] = b"node";
const FORMAT_KEY: &[u8] = b"format";
const MANIFEST_KEY: &[u8] = b"manifest";
const INSTALL_KEY: &[u8] = b"control-plane-service-uid";
const FORMAT: &[u8] = b"kpx-state-v2";
const DB: &str = "state.sled";
/// sled's page cache. sled's own default is 1 GiB, which it lowers to a container's memory
/// limit with an ERROR in the log (the chart's 512 MiB limit did). kpx reads the store
/// whole once, at start, and afterwards only the records a change replaces: with a larger
/// cache sled kept every record it wrote in memory (4 MB at 10,000 Services × 10
/// endpoints, heaptrack), 2 MiB of the agent's RSS at that scale; with 1 MiB it pages
/// most out and a change's write reads its record back from the file (the ACK's p50 did
/// not move: `tests/bench-scale.sh --node-scales 10000x10`) — though not those of large
/// writes: see [`Store::let_go_of_cache`].
const CACHE_BYTES: u64 = 1024 * 1024;
/// How long opening waits for the database's lock (see [`Store::open_unlocked`]).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether opening failed because the database's lock is held.
fn locked(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("could not acquire lock")
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error("state store {path}: cannot move the damaged store aside: {source}")]
    MoveAside { path: String, source: std::io::Error },
    #[error("state store {path}: cannot remove it: {source}")]
    Remove { path: String, source: std::io::Error },
    #[error("state store: {0}")]
    Sled(#[from] sled::Error),
    #[error("state store {path}: closed after a failed write, and not open again yet")]
    Closed { path: String },
}

/// Why a stored state was thrown away.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct Damaged {
    /// The record, or what else was wrong (`manifest`, `database`).
    pub what: String,
    pub reason: String,
}

impl Damaged {
    fn new(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Damaged { what: what.into(), reason: reason.into() }
    }
}

/// How many records there are and the XOR of their checksums.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Manifest {
    count: u64,
    digest: u64,
}

impl Manifest {
    fn encode(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.count.to_le_bytes());
        out[8..].copy_from_slice(&self.digest.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Manifest> {
        Some(Manifest {
            count: u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?),
            digest: u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?),
        })
    }
}

pub struct Store {
    dir: PathBuf,
    /// `None` only while it is being opened again after a failed write (see [`Store::heal`]).
    open: Option<Open>,
    manifest: Manifest,
    /// Set when the database could not be opened and was replaced by an empty one.
    replaced: Option<Damaged>,
    /// A write failed (a full disk, an I/O error): sled may refuse every later one, and
    /// what it holds may lag behind the state the kernel has.
    failed: bool,
    /// Bytes of records written since sled was last opened (see [`Store::let_go_of_cache`]).
    written_since_open: u64,
}

/// An open sled database and kpx's tree in it.
struct Open {
    db: sled::Db,
    tree: sled::Tree,
    /// Which install the state is from (see [`Store::install`]), apart from the records
    /// and their manifest.
    install: sled::Tree,
}

/// What [`Store::remove`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// There was none.
    Absent,
    /// A running agent holds it: kept.
    InUse,
}

impl Store {
    /// Opens the store in `dir`. A database sled cannot open is moved aside
    /// (`state.sled.damaged-<unix seconds>`) and replaced by an empty one; [`Store::load`]
    /// then reports it as damaged.
    /// Opens the database, waiting up to [`LOCK_WAIT`] while its lock is held: a handle
    /// just dropped in this process (a store opened again after a failed write) lets go of
    /// it only once sled's own threads have ended.
    fn open_unlocked(path: &Path) -> Result<Open, StoreError> {
        let started = std::time::Instant::now();
        loop {
            match Self::open_db(path) {
                Err(StoreError::Open { source: sled::Error::Io(e), .. })
                    if locked(&e) && started.elapsed() < LOCK_WAIT =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    /// Removes the store kept in `dir` (and any damaged one moved aside there), unless an
    /// agent holds it (its lock): that one is running and its state is current. Nothing
    /// else in `dir` is touched.
    pub fn remove(dir: &Path) -> Result<Removal, StoreError> {
        let path = dir.join(DB);
        if path.exists() {
            match Self::open_db(&path) {
                Err(StoreError::Open { source: sled::Error::Io(e), .. }) if locked(&e) => {
                    return Ok(Removal::InUse)
                }
                // Opened (and closed again), or damaged: either way, not in use.
                _ => {}
            }
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Removal::Absent),
            Err(source) => return Err(StoreError::Remove { path: dir.display().to_string(), source }),
        };
        let mut removal = Removal::Absent;
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(DB) {
                let path = entry.path();
                let result =
                    if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
                result.map_err(|source| StoreError::Remove { path: path.display().to_string(), source })?;
                removal = Removal::Removed;
            }
        }
        Ok(removal)
    }

    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let path = dir.join(DB);
        let store = |open, replaced| Store {
            dir: dir.to_owned(),
            open: Some(open),
            manifest: Manifest::default(),
            replaced,
            failed: false,
            written_since_open: 0,
        };
        match Self::open_unlocked(&path) {
            Ok(open) => Ok(store(open, None)),
            // Another process holds it: not damage.
            Err(StoreError::Open { source: sled::Error::Io(e), .. }) if locked(&e) => {
                Err(StoreError::Open { path: path.display().to_string(), source: sled::Error::Io(e) })
            }
            Err(e) => {
                let aside = PathBuf::from(format!(
                    "{}.damaged-{}",
                    path.display(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                ));
                std::fs::rename(&path, &aside)
                    .map_err(|source| StoreError::MoveAside { path: path.display().to_string(), source })?;
                let open = Self::open_db(&path)?;
                let replaced = Damaged::new("database", format!("{e}; moved aside to {}", aside.display()));
                Ok(store(open, Some(replaced)))
            }
        }
    }

    fn open_db(path: &Path) -> Result<Open, StoreError> {
        let open_error = |source| StoreError::Open { path: path.display().to_string(), source };
        let db = sled::Config::new().path(path).cache_capacity(CACHE_BYTES).open().map_err(open_error)?;
        let tree = db.open_tree("resources").map_err(open_error)?;
        let install = db.open_tree("install").map_err(open_error)?;
        Ok(Open { db, tree, install })
    }

    fn opened(&self) -> Result<&Open, StoreError> {
        self.open.as_ref().ok_or_else(|| StoreError::Closed { path: self.dir.join(DB).display().to_string() })
    }

    /// After a failed write: closes sled, opens it again (a database it cannot open is
    /// moved aside, as at start) and rewrites it whole from `state`, the state the kernel
    /// holds. Nothing to do while no write has failed; still failed if this fails too.
    pub fn heal(&mut self, state: &NodeState) -> Result<(), StoreError> {
        if !self.failed {
            return Ok(());
        }
        // sled holds a lock on its files: the old handle goes before the new one opens.
        self.open = None;
        let fresh = Store::open(&self.dir)?;
        self.open = fresh.open;
        self.replace_all(state)?;
        self.failed = false;
        tracing::info!(
            services = state.services.len(),
            "state store writable again: rewritten from the accepted state"
        );
        Ok(())
    }

    /// Reads the stored state, checking every record and the manifest. A damaged store is
    /// reported (the caller decides what to do with the kernel) and reads as nothing.
    pub fn load(&mut self) -> Result<Result<NodeState, Damaged>, StoreError> {
        if let Some(damaged) = self.replaced.take() {
            return Ok(Err(damaged));
        }
        let mut state = NodeState::default();
        let tree = &self.opened()?.tree;
        let format = tree.get(FORMAT_KEY)?;
        if format.is_none() && tree.is_empty() {
            self.manifest = Manifest::default();
            return Ok(Ok(state));
        }
        if format.as_deref() != Some(FORMAT) {
            let found = format.map(|f| String::from_utf8_lossy(&f).into_owned()).unwrap_or_default();
            return Ok(Err(Damaged::new(
                "format",
                format!("{found:?} is not {:?}", String::from_utf8_lossy(FORMAT)),
            )));
        }
        // Copied out of sled whole before any is decoded, and sled's pages let go of in
        // between: the decoded Services are then allocated where those pages were rather
        // than among them. (Decoded as sled read them, the freed pages left holes in the
        // heap that the agent kept: at 50,000 Services × 10 endpoints a restart's peak
        // RSS was 127 MiB, 117 MiB copied out first; the running agent's, 106 MiB.)
        let records = Records::read(tree)?;
        self.let_go_of_cache()?;
        let mut seen = Manifest::default();
        let mut stored: Option<Manifest> = None;
        for (key, value) in records.iter() {
            // Named only when reported: a restart's load reads every record.
            let name = || String::from_utf8_lossy(key).into_owned();
            if key == FORMAT_KEY {
                continue;
            }
            if key == MANIFEST_KEY {
                stored = Manifest::decode(value);
                if stored.is_none() {
                    return Ok(Err(Damaged::new("manifest", "truncated")));
                }
                continue;
            }
            let Some((version, checksum, body)) = split_record(value) else {
                return Ok(Err(Damaged::new(name(), "truncated record")));
            };
            if checksum != record_checksum(key, &version, body) {
                return Ok(Err(Damaged::new(name(), "checksum does not match the record")));
            }
            seen.count += 1;
            seen.digest ^= checksum;
            if let Some(resource) = key.strip_prefix(SERVICE_PREFIX) {
                let value = match ServiceView::decode(body) {
                    Ok(v) => v,
                    Err(e) => return Ok(Err(Damaged::new(name(), e.to_string()))),
                };
                let resource_name = value.resource_name();
                if resource_name.as_bytes() != resource {
                    return Ok(Err(Damaged::new(name(), "record does not hold the Service its key names")));
                }
                state.services_mut().insert(resource_name, Versioned { version, value: value.into() });
            } else if key == NODE_KEY {
                match NodeConfig::decode(body) {
                    Ok(value) => state.node = Some(Versioned { version, value }),
                    Err(e) => return Ok(Err(Damaged::new(name(), e.to_string()))),
                }
            } else {
                return Ok(Err(Damaged::new(name(), "unknown key")));
            }
        }
        drop(records);
        match stored {
            None => return Ok(Err(Damaged::new("manifest", "missing"))),
            Some(m) if m != seen => {
                return Ok(Err(Damaged::new(
                    "manifest",
                    format!("says {} records, {} are there or they differ", m.count, seen.count),
                )))
            }
            Some(_) => {}
        }
        self.manifest = seen;
        Ok(Ok(state))
    }

    /// Closes sled and opens it again: after the whole read at start, and whenever a
    /// cache's worth of records was written since it opened. sled keeps in memory the
    /// pages a read brought in and the records written, whatever its cache's size
    /// (heaptrack: about 20 MB after reading 50,000 Services × 10 endpoints; every record,
    /// 2.2 MB, after an initial sync of 10,000 × 10): opened again, it holds none. Not
    /// free: opening takes 7 ms at 10,000 Services, 40 ms at 50,000, and the writes after
    /// it are slower (an initial sync's time in the agent, same machine and run: 0.98 →
    /// 1.31 s at 10,000 × 10, 6.34 → 7.43 s at 50,000 × 10, for a peak 2 MiB lower).
    fn let_go_of_cache(&mut self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        self.open = None;
        self.open = Some(Self::open_unlocked(&self.dir.join(DB))?);
        self.written_since_open = 0;
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "state store opened again: its cache let go"
        );
        Ok(())
    }

    /// Writes what changed in one batch (with the manifest) and flushes it to disk. A
    /// failure leaves the store to [`Store::heal`] before the next write.
    pub fn commit(&mut self, state: &NodeState, changes: &ChangeSet) -> Result<(), StoreError> {
        let written = self.write(state, changes);
        if let Err(e) = &written {
            tracing::warn!(error = %e, "writing the state store failed; it is opened again and rewritten before the next write");
            self.failed = true;
        }
        written
    }

    fn write(&mut self, state: &NodeState, changes: &ChangeSet) -> Result<(), StoreError> {
        let Open { db, tree, .. } = self.opened()?;
        let mut batch = sled::Batch::default();
        let mut manifest = self.manifest;
        let mut written = 0;
        batch.insert(FORMAT_KEY, FORMAT);
        let mut put = |key: Vec<u8>, new: Option<(&str, Vec<u8>)>| -> Result<(), StoreError> {
            if let Some(old) = tree.get(&key)? {
                if let Some((_, checksum, _)) = split_record(&old) {
                    manifest.count = manifest.count.saturating_sub(1);
                    manifest.digest ^= checksum;
                }
            }
            match new {
                Some((version, body)) => {
                    let (value, checksum) = record(&key, version, &body);
                    written += value.len() as u64;
                    manifest.count += 1;
                    manifest.digest ^= checksum;
                    batch.insert(key, value);
                }
                None => batch.remove(key),
            }
            Ok(())
        };
        for name in &changes.services {
            let key = [SERVICE_PREFIX, name.as_bytes()].concat();
            put(key, state.services.get(name).map(|s| (s.version.as_str(), s.value.encode())))?;
        }
        if changes.node {
            put(NODE_KEY.to_vec(), state.node.as_ref().map(|n| (n.version.as_str(), n.value.encode())))?;
        }
        batch.insert(MANIFEST_KEY, &manifest.encode()[..]);
        tree.apply_batch(batch)?;
        db.flush()?;
        self.manifest = manifest;
        self.written_since_open += written;
        if self.written_since_open >= CACHE_BYTES {
            self.let_go_of_cache()?;
        }
        Ok(())
    }

    /// The install the stored state came from: the UID of its control plane's Service, if
    /// the agent ever learned it.
    pub fn install(&self) -> Result<Option<String>, StoreError> {
        let value = self.opened()?.install.get(INSTALL_KEY)?;
        Ok(value.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Records the install the state is from now, flushed.
    pub fn set_install(&mut self, uid: &str) -> Result<(), StoreError> {
        let Open { db, install, .. } = self.opened()?;
        install.insert(INSTALL_KEY, uid.as_bytes())?;
        db.flush()?;
        Ok(())
    }

    /// Replaces everything stored with `state` (after a damaged load).
    pub fn replace_all(&mut self, state: &NodeState) -> Result<(), StoreError> {
        if let Err(e) = self.opened()?.tree.clear() {
            self.failed = true;
            return Err(e.into());
        }
        self.manifest = Manifest::default();
        let changes = ChangeSet { services: state.services.keys().cloned().collect(), node: true };
        self.commit(state, &changes)
    }
}

/// Every record of a tree, copied out of sled: keys and values one after another in one
/// buffer, with where each is.
struct Records {
    bytes: Vec<u8>,
    spans: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
}

impl Records {
    fn read(tree: &sled::Tree) -> Result<Records, StoreError> {
        let mut records = Records { bytes: Vec::new(), spans: Vec::new() };
        for item in tree.iter() {
            let (key, value) = item?;
            let at = records.bytes.len();
            records.bytes.extend_from_slice(&key);
            records.bytes.extend_from_slice(&value);
            records.spans.push((at..at + key.len(), at + key.len()..records.bytes.len()));
        }
        Ok(records)
    }

    /// Each record's key and value, in key order.
    fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter().map(|(key, value)| (&self.bytes[key.clone()], &self.bytes[value.clone()]))
    }
}

fn record_checksum(key: &[u8], version: &str, body: &[u8]) -> u64 {
    let mut text = Vec::with_capacity(key.len() + version.len() + body.len() + 2);
    text.extend_from_slice(key);
    text.push(0);
    text.extend_from_slice(version.as_bytes());
    text.push(0);
    text.extend_from_slice(body);
    xxh3_64(&text)
}

/// `<version length: u16 BE><version><checksum: u64 LE><body>`, and that checksum (the
/// manifest's part of the record).
fn record(key: &[u8], version: &str, body: &[u8]) -> (Vec<u8>, u64) {
    let len = u16::try_from(version.len()).unwrap_or(u16::MAX);
    let version = &version.as_bytes()[..usize::from(len)];
    let checksum = record_checksum(key, std::str::from_utf8(version).unwrap_or_default(), body);
    let mut out = Vec::with_capacity(10 + version.len() + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(version);
    out.extend_from_slice(&checksum.to_le_bytes());
    out.extend_from_slice(body);
    (out, checksum)
}

fn split_record(bytes: &[u8]) -> Option<(String, u64, &[u8])> {
    let len = usize::from(u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]));
    let version = std::str::from_utf8(bytes.get(2..2 + len)?).ok()?.to_owned();
    if version.is_empty() {
        return None;
    }
    let checksum = u64::from_le_bytes(bytes.get(2 + len..10 + len)?.try_into().ok()?);
    Some((version, checksum, bytes.get(10 + len..)?))
}

#[cfg(test)]
impl Store {
    /// Writes raw bytes under `key` (a test's way to damage a record).
    pub(crate) fn insert_raw(&self, key: &[u8], value: &[u8]) {
        let open = self.opened().expect("open");
        open.tree.insert(key, value).expect("insert");
        open.db.flush().expect("flush");
    }

    /// Removes `key` behind the manifest's back.
    pub(crate) fn remove_raw(&self, key: &[u8]) {
        let open = self.opened().expect("open");
        open.tree.remove(key).expect("remove");
        open.db.flush().expect("flush");
    }
}

#[cfg(test)]
mod tests;
