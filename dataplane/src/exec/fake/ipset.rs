//! An in-memory ipset fed `ipset -exist restore` input, one command at a time as the tool
//! does (a failing command leaves the ones before it applied): `create` (again with the
//! same type is no error), `flush`, `add`, `del` (a member that is not there is no error),
//! `swap` (both sets must exist and be of one type), `destroy`.

use kpx_proto::sync::Locked as _;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::exec::ipset::Ipset;
use crate::exec::ExecError;

const TOOL: &str = "ipset (fake)";

/// A handle on one fake ipset; clones share it.
#[derive(Clone, Default)]
pub struct FakeIpset {
    inner: Arc<Mutex<IpsetState>>,
}

#[derive(Default)]
struct IpsetState {
    /// name → (type and options as created, members).
    sets: BTreeMap<String, (String, BTreeSet<String>)>,
    fail_next: std::collections::VecDeque<String>,
}

impl FakeIpset {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, IpsetState> {
        self.inner.locked()
    }

    /// Refuses the next restore with `message`, changing nothing (called twice: the next two).
    pub fn fail_next(&self, message: &str) {
        self.state().fail_next.push_back(message.to_owned());
    }

    /// The members of `set` (none when it does not exist).
    pub fn members(&self, set: &str) -> Vec<String> {
        self.state().sets.get(set).map(|(_, m)| m.iter().cloned().collect()).unwrap_or_default()
    }
}

fn command(sets: &mut BTreeMap<String, (String, BTreeSet<String>)>, line: &str) -> Result<(), String> {
    let mut words = line.split_whitespace();
    let verb = words.next().unwrap_or_default();
    let name = words.next().ok_or("a command needs a set")?.to_owned();
    let rest: Vec<&str> = words.collect();
    let missing = || format!("The set with the given name does not exist: {name}");
    match verb {
        "create" => {
            let kind = rest.join(" ");
            match sets.get(&name) {
                Some((existing, _)) if *existing != kind => {
                    Err(format!("Set cannot be created: {name} exists as another type"))
                }
                Some(_) => Ok(()),
                None => {
                    sets.insert(name, (kind, BTreeSet::new()));
                    Ok(())
                }
            }
        }
        "flush" => {
            sets.get_mut(&name).ok_or_else(missing)?.1.clear();
            Ok(())
        }
        "add" => {
            let member = rest.first().ok_or("add needs a member")?;
            sets.get_mut(&name).ok_or_else(missing)?.1.insert((*member).to_owned());
            Ok(())
        }
        "del" => {
            let member = rest.first().ok_or("del needs a member")?;
            sets.get_mut(&name).ok_or_else(missing)?.1.remove(*member);
            Ok(())
        }
        "swap" => {
            let other = rest.first().ok_or("swap needs two sets")?.to_string();
            let a = sets.get(&name).ok_or_else(missing)?.clone();
            let b = sets
                .get(&other)
                .ok_or_else(|| format!("The set with the given name does not exist: {other}"))?
                .clone();
            if a.0.split_whitespace().next() != b.0.split_whitespace().next() {
                return Err("The sets cannot be swapped: their type does not match".into());
            }
            sets.insert(name, b);
            sets.insert(other, a);
            Ok(())
        }
        "destroy" => sets.remove(&name).map(drop).ok_or_else(missing),
        other => Err(format!("unsupported command {other:?}")),
    }
}

impl Ipset for FakeIpset {
    fn restore(&mut self, script: &str) -> Result<(), ExecError> {
        let mut state = self.state();
        if let Some(message) = state.fail_next.pop_front() {
            return Err(ExecError::refused(TOOL, message));
        }
        for (number, line) in script.lines().map(str::trim).enumerate().filter(|(_, l)| !l.is_empty()) {
            command(&mut state.sets, line)
                .map_err(|reason| ExecError::refused(TOOL, format!("line {}: {reason}", number + 1)))?;
        }
        Ok(())
    }

    fn names(&mut self) -> Result<Vec<String>, ExecError> {
        Ok(self.state().sets.keys().cloned().collect())
    }

    fn save(&mut self) -> Result<String, ExecError> {
        let state = self.state();
        let mut out = String::new();
        for (name, (kind, members)) in &state.sets {
            let _ = writeln!(out, "create {name} {kind}");
            for m in members {
                let _ = writeln!(out, "add {name} {m}");
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_apply_one_by_one_and_swap_exchanges_members() {
        let mut ipset = FakeIpset::new();
        ipset
            .restore("create S hash:ip,port family inet\ncreate S-N hash:ip,port family inet\nadd S-N 10.0.0.1,tcp:80\nswap S-N S\ndestroy S-N\n")
            .expect("valid");
        assert_eq!(ipset.members("S"), ["10.0.0.1,tcp:80"]);
        assert_eq!(ipset.names().expect("names"), ["S"]);
        let err = ipset.restore("add S 10.0.0.2,tcp:80\nadd T 10.0.0.3,tcp:80\n").expect_err("no set T");
        assert!(err.to_string().contains("line 2"), "{err}");
        assert_eq!(ipset.members("S").len(), 2, "the command before the failing one stays");
        ipset.restore("del S 10.0.0.9,tcp:80\n").expect("deleting what is not there is no error with -exist");
        assert!(ipset
            .save()
            .expect("save")
            .starts_with("create S hash:ip,port family inet\nadd S 10.0.0.1,tcp:80\n"));
        assert!(ipset.restore("create S hash:ip,port,ip family inet\n").is_err(), "another type");
    }
}
