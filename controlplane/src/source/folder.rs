//! What a folder of manifests defines, file by file. A new listing re-parses only the
//! files whose size or mtime changed and says which objects that changed: the same
//! object defined in several files is the one of the last file in path order (and, in
//! one file, of its last document).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::manifest::Object;
use crate::model::{ClusterState, ObjectChanges, ObjectKey};

/// What identifies a file's content without reading it: its size and mtime.
pub type Print = (u64, Option<SystemTime>);

/// Each manifest file of a folder with its [`Print`].
pub type Listing = BTreeMap<PathBuf, Print>;

/// An object's identity, whatever its kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum ObjectId {
    Service(ObjectKey),
    Slice(ObjectKey),
    Node(String),
    ServiceCidr(String),
    Export(ObjectKey),
    Import(ObjectKey),
    McsSlice(ObjectKey),
}

impl ObjectId {
    fn of(object: &Object) -> ObjectId {
        match object {
            Object::Service(s) => ObjectId::Service(s.key.clone()),
            Object::EndpointSlice(s) => ObjectId::Slice(ClusterState::slice_key(s)),
            Object::Node(n) => ObjectId::Node(n.name.clone()),
            Object::ServiceCidr(s) => ObjectId::ServiceCidr(s.name.clone()),
            Object::ServiceExport(e) => ObjectId::Export(e.key.clone()),
            Object::ServiceImport(i) => ObjectId::Import(i.key.clone()),
            Object::McsSlice(m) => ObjectId::McsSlice(m.key.clone()),
        }
    }

    /// Records in `changes` that the object is gone.
    fn delete(self, changes: &mut ObjectChanges) {
        match self {
            ObjectId::Service(key) => changes.services.insert(key, None).map(drop),
            ObjectId::Slice(key) => changes.slices.insert(key, None).map(drop),
            ObjectId::Node(name) => changes.nodes.insert(name, None).map(drop),
            ObjectId::ServiceCidr(name) => changes.service_cidrs.insert(name, None).map(drop),
            ObjectId::Export(key) => changes.exports.insert(key, None).map(drop),
            ObjectId::Import(key) => changes.imports.insert(key, None).map(drop),
            ObjectId::McsSlice(key) => changes.mcs_slices.insert(key, None).map(drop),
        };
    }
}

/// Records in `changes` that `object` is as given.
fn upsert(object: Object, changes: &mut ObjectChanges) {
    match object {
        Object::Service(s) => changes.services.insert(s.key.clone(), Some(s)).map(drop),
        Object::EndpointSlice(s) => changes.slices.insert(ClusterState::slice_key(&s), Some(s)).map(drop),
        Object::Node(n) => changes.nodes.insert(n.name.clone(), Some(n)).map(drop),
        Object::ServiceCidr(s) => changes.service_cidrs.insert(s.name.clone(), Some(s)).map(drop),
        Object::ServiceExport(e) => changes.exports.insert(e.key.clone(), Some(e)).map(drop),
        Object::ServiceImport(i) => changes.imports.insert(i.key.clone(), Some(i)).map(drop),
        Object::McsSlice(m) => changes.mcs_slices.insert(m.key.clone(), Some(m)).map(drop),
    };
}

/// The files read and the objects each defines.
#[derive(Debug, Default)]
pub struct Folder {
    /// Each file as read: its print then, and the objects it defines.
    files: BTreeMap<PathBuf, (Print, HashMap<ObjectId, Object>)>,
    /// The files that define each object, sorted (nearly always one); the last wins.
    definers: HashMap<ObjectId, Vec<PathBuf>>,
}

impl Folder {
    /// The object `id` as the folder defines it.
    fn winner(&self, id: &ObjectId) -> Option<&Object> {
        let file = self.definers.get(id)?.last()?;
        self.files.get(file)?.1.get(id)
    }

    fn forget(&mut self, path: &Path) {
        let Some((_, objects)) = self.files.remove(path) else { return };
        for id in objects.keys() {
            if let Some(files) = self.definers.get_mut(id) {
                files.retain(|f| f != path);
                if files.is_empty() {
                    self.definers.remove(id);
                }
            }
        }
    }

    /// Takes in a new listing: files that are new or changed are read with `parse`, files
    /// gone are forgotten. Returns what that changed, per object.
    pub fn update(
        &mut self,
        listing: &Listing,
        mut parse: impl FnMut(&Path) -> Vec<Object>,
    ) -> ObjectChanges {
        let gone: Vec<PathBuf> = self.files.keys().filter(|p| !listing.contains_key(*p)).cloned().collect();
        let fresh: Vec<(PathBuf, Print, HashMap<ObjectId, Object>)> = listing
            .iter()
            .filter(|(path, print)| self.files.get(*path).map(|(seen, _)| seen) != Some(*print))
            .map(|(path, print)| {
                // Later documents of the same object win.
                let objects = parse(path).into_iter().map(|o| (ObjectId::of(&o), o)).collect();
                (path.clone(), *print, objects)
            })
            .collect();
        let mut touched: BTreeSet<ObjectId> = BTreeSet::new();
        for path in gone.iter().chain(fresh.iter().map(|(p, _, _)| p)) {
            touched.extend(self.files.get(path).into_iter().flat_map(|(_, objects)| objects.keys().cloned()));
        }
        for (_, _, objects) in &fresh {
            touched.extend(objects.keys().cloned());
        }
        let before: Vec<(ObjectId, Option<Object>)> =
            touched.into_iter().map(|id| (id.clone(), self.winner(&id).cloned())).collect();
        for path in &gone {
            self.forget(path);
        }
        for (path, print, objects) in fresh {
            self.forget(&path);
            for id in objects.keys() {
                let files = self.definers.entry(id.clone()).or_default();
                if let Err(at) = files.binary_search(&path) {
                    files.insert(at, path.clone());
                }
            }
            self.files.insert(path, (print, objects));
        }
        let mut changes = ObjectChanges::default();
        for (id, old) in before {
            let new = self.winner(&id);
            if new == old.as_ref() {
                continue;
            }
            match new.cloned() {
                Some(object) => upsert(object, &mut changes),
                None => id.delete(&mut changes),
            }
        }
        changes
    }

    /// Everything the folder defines.
    #[cfg(test)]
    fn state(&self) -> ClusterState {
        let mut all = ObjectChanges::default();
        for object in self.definers.keys().filter_map(|id| self.winner(id)) {
            upsert(object.clone(), &mut all);
        }
        all.into_state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::manifest;

    fn service(name: &str, ip: &str) -> String {
        format!("kind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n---\n")
    }

    /// A folder of `files` (name → text), each read once per new print.
    struct Fixture {
        texts: BTreeMap<PathBuf, String>,
        listing: Listing,
        reads: Vec<PathBuf>,
    }

    impl Fixture {
        fn new() -> Self {
            Fixture { texts: BTreeMap::new(), listing: Listing::new(), reads: Vec::new() }
        }

        fn write(&mut self, name: &str, text: &str) {
            let path = PathBuf::from(name);
            let generation = self.listing.get(&path).map_or(0, |p| p.0 + 1);
            self.texts.insert(path.clone(), text.to_owned());
            self.listing.insert(path, (generation, None));
        }

        fn remove(&mut self, name: &str) {
            self.texts.remove(Path::new(name));
            self.listing.remove(Path::new(name));
        }

        fn update(&mut self, folder: &mut Folder) -> ObjectChanges {
            let (texts, reads) = (&self.texts, &mut self.reads);
            folder.update(&self.listing, |path| {
                reads.push(path.to_owned());
                manifest::parse(&texts[path]).into_iter().filter_map(Result::ok).collect()
            })
        }
    }

    fn upserts(changes: &ObjectChanges) -> Vec<String> {
        changes
            .services
            .iter()
            .map(|(k, s)| match s {
                Some(s) => format!("{}={}", k.name, s.cluster_ips[0]),
                None => format!("{}=gone", k.name),
            })
            .collect()
    }

    #[test]
    fn only_changed_files_are_read_and_only_changed_objects_reported() {
        let mut fx = Fixture::new();
        let mut folder = Folder::default();
        fx.write("a.yaml", &format!("{}{}", service("one", "10.96.0.1"), service("two", "10.96.0.2")));
        fx.write("b.yaml", &service("three", "10.96.0.3"));
        let first = fx.update(&mut folder);
        assert_eq!(upserts(&first), ["one=10.96.0.1", "three=10.96.0.3", "two=10.96.0.2"]);
        assert_eq!(first.into_state(), folder.state(), "the first read's changes are the whole state");

        fx.reads.clear();
        fx.write("a.yaml", &format!("{}{}", service("one", "10.96.0.1"), service("two", "10.96.0.9")));
        assert_eq!(upserts(&fx.update(&mut folder)), ["two=10.96.0.9"]);
        assert_eq!(fx.reads, [PathBuf::from("a.yaml")], "b.yaml is not read again");

        fx.reads.clear();
        assert!(fx.update(&mut folder).is_empty(), "nothing changed");
        assert!(fx.reads.is_empty());

        fx.remove("b.yaml");
        assert_eq!(upserts(&fx.update(&mut folder)), ["three=gone"]);
    }

    #[test]
    fn the_last_file_in_path_order_defines_an_object() {
        let mut fx = Fixture::new();
        let mut folder = Folder::default();
        fx.write("a.yaml", &format!("{}{}", service("web", "10.96.0.1"), service("web", "10.96.0.2")));
        assert_eq!(upserts(&fx.update(&mut folder)), ["web=10.96.0.2"], "the later document wins");
        fx.write("b.yaml", &service("web", "10.96.0.3"));
        assert_eq!(upserts(&fx.update(&mut folder)), ["web=10.96.0.3"]);
        fx.write("a.yaml", &service("web", "10.96.0.4"));
        assert!(fx.update(&mut folder).is_empty(), "b.yaml still defines it");
        fx.remove("b.yaml");
        assert_eq!(upserts(&fx.update(&mut folder)), ["web=10.96.0.4"], "back to a.yaml's");
        fx.write("a.yaml", "kind: ConfigMap\nmetadata: {name: x}\n");
        assert_eq!(upserts(&fx.update(&mut folder)), ["web=gone"]);
        assert_eq!(folder.state(), ClusterState::default());
    }
}
