//! kube-proxy's leftovers (`kpx-dataplane --cleanup --kube-proxy`): what any of its modes
//! programs and leaves behind when it stops, removed so that kpx alone serves the node.
//!
//! - nftables mode: the tables `ip kube-proxy` and `ip6 kube-proxy`;
//! - iptables and IPVS modes, in both iptables flavours and both families: the `KUBE-`
//!   chains of nat, filter and mangle and the rules jumping to them, but kubelet's own
//!   (`KUBE-KUBELET-CANARY`, `KUBE-IPTABLES-HINT`, filter's `KUBE-FIREWALL`, nat's
//!   `KUBE-MARK-DROP`), which kubelet keeps and kube-proxy never owned;
//! - IPVS mode: the virtual services of the addresses on `kube-ipvs0`, its `KUBE-` ipsets,
//!   and `kube-ipvs0` itself.
//!
//! kpx's own rules (`inet kpx`, `KPX-` chains, `kpx-ipvs0`) are none of these.

use std::collections::BTreeSet;

use crate::backend::{xtables, BackendError, Family};
use crate::exec::ipset::Ipset;
use crate::exec::iptables::{Flavour, Iptables};
use crate::exec::ipvs::{Ipvs, IpvsError};
use crate::exec::links::Links;
use crate::exec::nft::Nft;
use crate::exec::ExecError;

/// kube-proxy's IPVS interface.
pub const INTERFACE: &str = "kube-ipvs0";

/// The tables of kube-proxy's nftables mode.
const NFT_TABLES: [&str; 2] = ["ip kube-proxy", "ip6 kube-proxy"];

/// The iptables tables kube-proxy writes.
const TABLES: [&str; 3] = ["nat", "filter", "mangle"];

/// Whether the chain `chain` of `table` is kube-proxy's.
pub fn is_kube_proxy_chain(table: &str, chain: &str) -> bool {
    let kubelets = matches!(chain, "KUBE-KUBELET-CANARY" | "KUBE-IPTABLES-HINT")
        || (table == "filter" && chain == "KUBE-FIREWALL")
        || (table == "nat" && chain == "KUBE-MARK-DROP");
    chain.starts_with("KUBE-") && !kubelets
}

/// `iptables-restore` input removing kube-proxy's chains (and the rules into them) from
/// `saved`, one table at a time.
pub fn removal_script(saved: &str) -> String {
    TABLES
        .iter()
        .map(|table| xtables::removal_script(saved, &[table], |chain| is_kube_proxy_chain(table, chain)))
        .collect()
}

/// The node's facilities kube-proxy may have used.
pub struct KubeProxyKernel {
    pub nft: Box<dyn Nft>,
    /// One per iptables flavour (kube-proxy may have used either).
    pub iptables: Vec<(Flavour, Box<dyn Iptables>)>,
    pub ipset: Box<dyn Ipset>,
    pub links: Box<dyn Links>,
    pub ipvs: Box<dyn Ipvs>,
}

/// What was removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    pub nft_tables: Vec<String>,
    /// `flavour family table chain` of each chain removed.
    pub chains: Vec<String>,
    pub ipvs_services: usize,
    pub ipsets: Vec<String>,
    pub interface: bool,
}

/// Removes every leftover of kube-proxy's, rules before the sets they use.
pub fn remove_leftovers(kernel: &mut KubeProxyKernel) -> Result<Removed, BackendError> {
    let mut removed = Removed::default();
    for table in NFT_TABLES {
        if !kernel.nft.list(&format!("table {table}"))?.trim().is_empty() {
            kernel.nft.run(&format!("delete table {table}\n"))?;
            removed.nft_tables.push(table.to_owned());
        }
    }
    for (flavour, iptables) in &mut kernel.iptables {
        for family in Family::ALL {
            let saved = match iptables.save(family) {
                Ok(saved) => saved,
                // A node without this flavour's tools has none of its rules.
                Err(ExecError::Spawn { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                    continue
                }
                Err(e) => return Err(e.into()),
            };
            let script = removal_script(&saved);
            if script.is_empty() {
                continue;
            }
            iptables.restore(family, &script)?;
            let mut table = "";
            for line in script.lines() {
                if let Some(t) = line.strip_prefix('*') {
                    table = t;
                } else if let Some(chain) = line.strip_prefix("-X ") {
                    removed.chains.push(format!("{flavour:?} {family:?} {table} {chain}"));
                }
            }
        }
    }
    let bound: BTreeSet<_> = kernel.links.addresses(INTERFACE)?;
    match kernel.ipvs.services() {
        Ok(services) => {
            for service in services.iter().filter(|s| bound.contains(&s.key.address)) {
                kernel.ipvs.delete_service(&service.key)?;
                removed.ipvs_services += 1;
            }
        }
        // A kernel without IPVS has no virtual services of kube-proxy's.
        Err(IpvsError::NoIpvs | IpvsError::Socket(_)) => {}
        Err(e) => return Err(ExecError::from(e).into()),
    }
    match kernel.ipset.names() {
        Ok(names) => {
            let sets: Vec<String> = names.into_iter().filter(|n| n.starts_with("KUBE-")).collect();
            if !sets.is_empty() {
                let script: String = sets.iter().map(|s| format!("destroy {s}\n")).collect();
                kernel.ipset.restore(&script)?;
                removed.ipsets = sets;
            }
        }
        // Without the ipset tool there are no sets kube-proxy made with it.
        Err(ExecError::Spawn { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    removed.interface = kernel.links.remove(INTERFACE)?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// iptables-save of a node where kube-proxy (iptables mode) and kubelet both wrote.
    const SAVED: &str = "\
*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n\
*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n:KPX-FILTER - [0:0]\n\
-A INPUT -j KUBE-FIREWALL\n-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A INPUT -j KPX-FILTER\n-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\nCOMMIT\n\
*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-MARK-DROP - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABC - [0:0]\n:KUBE-SEP-XYZ - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 53 -j KUBE-SVC-ABC\n-A KUBE-SVC-ABC -j KUBE-SEP-XYZ\n\
-A KUBE-SEP-XYZ -p tcp -m tcp -j DNAT --to-destination 10.244.0.5:53\nCOMMIT\n";

    #[test]
    fn removes_kube_proxys_chains_and_hooks_and_keeps_kubelets_and_kpxs() {
        let script = removal_script(SAVED);
        assert_eq!(
            script,
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABC - [0:0]\n:KUBE-SEP-XYZ - [0:0]\n\
             -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -X KUBE-SERVICES\n-X KUBE-SVC-ABC\n-X KUBE-SEP-XYZ\nCOMMIT\n\
             *filter\n:KUBE-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n\
             -D INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -D FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
             -X KUBE-SERVICES\n-X KUBE-FORWARD\nCOMMIT\n\
             *mangle\n:KUBE-PROXY-CANARY - [0:0]\n-X KUBE-PROXY-CANARY\nCOMMIT\n"
        );
        assert!(!script.contains("KUBE-FIREWALL") && !script.contains("KPX-") && !script.contains("HINT"));
    }
}
