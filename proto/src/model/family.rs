//! IP families, which every backend programs separately.

use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    pub fn of_net(net: &ipnet::IpNet) -> Family {
        Family::of(&net.addr())
    }

    pub fn suffix(self) -> &'static str {
        match self {
            Family::V4 => "v4",
            Family::V6 => "v6",
        }
    }
}
