//! The only code that touches the kernel: it spawns the tools (`nft`, `iptables-restore`
//! and `-save`, `ipset`, `ip`, `conntrack`), opens libnftables, the IPVS generic
//! netlink socket, an ipset netlink socket (members added and deleted), an rtnetlink socket
//! (the interfaces' addresses) and an nf_tables netlink socket (element updates, and reads nft would
//! make cost the whole table: [`nft::netlink`]), and writes `/proc/sys`. Everything above it speaks to the kernel through
//! the traits here, so that [`fake`] — an in-memory model of each facility that applies
//! a transaction whole or refuses it whole, as the kernel does, and dumps canonical text —
//! can stand in for the kernel in tests that run without root.
//!
//! Each trait carries what kpx asks of one facility, not the facility's whole interface:
//! - [`nft::Nft`]: run an nft script as one transaction, update set and map elements as
//!   one transaction, list kpx's table, count one chain's rules and outline the table
//!   (those three over netlink);
//! - [`iptables::Iptables`]: `iptables-restore --noflush` and `iptables-save` per family;
//! - [`ipset::Ipset`]: `ipset restore`, `save`, the names of the sets, and members
//!   added or deleted (over netlink);
//! - [`links::Links`]: a dummy interface and the addresses on it;
//! - [`interfaces::Interfaces`]: every interface's addresses (over rtnetlink);
//! - [`ipvs::Ipvs`]: IPVS virtual services and destinations;
//! - [`conntrack::Conntrack`]: deleting conntrack entries;
//! - [`sysctl::Sysctl`]: kernel settings.

pub mod conntrack;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod interfaces;
pub mod ipset;
pub mod iptables;
pub mod ipvs;
pub mod links;
mod netlink;
pub mod nft;
mod process;
pub mod sysctl;

/// A kernel facility refused a request, or could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{tool} refused the update: {message}")]
    Refused { tool: &'static str, message: String },
    #[error("cannot run {tool}: {source}")]
    Spawn { tool: &'static str, source: std::io::Error },
    #[error("ipvs refused the update: {0}")]
    Ipvs(#[from] ipvs::IpvsError),
    /// A kernel setting that cannot be read or written (`/proc/sys` read-only in an
    /// unprivileged container, a setting this kernel lacks).
    #[error("sysctl {name} cannot be {action}: {error}")]
    Sysctl { name: String, action: String, error: std::io::Error },
}

impl ExecError {
    /// A refusal with `message`, as a fake or a tool reports it.
    pub fn refused(tool: &'static str, message: impl Into<String>) -> Self {
        ExecError::Refused { tool, message: message.into() }
    }
}
