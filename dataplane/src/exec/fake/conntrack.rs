//! Conntrack and sysctl stand-ins that record what was asked of them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::exec::conntrack::{Conntrack, FlowFilter};
use crate::exec::sysctl::Sysctl;
use crate::exec::ExecError;

/// Records every deletion asked for; clones share the record.
#[derive(Clone, Default)]
pub struct FakeConntrack {
    deleted: Arc<Mutex<Vec<FlowFilter>>>,
}

impl FakeConntrack {
    pub fn new() -> Self {
        Self::default()
    }

    /// The filters deleted so far, oldest first; the record is emptied.
    pub fn take(&self) -> Vec<FlowFilter> {
        std::mem::take(&mut *self.deleted.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Conntrack for FakeConntrack {
    fn delete(&self, filter: &FlowFilter) -> Result<(), ExecError> {
        self.deleted.lock().unwrap_or_else(|p| p.into_inner()).push(filter.clone());
        Ok(())
    }
}

/// Keeps the settings written; clones share them.
#[derive(Clone, Default)]
pub struct FakeSysctl {
    values: Arc<Mutex<BTreeMap<String, String>>>,
}

impl FakeSysctl {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<String> {
        self.values.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }
}

impl Sysctl for FakeSysctl {
    fn set(&mut self, name: &str, value: &str) -> Result<(), ExecError> {
        self.values.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned(), value.to_owned());
        Ok(())
    }
}
