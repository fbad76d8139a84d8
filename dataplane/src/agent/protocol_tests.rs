//! Every NACK text `proto/README.md` quotes is what the agent sends.

use kpx_proto::types::{NodeConfig, ServiceView};
use kpx_proto::version::content_version;
use kpx_proto::ResourceType;

use super::tests::Node;
use crate::backend::fixtures::service;
use crate::state::RawResource;

const DOCUMENT: &str = include_str!("../../../proto/README.md");

fn raw(name: &str, type_url: &str, body: Vec<u8>) -> RawResource {
    RawResource { name: name.into(), version: content_version(&body), type_url: type_url.into(), body }
}

#[test]
fn every_nack_text_of_the_protocol_document_is_what_the_agent_sends() {
    let node = Node::new();
    let mut agent = node.agent();
    let views = ResourceType::ServiceView.type_url();
    let configs = ResourceType::NodeConfig.type_url();
    let web = service("web", "10.96.0.10", &["10.244.0.1"]);
    let with = |f: &dyn Fn(&mut ServiceView)| {
        let mut v = web.clone();
        f(&mut v);
        raw("c/ns/web", views, v.encode())
    };
    let mut nack = |type_url: &str, resource: RawResource| {
        agent.apply(type_url, vec![resource], vec![]).expect_err("NACK").to_string()
    };
    let mut cases = vec![
        nack("type.googleapis.com/kpx.v1.Other", with(&|_| {})),
        nack(views, RawResource { type_url: configs.into(), ..with(&|_| {}) }),
        nack(views, RawResource { version: String::new(), ..with(&|_| {}) }),
        nack(views, RawResource { name: "c/ns/other".into(), ..with(&|_| {}) }),
        nack(configs, {
            let other = NodeConfig { name: "n2".into(), ..Default::default() };
            raw("n2", configs, other.encode())
        }),
        nack(views, with(&|v| v.ports[0].port = 0)),
        nack(views, with(&|v| v.ports[0].name = "a;b".into())),
        nack(views, with(&|v| v.ports[0].endpoints[0].address = "fd00::1".parse().expect("ip"))),
    ];
    let undecodable = nack(views, raw("c/ns/web", views, vec![0xff, 0xff, 0xff]));
    let prefix = "invalid: resource \"c/ns/web\": <message>: not a kpx.v1.ServiceView: ";
    assert!(undecodable.starts_with(prefix) && DOCUMENT.contains(prefix.trim_end()), "{undecodable}");
    for text in cases.drain(..) {
        assert!(
            DOCUMENT.contains(&format!("`{text}`")),
            "proto/README.md does not quote the agent's NACK:\n{text}"
        );
    }
}
