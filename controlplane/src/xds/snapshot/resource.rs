//! One encoded resource: its name, its content version and its encoding as it goes on the
//! wire, shared by every stream.

use std::collections::HashMap;
use std::sync::Arc;

use kpx_proto::version::content_version;
use kpx_proto::ResourceType;

use crate::xds::wire::{HasEntry, ResourceEntry};

#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    pub name: String,
    pub version: String,
    entry: ResourceEntry,
}

impl Resource {
    pub(super) fn new(ty: ResourceType, name: String, body: Vec<u8>) -> Self {
        let version = content_version(&body);
        let entry = ResourceEntry::new(&name, &version, ty.type_url(), &body);
        Resource { version, name, entry }
    }

    /// The resource's protobuf encoding.
    pub fn body(&self) -> &[u8] {
        self.entry.body()
    }
}

impl HasEntry for Resource {
    fn name(&self) -> &str {
        &self.name
    }

    fn entry(&self) -> &ResourceEntry {
        &self.entry
    }
}

/// Hands out one `Arc` per content version among the resources of one name: identical
/// variants share it, and content that did not change keeps the `Arc` it had.
pub(super) struct Interner {
    by_version: HashMap<String, Arc<Resource>>,
}

impl Interner {
    pub fn new<'a>(known: impl IntoIterator<Item = &'a Arc<Resource>>) -> Self {
        Interner { by_version: known.into_iter().map(|r| (r.version.clone(), Arc::clone(r))).collect() }
    }

    pub fn intern(&mut self, fresh: Resource) -> Arc<Resource> {
        Arc::clone(self.by_version.entry(fresh.version.clone()).or_insert_with(|| Arc::new(fresh)))
    }
}
