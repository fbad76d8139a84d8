//! The control plane's admin API (`kpx.admin.v1.ControlPlaneAdmin`): the
//! Services and their per-node views, connected nodes and what they ACKed,
//! the sources, and the packet tracer over a node's views.

use std::sync::Arc;
use std::time::SystemTime;

use kpx_proto::admin::control_plane_admin_server::ControlPlaneAdmin;
use kpx_proto::admin::{
    GetNodeResourcesRequest, GetNodeResourcesResponse, GetNodeViewRequest, GetNodeViewResponse,
    GetServiceViewsRequest, GetServiceViewsResponse, ImportSummary, ListImportsRequest, ListImportsResponse,
    ListNodesRequest, ListNodesResponse, ListServicesRequest, ListServicesResponse, ListSourcesRequest,
    ListSourcesResponse, NodeResource, NodeStatus, NodeTraceRequest, ServiceSummary, SourceStatus,
    TraceResponse, TypeStatus, ViewVariant,
};
use kpx_proto::node_context::{NodeContext, ProxySettings};
use kpx_proto::trace::{self, Packet};
use kpx_proto::types::{NodeConfig, ServiceView};
use tonic::{Request, Response, Status};

use crate::publisher::{ImportsReceiver, StatusReceiver};
use crate::source::SourceSpec;
use crate::xds::nodes::NodeRegistry;
use crate::xds::snapshot::Audience;
use crate::xds::snapshot::SnapshotReceiver;
use crate::xds::{ResourceType, Snapshot};

pub struct ControlPlaneAdminService {
    snapshots: SnapshotReceiver,
    nodes: NodeRegistry,
    sources: Vec<SourceSpec>,
    status: StatusReceiver,
    imports: ImportsReceiver,
}

impl ControlPlaneAdminService {
    pub fn new(
        snapshots: SnapshotReceiver,
        nodes: NodeRegistry,
        sources: Vec<SourceSpec>,
        status: StatusReceiver,
        imports: ImportsReceiver,
    ) -> Self {
        ControlPlaneAdminService { snapshots, nodes, sources, status, imports }
    }

    fn snapshot(&self) -> Result<Arc<Snapshot>, Status> {
        self.snapshots
            .borrow()
            .clone()
            .ok_or_else(|| Status::unavailable("the sources have not synced yet: no snapshot"))
    }
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn decode_view(body: &[u8]) -> Result<ServiceView, Status> {
    ServiceView::decode(body).map_err(|e| Status::internal(format!("stored view does not decode: {e}")))
}

/// Resolves `cluster/ns/name` or `ns/name` (when one cluster has it) to a resource name.
fn resolve(snapshot: &Snapshot, name: &str) -> Result<String, Status> {
    let names: Vec<&str> = snapshot.defaults().map(|r| r.name.as_str()).collect();
    if names.contains(&name) {
        return Ok(name.to_owned());
    }
    let suffix = format!("/{name}");
    let matches: Vec<&&str> =
        names.iter().filter(|n| n.ends_with(&suffix) && n.matches('/').count() == 2).collect();
    match matches.as_slice() {
        [one] => Ok((**one).to_owned()),
        [] => Err(Status::not_found(format!(
            "no Service {name:?} (use namespace/name or cluster/namespace/name)"
        ))),
        many => Err(Status::invalid_argument(format!(
            "{name:?} is in several clusters: {}",
            many.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

fn summary(view: &ServiceView, version: &str, variants: usize) -> ServiceSummary {
    ServiceSummary {
        name: view.resource_name(),
        cluster_ips: view.cluster_ips.iter().map(ToString::to_string).collect(),
        ports: view
            .ports
            .iter()
            .map(|p| {
                let mut s = if p.name.is_empty() { String::new() } else { format!("{} ", p.name) };
                s.push_str(&format!("{}/{}", p.port, p.protocol.as_str().to_uppercase()));
                if let Some(np) = p.node_port {
                    s.push_str(&format!(":{np}"));
                }
                s
            })
            .collect(),
        endpoints: view.ports.iter().map(|p| p.endpoints.len() as u32).sum(),
        variants: variants as u32,
        version: version.to_owned(),
    }
}

#[tonic::async_trait]
impl ControlPlaneAdmin for ControlPlaneAdminService {
    async fn list_services(
        &self,
        _: Request<ListServicesRequest>,
    ) -> Result<Response<ListServicesResponse>, Status> {
        let snapshot = self.snapshot()?;
        let mut services = Vec::new();
        for resource in snapshot.defaults() {
            let view = decode_view(resource.body())?;
            services.push(summary(&view, &resource.version, snapshot.variants_of(&resource.name).len()));
        }
        Ok(Response::new(ListServicesResponse { services }))
    }

    async fn get_service_views(
        &self,
        request: Request<GetServiceViewsRequest>,
    ) -> Result<Response<GetServiceViewsResponse>, Status> {
        let snapshot = self.snapshot()?;
        let name = resolve(&snapshot, &request.get_ref().name)?;
        let default =
            snapshot.default_view(&name).ok_or_else(|| Status::not_found(format!("no Service {name:?}")))?;
        let variants = snapshot
            .variants_of(&name)
            .into_iter()
            .map(|(nodes, r)| {
                Ok(ViewVariant {
                    nodes,
                    version: r.version.clone(),
                    view: Some(decode_view(r.body())?.to_proto()),
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        Ok(Response::new(GetServiceViewsResponse {
            version: default.version.clone(),
            default_view: Some(decode_view(default.body())?.to_proto()),
            variants,
        }))
    }

    async fn list_nodes(&self, _: Request<ListNodesRequest>) -> Result<Response<ListNodesResponse>, Status> {
        let nodes = self
            .nodes
            .snapshot()
            .into_iter()
            .map(|e| NodeStatus {
                name: e.node,
                peer: e.peer.map(|p| p.to_string()).unwrap_or_default(),
                connected_since_unix_ms: unix_ms(e.connected_since),
                types: e
                    .types
                    .iter()
                    .map(|(ty, p)| TypeStatus {
                        type_url: ty.type_url().to_owned(),
                        acked: p.acked as u32,
                        pending: p.pending as u32,
                        in_flight: p.in_flight,
                        last_nack: p.last_nack.as_ref().map(|(r, _)| r.clone()).unwrap_or_default(),
                        last_nack_unix_ms: p.last_nack.as_ref().map_or(0, |(_, t)| unix_ms(*t)),
                        lag_seconds: p.behind_since.map_or(0.0, |t| t.elapsed().as_secs_f64()),
                        responses_sent: p.responses_sent,
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(ListNodesResponse { nodes }))
    }

    async fn get_node_resources(
        &self,
        request: Request<GetNodeResourcesRequest>,
    ) -> Result<Response<GetNodeResourcesResponse>, Status> {
        let node = request.into_inner().node;
        let versions = self
            .nodes
            .versions(&node)
            .await
            .ok_or_else(|| Status::not_found(format!("node {node:?} is not connected")))?;
        let snapshot = self.snapshot()?;
        let proxy = self.nodes.proxy_name(&node);
        let who = Audience { node: &node, proxy: &proxy };
        let mut resources: Vec<NodeResource> = versions
            .into_iter()
            .map(|(ty, name, acked, rejected)| NodeResource {
                type_url: ty.type_url().to_owned(),
                current_version: snapshot.get(ty, who, &name).map(|r| r.version.clone()).unwrap_or_default(),
                name,
                acked_version: acked.unwrap_or_default(),
                rejected_version: rejected.unwrap_or_default(),
            })
            .collect();
        // What the node should have and has not ACKed at all.
        for ty in ResourceType::ALL {
            for r in snapshot.for_node(ty, who) {
                if !resources.iter().any(|x| x.type_url == ty.type_url() && x.name == r.name) {
                    resources.push(NodeResource {
                        type_url: ty.type_url().to_owned(),
                        name: r.name.clone(),
                        acked_version: String::new(),
                        current_version: r.version.clone(),
                        rejected_version: String::new(),
                    });
                }
            }
        }
        resources.sort_by(|a, b| (&a.type_url, &a.name).cmp(&(&b.type_url, &b.name)));
        Ok(Response::new(GetNodeResourcesResponse { resources }))
    }

    async fn list_sources(
        &self,
        _: Request<ListSourcesRequest>,
    ) -> Result<Response<ListSourcesResponse>, Status> {
        let status = self.status.borrow();
        let sources = self
            .sources
            .iter()
            .map(|spec| {
                let known = status.get(&spec.cluster).cloned().unwrap_or_default();
                SourceStatus {
                    cluster: spec.cluster.clone(),
                    spec: spec.to_string(),
                    synced: known.synced,
                    services: known.services as u32,
                    endpoint_slices: known.endpoint_slices as u32,
                    nodes: known.nodes as u32,
                }
            })
            .collect();
        Ok(Response::new(ListSourcesResponse { sources }))
    }

    async fn get_node_view(
        &self,
        request: Request<GetNodeViewRequest>,
    ) -> Result<Response<GetNodeViewResponse>, Status> {
        let snapshot = self.snapshot()?;
        let GetNodeViewRequest { node, service } = request.into_inner();
        let proxy = self.nodes.proxy_name(&node);
        let who = Audience { node: &node, proxy: &proxy };
        // `ns/name` means the node's own Service when several clusters have one.
        let own = snapshot.for_node(ResourceType::ServiceView, who).find(|r| {
            r.name.strip_suffix(&service).is_some_and(|c| c.ends_with('/') && c.matches('/').count() == 1)
        });
        let name = match own {
            Some(r) => r.name.clone(),
            None => resolve(&snapshot, &service)?,
        };
        let resource = snapshot
            .get(ResourceType::ServiceView, who, &name)
            .ok_or_else(|| Status::not_found(format!("no Service {name:?} for node {node:?}")))?;
        let node_config = match snapshot.node_config(&node) {
            Some(r) => Some(
                NodeConfig::decode(r.body())
                    .map_err(|e| Status::internal(format!("stored node config does not decode: {e}")))?
                    .to_proto(),
            ),
            None => None,
        };
        Ok(Response::new(GetNodeViewResponse {
            version: resource.version.clone(),
            view: Some(decode_view(resource.body())?.to_proto()),
            node_config,
        }))
    }

    async fn list_imports(
        &self,
        _: Request<ListImportsRequest>,
    ) -> Result<Response<ListImportsResponse>, Status> {
        use crate::model::ImportType;
        let imports = (self.imports.borrow().iter())
            .map(|r| ImportSummary {
                name: r.key.to_string(),
                r#type: match r.import_type {
                    Some(ImportType::ClusterSetIp) => "ClusterSetIP".into(),
                    Some(ImportType::Headless) => "Headless".into(),
                    None => String::new(),
                },
                ips: r.ips.iter().map(ToString::to_string).collect(),
                ports: (r.ports.iter())
                    .map(|p| {
                        format!("{} {}/{}", p.name, p.port, p.protocol.api_name()).trim_start().to_owned()
                    })
                    .collect(),
                exported_by: r.exported_by.clone(),
                imported_in: r.imported_in.clone(),
                conflicts: r.conflicts.clone(),
                invalid: r.invalid.clone(),
            })
            .collect();
        Ok(Response::new(ListImportsResponse { imports }))
    }

    async fn trace(&self, request: Request<NodeTraceRequest>) -> Result<Response<TraceResponse>, Status> {
        let snapshot = self.snapshot()?;
        let NodeTraceRequest { node, packet } = request.into_inner();
        let proxy = self.nodes.proxy_name(&node);
        let packet = Packet::from_request(&packet.unwrap_or_default()).map_err(Status::invalid_argument)?;
        let views = snapshot
            .for_node(ResourceType::ServiceView, Audience { node: &node, proxy: &proxy })
            .map(|r| decode_view(r.body()))
            .collect::<Result<Vec<_>, Status>>()?;
        let config = snapshot.node_config(&node).and_then(|r| NodeConfig::decode(r.body()).ok());
        let context = NodeContext::derive(&ProxySettings::default(), config.as_ref());
        let mut t = trace::trace(&views, &context, packet);
        if config.is_none() {
            t.steps.insert(
                0,
                (
                    format!("node {node:?} unknown"),
                    "no Node object: its addresses and pod CIDRs are not known".into(),
                ),
            );
        }
        Ok(Response::new(t.into_response()))
    }
}
