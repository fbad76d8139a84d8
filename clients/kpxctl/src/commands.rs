//! Each command: ask the right admin API, then render a table or JSON.

use anyhow::{anyhow, Context};
use kpx_proto::admin::control_plane_admin_client::ControlPlaneAdminClient;
use kpx_proto::admin::node_admin_client::NodeAdminClient;
use kpx_proto::admin::{
    GetNodeResourcesRequest, GetNodeViewRequest, GetRulesRequest, GetServiceViewsRequest, GetStateRequest,
    GetStatusRequest, ListImportsRequest, ListNodesRequest, ListServicesRequest, ListSourcesRequest,
    NodeTraceRequest, TraceRequest, TraceResponse,
};
use kpx_proto::pb;
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::table;
use crate::{Cli, Command, Output};

fn read(path: &std::path::Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{flag} {}: cannot read", path.display()))
}

async fn connect(cli: &Cli, url: &str, what: &str) -> anyhow::Result<Channel> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("{url:?} is not a URL (like http://127.0.0.1:18000)"))?
        .connect_timeout(std::time::Duration::from_secs(5));
    if url.starts_with("https://") {
        let ca = cli.tls_ca.as_ref().ok_or_else(|| anyhow!("{url}: --tls-ca is needed for https://"))?;
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(ca, "--tls-ca")?));
        if let (Some(cert), Some(key)) = (&cli.tls_cert, &cli.tls_key) {
            tls = tls.identity(tonic::transport::Identity::from_pem(
                read(cert, "--tls-cert")?,
                read(key, "--tls-key")?,
            ));
        }
        endpoint = endpoint.tls_config(tls).with_context(|| format!("TLS towards {url}"))?;
    }
    endpoint.connect().await.map_err(|e| anyhow!("cannot reach the {what} at {url}: {e}"))
}

fn call_error(what: &str) -> impl Fn(tonic::Status) -> anyhow::Error + '_ {
    move |s| match s.code() {
        tonic::Code::Unavailable => anyhow!("the {what} is unavailable: {}", s.message()),
        tonic::Code::Unimplemented => anyhow!("this server is not a {what} (no such admin API)"),
        tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => {
            anyhow!("the {what} refused this client: {}", s.message())
        }
        _ => anyhow!("{}", s.message()),
    }
}

pub async fn run(cli: &Cli) -> anyhow::Result<String> {
    const CP: &str = "control plane";
    const AGENT: &str = "node agent";
    let json = cli.output == Output::Json;
    match &cli.command {
        Command::Services => {
            let mut c = ControlPlaneAdminClient::new(connect(cli, &cli.control_plane, CP).await?);
            let r = c.list_services(ListServicesRequest {}).await.map_err(call_error(CP))?.into_inner();
            if json {
                let list: Vec<Value> = r
                    .services
                    .iter()
                    .map(|s| json!({"name": s.name, "clusterIPs": s.cluster_ips, "ports": s.ports, "endpoints": s.endpoints, "variants": s.variants, "version": s.version}))
                    .collect();
                return pretty(json!({ "services": list }));
            }
            let rows = r
                .services
                .iter()
                .map(|s| {
                    vec![
                        s.name.clone(),
                        s.cluster_ips.join(","),
                        s.ports.join(", "),
                        s.endpoints.to_string(),
                        s.variants.to_string(),
                    ]
                })
                .collect::<Vec<_>>();
            Ok(table::render(&["SERVICE", "CLUSTER-IPS", "PORTS", "ENDPOINTS", "NODE-VARIANTS"], &rows))
        }
        Command::Endpoints { service, node } => {
            let mut c = ControlPlaneAdminClient::new(connect(cli, &cli.control_plane, CP).await?);
            let views: Vec<(String, String, pb::ServiceView)> = match node {
                Some(node) => {
                    let r = c
                        .get_node_view(GetNodeViewRequest { node: node.clone(), service: service.clone() })
                        .await
                        .map_err(call_error(CP))?
                        .into_inner();
                    vec![(format!("node {node}"), r.version, r.view.unwrap_or_default())]
                }
                None => {
                    let r = c
                        .get_service_views(GetServiceViewsRequest { name: service.clone() })
                        .await
                        .map_err(call_error(CP))?
                        .into_inner();
                    let mut all =
                        vec![("every other node".to_owned(), r.version, r.default_view.unwrap_or_default())];
                    all.extend(
                        r.variants
                            .into_iter()
                            .map(|v| (v.nodes.join(" "), v.version, v.view.unwrap_or_default())),
                    );
                    all
                }
            };
            if json {
                let list: Vec<Value> = views
                    .iter()
                    .map(|(who, version, v)| json!({"for": who, "version": version, "view": view_json(v)}))
                    .collect();
                return pretty(json!({ "views": list }));
            }
            let mut rows = Vec::new();
            for (who, _, view) in &views {
                for port in &view.ports {
                    let port_name =
                        format!("{} {}", if port.name.is_empty() { "-" } else { &port.name }, port.port);
                    let mut eps: Vec<(&str, &pb::Endpoint)> =
                        port.endpoints.iter().map(|e| ("cluster", e)).collect();
                    eps.extend(port.local_endpoints.iter().map(|e| ("local", e)));
                    if eps.is_empty() {
                        rows.push(vec![
                            who.clone(),
                            port_name.clone(),
                            "(none)".into(),
                            String::new(),
                            String::new(),
                            String::new(),
                            String::new(),
                        ]);
                    }
                    for (set, e) in eps {
                        rows.push(vec![
                            who.clone(),
                            port_name.clone(),
                            endpoint_text(&e.address, e.port),
                            e.node_name.clone(),
                            if e.cluster.is_empty() { view.cluster.clone() } else { e.cluster.clone() },
                            set.to_owned(),
                            if e.terminating { "terminating".into() } else { "ready".into() },
                        ]);
                    }
                }
            }
            Ok(table::render(&["VIEW-FOR", "PORT", "ENDPOINT", "NODE", "CLUSTER", "SET", "STATE"], &rows))
        }
        Command::Nodes { node: Some(node) } => {
            let mut c = ControlPlaneAdminClient::new(connect(cli, &cli.control_plane, CP).await?);
            let r = c
                .get_node_resources(GetNodeResourcesRequest { node: node.clone() })
                .await
                .map_err(call_error(CP))?
                .into_inner();
            let state = |x: &kpx_proto::admin::NodeResource| {
                if !x.rejected_version.is_empty() && x.rejected_version == x.current_version {
                    "NACKed"
                } else if x.acked_version == x.current_version {
                    "in sync"
                } else if x.current_version.is_empty() {
                    "to remove"
                } else {
                    "behind"
                }
            };
            if json {
                let list: Vec<Value> = r
                    .resources
                    .iter()
                    .map(|x| json!({"typeUrl": x.type_url, "name": x.name, "ackedVersion": x.acked_version, "currentVersion": x.current_version, "rejectedVersion": x.rejected_version, "state": state(x)}))
                    .collect();
                return pretty(json!({"node": node, "resources": list}));
            }
            let short = |v: &str| v.chars().take(12).collect::<String>();
            let rows = r
                .resources
                .iter()
                .map(|x| {
                    vec![
                        x.type_url.rsplit('.').next().unwrap_or_default().to_owned(),
                        x.name.clone(),
                        short(&x.acked_version),
                        short(&x.current_version),
                        state(x).to_owned(),
                    ]
                })
                .collect::<Vec<_>>();
            Ok(table::render(&["TYPE", "NAME", "ACKED", "CURRENT", "STATE"], &rows))
        }
        Command::Nodes { node: None } => {
            let mut c = ControlPlaneAdminClient::new(connect(cli, &cli.control_plane, CP).await?);
            let r = c.list_nodes(ListNodesRequest {}).await.map_err(call_error(CP))?.into_inner();
            if json {
                let list: Vec<Value> = r
                    .nodes
                    .iter()
                    .map(|n| {
                        let types: Vec<Value> = n
                            .types
                            .iter()
                            .map(|t| json!({"typeUrl": t.type_url, "acked": t.acked, "pending": t.pending, "inFlight": t.in_flight, "lastNack": t.last_nack, "lastNackUnixMs": t.last_nack_unix_ms, "lagSeconds": t.lag_seconds, "responsesSent": t.responses_sent}))
                            .collect();
                        json!({"name": n.name, "peer": n.peer, "connectedSinceUnixMs": n.connected_since_unix_ms, "types": types})
                    })
                    .collect();
                return pretty(json!({ "nodes": list }));
            }
            let mut rows = Vec::new();
            for n in &r.nodes {
                for t in &n.types {
                    rows.push(vec![
                        n.name.clone(),
                        n.peer.clone(),
                        t.type_url.rsplit('.').next().unwrap_or_default().to_owned(),
                        t.acked.to_string(),
                        t.pending.to_string(),
                        format!("{:.3}s", t.lag_seconds),
                        if t.last_nack.is_empty() { "-".into() } else { t.last_nack.clone() },
                    ]);
                }
            }
            Ok(table::render(&["NODE", "PEER", "TYPE", "ACKED", "PENDING", "LAG", "LAST-NACK"], &rows))
        }
        Command::Imports => {
            let mut c = ControlPlaneAdminClient::new(connect(cli, &cli.control_plane, CP).await?);
            let r = c.list_imports(ListImportsRequest {}).await.map_err(call_error(CP))?.into_inner();
            if json {
                let list: Vec<Value> = (r.imports.iter())
                    .map(|i| {
                        json!({"name": i.name, "type": i.r#type, "ips": i.ips, "ports": i.ports,
                            "exportedBy": i.exported_by, "importedIn": i.imported_in,
                            "conflicts": i.conflicts, "invalid": i.invalid})
                    })
                    .collect();
                return pretty(json!({ "imports": list }));
            }
            let dash = |list: &[String]| if list.is_empty() { "-".to_owned() } else { list.join(",") };
            let rows = (r.imports.iter())
                .map(|i| {
                    let problems: Vec<String> = i.conflicts.iter().chain(&i.invalid).cloned().collect();
                    vec![
                        i.name.clone(),
                        if i.r#type.is_empty() { "-".into() } else { i.r#type.clone() },
                        dash(&i.ips),
                        dash(&i.ports),
                        dash(&i.exported_by),
                        dash(&i.imported_in),
                        if problems.is_empty() { "-".into() } else { problems.join("; ") },
                    ]
                })
                .collect::<Vec<_>>();
            Ok(table::render(
                &["IMPORT", "TYPE", "IPS", "PORTS", "EXPORTED BY", "IMPORTED IN", "PROBLEMS"],
                &rows,
            ))
        }
        Command::Sources => {
            let mut c = ControlPlaneAdminClient::new(connect(cli, &cli.control_plane, CP).await?);
            let r = c.list_sources(ListSourcesRequest {}).await.map_err(call_error(CP))?.into_inner();
            if json {
                let list: Vec<Value> = r.sources.iter().map(|s| json!({"cluster": s.cluster, "spec": s.spec, "synced": s.synced, "services": s.services, "endpointSlices": s.endpoint_slices, "nodes": s.nodes})).collect();
                return pretty(json!({ "sources": list }));
            }
            let rows = r
                .sources
                .iter()
                .map(|s| {
                    vec![
                        s.cluster.clone(),
                        s.spec.clone(),
                        s.synced.to_string(),
                        s.services.to_string(),
                        s.endpoint_slices.to_string(),
                        s.nodes.to_string(),
                    ]
                })
                .collect::<Vec<_>>();
            Ok(table::render(&["CLUSTER", "SOURCE", "SYNCED", "SERVICES", "SLICES", "NODES"], &rows))
        }
        Command::Rules => {
            let mut c = NodeAdminClient::new(connect(cli, &cli.agent, AGENT).await?);
            let r = c.get_rules(GetRulesRequest {}).await.map_err(call_error(AGENT))?.into_inner();
            if json {
                return pretty(json!({"backend": r.backend, "text": r.text}));
            }
            Ok(r.text)
        }
        Command::State => {
            let mut c = NodeAdminClient::new(connect(cli, &cli.agent, AGENT).await?);
            let r = c.get_state(GetStateRequest {}).await.map_err(call_error(AGENT))?.into_inner();
            if json {
                let list: Vec<Value> = r
                    .services
                    .iter()
                    .map(|s| json!({"name": s.name, "version": s.version, "view": view_json(&s.view.clone().unwrap_or_default())}))
                    .collect();
                return pretty(
                    json!({"node": r.node, "nodeConfigVersion": r.node_config_version, "services": list}),
                );
            }
            let rows = r
                .services
                .iter()
                .map(|s| {
                    let eps: usize =
                        s.view.as_ref().map_or(0, |v| v.ports.iter().map(|p| p.endpoints.len()).sum());
                    vec![s.name.clone(), s.version.clone(), eps.to_string()]
                })
                .collect::<Vec<_>>();
            Ok(table::render(&["SERVICE", "VERSION", "ENDPOINTS"], &rows))
        }
        Command::Status => {
            let mut c = NodeAdminClient::new(connect(cli, &cli.agent, AGENT).await?);
            let s = c.get_status(GetStatusRequest {}).await.map_err(call_error(AGENT))?.into_inner();
            let v = json!({"node": s.node, "backend": s.backend, "controlPlane": s.control_plane, "connected": s.connected, "connectedSinceUnixMs": s.connected_since_unix_ms, "lastError": s.last_error, "lastApplySeconds": s.last_apply_seconds, "lastApplyUnixMs": s.last_apply_unix_ms, "applies": s.applies, "nacks": s.nacks, "lastNackTypeUrl": s.last_nack_type_url, "lastNack": s.last_nack, "lastNackUnixMs": s.last_nack_unix_ms, "secondsSinceContact": s.seconds_since_contact, "lastContactUnixMs": s.last_contact_unix_ms, "interfaceAddresses": s.interface_addresses, "nodePortAddresses": s.nodeport_addresses});
            if json {
                return pretty(v);
            }
            let rows = vec![
                vec!["node".into(), s.node],
                vec!["backend".into(), s.backend],
                vec![
                    "control plane".into(),
                    format!(
                        "{} ({})",
                        s.control_plane,
                        if s.connected { "connected" } else { "not connected" }
                    ),
                ],
                vec![
                    "last contact".into(),
                    if s.last_contact_unix_ms == 0 {
                        format!("none since the agent started {:.0}s ago", s.seconds_since_contact)
                    } else {
                        format!("{:.0}s ago", s.seconds_since_contact)
                    },
                ],
                vec!["interface addresses".into(), list_or_dash(&s.interface_addresses)],
                vec!["NodePort addresses".into(), list_or_dash(&s.nodeport_addresses)],
                vec!["applies / NACKs".into(), format!("{} / {}", s.applies, s.nacks)],
                vec!["last apply".into(), format!("{:.1} ms", s.last_apply_seconds * 1e3)],
                vec!["last error".into(), if s.last_error.is_empty() { "-".into() } else { s.last_error }],
                vec!["last NACK".into(), if s.last_nack.is_empty() { "-".into() } else { s.last_nack }],
            ];
            Ok(table::render(&["", ""], &rows))
        }
        Command::Trace { destination, node, source } => {
            let (destination, protocol) = match destination.rsplit_once('/') {
                Some((d, p)) => (d.to_owned(), p.to_owned()),
                None => (destination.clone(), "tcp".to_owned()),
            };
            let packet = TraceRequest { destination, protocol, source: source.clone().unwrap_or_default() };
            let r = match node {
                Some(node) => {
                    let mut c = ControlPlaneAdminClient::new(connect(cli, &cli.control_plane, CP).await?);
                    c.trace(NodeTraceRequest { node: node.clone(), packet: Some(packet) })
                        .await
                        .map_err(call_error(CP))?
                }
                None => {
                    let mut c = NodeAdminClient::new(connect(cli, &cli.agent, AGENT).await?);
                    c.trace(packet).await.map_err(call_error(AGENT))?
                }
            }
            .into_inner();
            if json {
                return pretty(trace_json(&r));
            }
            Ok(trace_text(&r))
        }
    }
}

fn pretty(v: Value) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(&v)? + "\n")
}

fn endpoint_text(address: &str, port: u32) -> String {
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

fn view_json(v: &pb::ServiceView) -> Value {
    let eps = |list: &[pb::Endpoint]| -> Vec<Value> {
        list.iter()
            .map(|e| {
                let cluster = if e.cluster.is_empty() { &v.cluster } else { &e.cluster };
                json!({"address": e.address, "port": e.port, "node": e.node_name, "terminating": e.terminating, "cluster": cluster})
            })
            .collect()
    };
    let ports: Vec<Value> = v
        .ports
        .iter()
        .map(|p| json!({"name": p.name, "protocol": pb::Protocol::try_from(p.protocol).map(|p| p.as_str_name()).unwrap_or("?"), "port": p.port, "nodePort": p.node_port, "endpoints": eps(&p.endpoints), "localEndpoints": eps(&p.local_endpoints)}))
        .collect();
    json!({
        "cluster": v.cluster, "namespace": v.namespace, "name": v.name, "clusterIPs": v.cluster_ips,
        "externalIPs": v.external_ips, "loadBalancerIPs": v.load_balancer_ips,
        "loadBalancerSourceRanges": v.load_balancer_source_ranges,
        "externalTrafficLocal": v.external_traffic_local, "internalTrafficLocal": v.internal_traffic_local,
        "healthCheckNodePort": v.health_check_node_port, "sessionAffinityTimeoutSeconds": v.session_affinity_timeout_seconds,
        "ports": ports,
    })
}

fn trace_json(r: &TraceResponse) -> Value {
    let steps: Vec<Value> = r.steps.iter().map(|s| json!({"what": s.what, "why": s.why})).collect();
    let candidates: Vec<Value> = r
        .candidates
        .iter()
        .map(|c| json!({"endpoint": c.endpoint, "probability": c.probability, "node": c.node, "terminating": c.terminating}))
        .collect();
    json!({"service": r.service, "verdict": r.verdict, "masquerade": r.masquerade, "steps": steps, "candidates": candidates})
}

fn trace_text(r: &TraceResponse) -> String {
    let mut out = String::new();
    if !r.service.is_empty() {
        out.push_str(&format!("service     {}\n", r.service));
    }
    out.push_str(&format!("verdict     {}\n", r.verdict));
    if r.verdict == "dnat" {
        out.push_str(&format!("masquerade  {}\n", if r.masquerade { "yes" } else { "no" }));
    }
    out.push('\n');
    for (i, s) in r.steps.iter().enumerate() {
        let mut lines = s.what.lines();
        out.push_str(&format!("{}. {}\n", i + 1, lines.next().unwrap_or_default()));
        for more in lines {
            out.push_str(&format!("   {more}\n"));
        }
        out.push_str(&format!("   because {}\n", s.why));
    }
    if !r.candidates.is_empty() {
        out.push('\n');
        let rows = r
            .candidates
            .iter()
            .map(|c| {
                vec![
                    c.endpoint.clone(),
                    format!("{:.1}%", c.probability * 100.0),
                    c.node.clone(),
                    if c.terminating { "terminating".into() } else { "ready".into() },
                ]
            })
            .collect::<Vec<_>>();
        out.push_str(&table::render(&["ENDPOINT", "PROBABILITY", "NODE", "STATE"], &rows));
    }
    out
}

/// `a, b, c`, or `-` for none.
fn list_or_dash(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(", ")
    }
}
