//! Node states for the backends' unit tests.

use kpx_proto::types::{Endpoint, Protocol, ServicePort, ServiceView};

use crate::state::{ChangeSet, NodeState, Versioned};

/// An endpoint on port 8080 of `node`.
pub fn endpoint(address: &str, node: &str) -> Endpoint {
    Endpoint {
        address: address.parse().expect("ip"),
        port: 8080,
        node_name: node.into(),
        terminating: false,
        cluster: String::new(),
    }
}

/// Service `c/ns/<name>` on `vip`: one TCP port 80 (`http`), endpoints on 8080 of node `n1`.
pub fn service(name: &str, vip: &str, endpoints: &[&str]) -> ServiceView {
    let eps = endpoints.iter().map(|a| endpoint(a, "n1")).collect();
    ServiceView::new(
        "c",
        "ns",
        name,
        vec![vip.parse().expect("ip")],
        vec![ServicePort::new("http", Protocol::Tcp, 80, eps)],
    )
}

/// `c/ns/web` on 10.96.0.10 (see [`service`]).
pub fn web(endpoints: &[&str]) -> ServiceView {
    service("web", "10.96.0.10", endpoints)
}

/// A node state of [`service`]s: (name, vip, endpoints).
pub fn state(services: &[(&str, &str, &[&str])]) -> NodeState {
    let mut s = NodeState::default();
    for (name, vip, endpoints) in services {
        let view = service(name, vip, endpoints);
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
