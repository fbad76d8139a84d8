//! One value per resource type, held inline: what a stream keeps per type, for each of
//! thousands of streams. (A `BTreeMap` of two entries allocates a node sized for eleven:
//! about 3.5 KiB per stream for its protocol state alone.)

use kpx_proto::ResourceType;

/// A value for some of the resource types, iterated in [`ResourceType::ALL`]'s order.
#[derive(Debug, Clone)]
pub struct PerType<T>([Option<T>; ResourceType::ALL.len()]);

impl<T> Default for PerType<T> {
    fn default() -> Self {
        PerType(std::array::from_fn(|_| None))
    }
}

/// Where `ty`'s value sits.
fn slot(ty: ResourceType) -> usize {
    match ty {
        ResourceType::NodeConfig => 0,
        ResourceType::ServiceView => 1,
    }
}

impl<T> PerType<T> {
    pub fn get(&self, ty: ResourceType) -> Option<&T> {
        self.0[slot(ty)].as_ref()
    }

    pub fn get_mut(&mut self, ty: ResourceType) -> Option<&mut T> {
        self.0[slot(ty)].as_mut()
    }

    pub fn contains(&self, ty: ResourceType) -> bool {
        self.get(ty).is_some()
    }

    /// `ty`'s value, made with `Default` if there was none.
    pub fn or_default(&mut self, ty: ResourceType) -> &mut T
    where
        T: Default,
    {
        self.0[slot(ty)].get_or_insert_with(T::default)
    }

    /// The types that have a value, with it.
    pub fn iter(&self) -> impl Iterator<Item = (ResourceType, &T)> {
        ResourceType::ALL.into_iter().filter_map(|ty| self.get(ty).map(|v| (ty, v)))
    }

    /// The types that have a value.
    pub fn types(&self) -> impl Iterator<Item = ResourceType> + '_ {
        self.iter().map(|(ty, _)| ty)
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.0.iter().flatten()
    }
}

#[cfg(test)]
impl<T> std::ops::Index<ResourceType> for PerType<T> {
    type Output = T;

    /// Panics when `ty` has no value.
    fn index(&self, ty: ResourceType) -> &T {
        self.get(ty).unwrap_or_else(|| panic!("no value for {}", ty.type_url()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_has_its_own_slot_and_iterates_in_serving_order() {
        for (i, ty) in ResourceType::ALL.into_iter().enumerate() {
            assert_eq!(slot(ty), i);
        }
        let mut per: PerType<u32> = PerType::default();
        assert!(!per.contains(ResourceType::ServiceView));
        *per.or_default(ResourceType::ServiceView) += 2;
        *per.or_default(ResourceType::NodeConfig) += 1;
        *per.or_default(ResourceType::ServiceView) += 2;
        assert_eq!(per[ResourceType::ServiceView], 4);
        let all: Vec<_> = per.iter().map(|(ty, v)| (ty, *v)).collect();
        assert_eq!(all, [(ResourceType::NodeConfig, 1), (ResourceType::ServiceView, 4)]);
        assert_eq!(per.values().sum::<u32>(), 5);
    }
}
