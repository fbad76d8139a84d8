//! IPVS: virtual services and their destinations ([`Ipvs`]), over generic netlink in the
//! kernel ([`netlink::NetlinkIpvs`]).

use std::io;
use std::net::IpAddr;

pub mod netlink;

/// `IPPROTO_*` numbers of the protocols IPVS balances.
pub const PROTO_TCP: u16 = 6;
pub const PROTO_UDP: u16 = 17;
pub const PROTO_SCTP: u16 = 132;

/// `IP_VS_SVC_F_PERSISTENT`: session affinity by client address.
pub const FLAG_PERSISTENT: u32 = 0x0001;
/// `IP_VS_CONN_F_MASQ`: destinations reached by NAT.
pub const FORWARD_MASQUERADE: u32 = 0;

#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    #[error("netlink socket: {0}")]
    Socket(io::Error),
    #[error("the kernel has no IPVS (generic netlink family \"IPVS\" not found; is ip_vs loaded?)")]
    NoIpvs,
    #[error("IPVS {op}: {error}")]
    Kernel { op: &'static str, error: io::Error },
    #[error("IPVS {op}: malformed reply from the kernel")]
    Malformed { op: &'static str },
}

/// What identifies a virtual service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub address: IpAddr,
    pub protocol: u16,
    pub port: u16,
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.protocol {
            PROTO_TCP => "tcp",
            PROTO_UDP => "udp",
            PROTO_SCTP => "sctp",
            _ => "?",
        };
        match self.address {
            IpAddr::V4(a) => write!(f, "{a}:{}/{proto}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}/{proto}", self.port),
        }
    }
}

/// A virtual service as IPVS holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualService {
    pub key: ServiceKey,
    pub scheduler: String,
    /// `FLAG_PERSISTENT` or 0.
    pub flags: u32,
    /// Persistence timeout, seconds.
    pub timeout: u32,
}

/// A real server of a virtual service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub address: IpAddr,
    pub port: u16,
    pub weight: u32,
    /// Connections IPVS counts for it (read only).
    pub active: u32,
    pub inactive: u32,
}

/// One change of a virtual service's destinations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestinationEdit {
    Add,
    /// Its weight (0 drains it).
    Edit,
    Delete,
}

/// What kpx asks of IPVS.
pub trait Ipvs: Send {
    /// Every virtual service.
    fn services(&mut self) -> Result<Vec<VirtualService>, IpvsError>;
    /// The destinations of one virtual service.
    fn destinations(&mut self, key: &ServiceKey) -> Result<Vec<Destination>, IpvsError>;
    fn add_service(&mut self, s: &VirtualService) -> Result<(), IpvsError>;
    /// Changes a service's scheduler, flags or timeout in place (its connections stay).
    fn edit_service(&mut self, s: &VirtualService) -> Result<(), IpvsError>;
    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), IpvsError>;
    fn add_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError>;
    /// Changes a destination's weight in place (0 drains it: no new connections).
    fn edit_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError>;
    fn delete_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), IpvsError>;
    /// Applies `edits` to the destinations of `key`, in order; the first refusal. Over
    /// netlink they go in one send and their answers are read after (the kernel handles
    /// each in turn, a refused one stopping none of the others); this default makes them
    /// one at a time.
    fn edit_destinations(
        &mut self,
        key: &ServiceKey,
        edits: &[(DestinationEdit, Destination)],
    ) -> Result<(), IpvsError> {
        for (edit, d) in edits {
            match edit {
                DestinationEdit::Add => self.add_destination(key, d)?,
                DestinationEdit::Edit => self.edit_destination(key, d)?,
                DestinationEdit::Delete => self.delete_destination(key, d)?,
            }
        }
        Ok(())
    }
    /// Forgets the connection to IPVS (after a failure); the next call opens a new one.
    fn reset(&mut self);
}

impl IpvsError {
    /// The kernel's errno, when the kernel refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            IpvsError::Kernel { error, .. } => error.raw_os_error(),
            _ => None,
        }
    }
}
