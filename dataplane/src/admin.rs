//! The node agent's admin API (`kpx.admin.v1.NodeAdmin`): the accepted state,
//! the rules as programmed, connection and apply status, and the packet tracer.

use kpx_proto::admin::node_admin_server::NodeAdmin;
use kpx_proto::admin::{
    AppliedService, GetRulesRequest, GetRulesResponse, GetStateRequest, GetStateResponse, GetStatusRequest,
    GetStatusResponse, TraceRequest, TraceResponse, TraceStep,
};
use kpx_proto::trace::{self, Packet, TraceOptions};
use tonic::{Request, Response, Status};

use crate::agent::SharedAgent;
use crate::backend::ProxyOptions;
use crate::status::unix_ms;

pub struct NodeAdminService {
    agent: SharedAgent,
    options: ProxyOptions,
}

impl NodeAdminService {
    pub fn new(agent: SharedAgent, options: ProxyOptions) -> Self {
        NodeAdminService { agent, options }
    }

    /// Runs `f` on the agent without blocking the runtime while another task holds it.
    async fn with_agent<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut crate::agent::Agent) -> T + Send + 'static,
    ) -> Result<T, Status> {
        let agent = self.agent.clone();
        tokio::task::spawn_blocking(move || f(&mut agent.lock()))
            .await
            .map_err(|e| Status::internal(format!("admin task failed: {e}")))
    }
}

/// The rules of a dump that mention the traced destination: nft set and map elements as
/// `map: element`, iptables rules as they are.
fn matching_rules(dump: &str, packet: &Packet) -> Vec<String> {
    let (ip, port, proto) = (packet.destination.ip(), packet.destination.port(), packet.protocol);
    let nft = format!("{ip} . {proto} . {port}");
    let host = if ip.is_ipv4() { format!("{ip}/32") } else { format!("{ip}/128") };
    let iptables = format!("-d {host} -p {proto} -m {proto} --dport {port} ");
    let mut collection = "";
    let mut out = Vec::new();
    for line in dump.lines() {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("map ").or_else(|| trimmed.strip_prefix("set ")) {
            collection = rest.trim_end_matches('{').trim();
        }
        if trimmed.contains(&iptables) {
            out.push(trimmed.to_owned());
        } else if trimmed.contains(&nft) {
            let element = trimmed.trim_start_matches("elements = {").trim_end_matches(['}', ',']).trim();
            for one in element.split(", ").filter(|e| e.contains(&nft)) {
                out.push(format!("{collection}: {one}"));
            }
        }
    }
    out
}

#[tonic::async_trait]
impl NodeAdmin for NodeAdminService {
    async fn get_state(&self, _: Request<GetStateRequest>) -> Result<Response<GetStateResponse>, Status> {
        let response = self
            .with_agent(|agent| {
                let state = agent.state();
                GetStateResponse {
                    node: agent.node_name().to_owned(),
                    services: state
                        .services
                        .iter()
                        .map(|(name, s)| AppliedService {
                            name: name.clone(),
                            version: s.version.clone(),
                            view: Some(s.value.to_proto()),
                        })
                        .collect(),
                    node_config: state.node.as_ref().map(|n| n.value.to_proto()),
                    node_config_version: state.node.as_ref().map(|n| n.version.clone()).unwrap_or_default(),
                }
            })
            .await?;
        Ok(Response::new(response))
    }

    async fn get_rules(&self, _: Request<GetRulesRequest>) -> Result<Response<GetRulesResponse>, Status> {
        let (backend, text) = self.with_agent(|agent| (agent.backend_name(), agent.rules())).await?;
        let text = text.map_err(|e| Status::internal(format!("{backend}: {e}")))?;
        Ok(Response::new(GetRulesResponse { backend: backend.to_owned(), text }))
    }

    async fn get_status(&self, _: Request<GetStatusRequest>) -> Result<Response<GetStatusResponse>, Status> {
        let response = self
            .with_agent(|agent| {
                let s = &agent.status;
                GetStatusResponse {
                    node: agent.node_name().to_owned(),
                    backend: agent.backend_name().to_owned(),
                    control_plane: s.control_plane.clone(),
                    connected: s.connected,
                    connected_since_unix_ms: unix_ms(s.connected_since),
                    last_error: s.last_error.clone(),
                    last_apply_seconds: s.last_apply.map_or(0.0, |d| d.as_secs_f64()),
                    last_apply_unix_ms: unix_ms(s.last_apply_at),
                    applies: s.applies,
                    nacks: s.nacks,
                }
            })
            .await?;
        Ok(Response::new(response))
    }

    async fn trace(&self, request: Request<TraceRequest>) -> Result<Response<TraceResponse>, Status> {
        let packet = Packet::from_request(request.get_ref()).map_err(Status::invalid_argument)?;
        let options = TraceOptions {
            masquerade_all: self.options.masquerade_all,
            nodeport_cidrs: self.options.nodeport_cidrs.clone(),
            cluster_cidrs: self.options.cluster_cidrs.clone(),
        };
        let response = self
            .with_agent(move |agent| {
                let state = agent.state();
                let t = trace::trace(
                    state.services.values().map(|s| &s.value),
                    state.node.as_ref().map(|n| &n.value),
                    &options,
                    packet,
                );
                let backend = agent.backend_name();
                let rules = agent.rules().map(|dump| matching_rules(&dump, &packet)).unwrap_or_default();
                let mut response = t.into_response();
                if !rules.is_empty() {
                    response.steps.insert(
                        1.min(response.steps.len()),
                        TraceStep {
                            what: rules.join("\n"),
                            why: format!("this is what the {backend} backend programmed for it"),
                        },
                    );
                }
                response
            })
            .await?;
        Ok(Response::new(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_proto::types::Protocol;

    #[test]
    fn finds_the_rule_of_a_destination_in_either_backend_text() {
        let packet = Packet {
            destination: "10.96.0.10:80".parse().expect("addr"),
            protocol: Protocol::Tcp,
            source: None,
        };
        let nft = "\t\telements = { 10.96.0.10 . tcp . 80 : goto pick-v4-2,\n\t\t\t     10.96.0.11 . tcp . 80 : goto pick-v4-1 }";
        let nft = format!("\tmap service-ips-v4 {{\n{nft}");
        assert_eq!(matching_rules(&nft, &packet), ["service-ips-v4: 10.96.0.10 . tcp . 80 : goto pick-v4-2"]);
        let ipt = "-A KPX-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -m comment --comment \"a/b:http cluster IP\" -j KPX-SVC-X\n-A KPX-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 8080 -j Y";
        assert_eq!(matching_rules(ipt, &packet).len(), 1);
        let bad = TraceRequest { destination: "nope".into(), ..Default::default() };
        assert!(Packet::from_request(&bad).is_err());
        let v6 = TraceRequest {
            destination: "[fd00::1]:53".into(),
            protocol: "UDP".into(),
            source: String::new(),
        };
        assert!(Packet::from_request(&v6).is_ok());
    }
}
