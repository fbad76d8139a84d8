//! Node states for the backends' unit tests.

use kpx_proto::node_context::NodeContext;
use kpx_proto::types::{NodeConfig, Protocol, ServicePort, ServiceView};

use crate::state::{ChangeSet, NodeState, Versioned};

/// An endpoint on port 8080 of `node`.
pub use kpx_proto::testing::endpoint_on as endpoint;

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
        s.services_mut()
            .insert(view.resource_name(), Versioned { version: endpoints.join(","), value: view.into() });
    }
    s
}

/// The Services `c/ns/<name>` changed.
pub fn changed(names: &[&str]) -> ChangeSet {
    ChangeSet { services: names.iter().map(|n| format!("c/ns/{n}")).collect(), node: false }
}

/// A node that nothing is known of (no config yet, default settings).
pub fn no_context() -> NodeContext {
    NodeContext::default()
}

/// Node `n1` at 10.0.0.1 with pod CIDR 10.244.0.0/16, default settings.
pub fn node_context() -> NodeContext {
    NodeContext::derive(&Default::default(), Some(&node_config()))
}

/// The config of node `n1` (see [`node_context`]).
pub fn node_config() -> NodeConfig {
    NodeConfig {
        name: "n1".into(),
        addresses: vec!["10.0.0.1".parse().expect("ip")],
        pod_cidrs: vec!["10.244.0.0/16".parse().expect("cidr")],
        ..Default::default()
    }
}
