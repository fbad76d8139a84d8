//! The node agent's admin API (`kpx.admin.v1.NodeAdmin`): the accepted state,
//! the rules as programmed, connection and apply status, and the packet tracer.

use kpx_proto::admin::node_admin_server::NodeAdmin;
use kpx_proto::admin::{
    AppliedService, GetRulesRequest, GetRulesResponse, GetStateRequest, GetStateResponse, GetStatusRequest,
    GetStatusResponse, TraceRequest, TraceResponse, TraceStep,
};
use kpx_proto::trace::{self, Packet};
use tonic::{Request, Response, Status};

use crate::agent::SharedAgent;
use crate::status::unix_ms;

pub struct NodeAdminService {
    agent: SharedAgent,
}

impl NodeAdminService {
    pub fn new(agent: SharedAgent) -> Self {
        NodeAdminService { agent }
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
                    last_nack_type_url: s.last_nack.as_ref().map(|n| n.0.clone()).unwrap_or_default(),
                    last_nack: s.last_nack.as_ref().map(|n| n.1.clone()).unwrap_or_default(),
                    last_nack_unix_ms: unix_ms(s.last_nack.as_ref().map(|n| n.2)),
                    seconds_since_contact: s.since_contact(std::time::SystemTime::now()).as_secs_f64(),
                    last_contact_unix_ms: unix_ms(s.last_contact),
                    interface_addresses: agent
                        .interface_addresses()
                        .iter()
                        .map(ToString::to_string)
                        .collect(),
                    nodeport_addresses: agent
                        .context()
                        .nodeport_addresses
                        .iter()
                        .map(ToString::to_string)
                        .collect(),
                }
            })
            .await?;
        Ok(Response::new(response))
    }

    async fn trace(&self, request: Request<TraceRequest>) -> Result<Response<TraceResponse>, Status> {
        let packet = Packet::from_request(request.get_ref()).map_err(Status::invalid_argument)?;
        let response = self
            .with_agent(move |agent| {
                let state = agent.state();
                let t = trace::trace(state.services.values().map(|s| &*s.value), agent.context(), packet);
                let backend = agent.backend_name();
                let rules = agent
                    .rules()
                    .map(|dump| crate::backend::rules_text::matching_rules(&dump, &packet))
                    .unwrap_or_default();
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
