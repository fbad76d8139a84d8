//! Node states for the backends' unit tests.

use kpx_proto::types::{Endpoint, Protocol, ServicePort, ServiceView};

use crate::state::{ChangeSet, NodeState, Versioned};

/// Services `c/ns/<name>` with one TCP port 80 (`http`) and endpoints on 8080.
pub fn state(services: &[(&str, &str, &[&str])]) -> NodeState {
    let mut s = NodeState::default();
    for (name, vip, endpoints) in services {
        let eps = endpoints
            .iter()
            .map(|a| Endpoint {
                address: a.parse().expect("ip"),
                port: 8080,
                node_name: String::new(),
                terminating: false,
            })
            .collect();
        let view = ServiceView::new(
            "c",
            "ns",
            name,
            vec![vip.parse().expect("ip")],
            vec![ServicePort::new("http", Protocol::Tcp, 80, eps)],
        );
        s.services.insert(view.resource_name(), Versioned { version: endpoints.join(","), value: view });
    }
    s
}

/// The Services `c/ns/<name>` changed.
pub fn changed(names: &[&str]) -> ChangeSet {
    ChangeSet { services: names.iter().map(|n| format!("c/ns/{n}")).collect(), node: false }
}

/// Default proxy options.
pub const NO: crate::backend::ProxyOptions = crate::backend::ProxyOptions {
    masquerade_all: false,
    nodeport_cidrs: Vec::new(),
    cluster_cidrs: Vec::new(),
};
