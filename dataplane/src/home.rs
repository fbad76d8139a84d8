//! How the agent finds its control plane without depending on the rules kpx itself
//! programs. A control plane URL that names a Service (`https://NAME.NAMESPACE.svc:PORT`,
//! the chart's default) resolves through cluster DNS to a ClusterIP — both Services whose
//! rules only a connected agent can keep current. So besides the URL as written, the
//! agent dials the Service's endpoints directly (their addresses as the node's stored
//! state last had them), checking the certificate against the URL's name whatever address
//! it dials; and when none of those answers, it asks the API server at its real address
//! (configured, or the `kubernetes` Service's endpoints from the stored state) where the
//! Service's endpoints are now, and which install they belong to (the Service's UID).

use std::net::SocketAddr;

use kpx_proto::types::Protocol;

use tonic::transport::Channel;

use crate::agent::SharedAgent;
use crate::apiserver::{ApiCredentials, ApiServer, ServiceRef};
use crate::connection::ControlPlane;
use crate::state::NodeState;

/// The `kubernetes` Service (default namespace), whose endpoints are the API server's
/// real addresses.
const KUBERNETES: (&str, &str) = ("default", "kubernetes");

/// The Service a control plane URL names, if its host is `NAME.NAMESPACE.svc` (with or
/// without the cluster domain after it).
pub fn service_of_url(url: &str) -> Option<ServiceRef> {
    let uri: tonic::codegen::http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    let mut labels = host.split('.');
    let (name, namespace, svc) = (labels.next()?, labels.next()?, labels.next()?);
    if svc != "svc" || name.is_empty() || namespace.is_empty() {
        return None;
    }
    let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
    Some(ServiceRef { namespace: namespace.to_owned(), name: name.to_owned(), port })
}

/// The endpoints the stored state has for `service`'s TCP port, in any cluster.
pub fn stored_addresses(state: &NodeState, service: &ServiceRef) -> Vec<SocketAddr> {
    let mut addresses: Vec<SocketAddr> = state
        .services
        .values()
        .map(|s| &s.value)
        .filter(|v| v.namespace == service.namespace && v.name == service.name)
        .flat_map(|v| &v.ports)
        .filter(|p| p.port == service.port && p.protocol == Protocol::Tcp)
        .flat_map(|p| &p.endpoints)
        .filter(|e| !e.terminating)
        .map(|e| SocketAddr::new(e.address, e.port))
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
}

/// The API server's real addresses as the stored state has them: the endpoints of the
/// `kubernetes` Service's `https` port.
pub fn stored_api_servers(state: &NodeState) -> Vec<SocketAddr> {
    let service = |port| ServiceRef { namespace: KUBERNETES.0.into(), name: KUBERNETES.1.into(), port };
    let https = state
        .services
        .values()
        .filter(|s| s.value.namespace == KUBERNETES.0 && s.value.name == KUBERNETES.1)
        .flat_map(|s| &s.value.ports)
        .find(|p| p.name == "https")
        .map_or(443, |p| p.port);
    stored_addresses(state, &service(https))
}

/// Where the API server can be asked: its configured address first, then those the stored
/// state has.
#[derive(Debug, Clone, Default)]
pub struct ApiAccess {
    pub configured: Option<ApiServer>,
    pub credentials: ApiCredentials,
}

impl ApiAccess {
    /// Whether there is any way to authenticate: without a token, asking would only be refused.
    pub fn usable(&self) -> bool {
        self.configured.is_some() || self.credentials.token_file.is_some()
    }

    /// The API servers to ask, in order.
    pub fn servers(&self, state: &NodeState) -> Vec<ApiServer> {
        let mut servers: Vec<ApiServer> = self.configured.iter().cloned().collect();
        if self.credentials.token_file.is_some() && self.credentials.ca.is_some() {
            for address in stored_api_servers(state) {
                let learned = ApiServer::at(address, self.credentials.clone());
                if !servers.iter().any(|s| s.host == learned.host && s.port == learned.port) {
                    servers.push(learned);
                }
            }
        }
        servers
    }
}

/// At the agent's start: the UID of the first of `services` (the control planes' Services)
/// that an API server answers for — the install the node belongs to now — or `None` if
/// none can be asked within a few seconds (the stored state is then taken as it is).
pub async fn current_install(api: &ApiAccess, state: &NodeState, services: &[ServiceRef]) -> Option<String> {
    if !api.usable() {
        return None;
    }
    for server in api.servers(state) {
        for service in services {
            match server.control_plane(service).await {
                Ok(found) => return Some(found.uid),
                Err(e) => tracing::warn!(
                    api_server = server.url(),
                    service = %service,
                    error = %e,
                    "cannot learn the control plane's install; the stored state is taken as it is"
                ),
            }
        }
    }
    None
}

/// One control plane (one `--control-plane` URL) and what the agent learned of where its
/// Service's endpoints are.
pub struct Home {
    control_plane: ControlPlane,
    service: Option<ServiceRef>,
    /// The endpoints the API server last gave for the Service.
    discovered: Vec<SocketAddr>,
    /// The last attempt found no way.
    failed_before: bool,
    /// When the API server was last asked (it is asked at most once per [`ASK_EVERY`]).
    last_asked: Option<tokio::time::Instant>,
}

/// How often, at most, a node asks the API server where its control plane is: the dial
/// loop retries from 100 ms, and every node of a cluster does so at once when the control
/// plane goes away.
const ASK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the API server may be asked again, `last` having been the last time.
fn may_ask(last: Option<tokio::time::Instant>, now: tokio::time::Instant) -> bool {
    last.is_none_or(|at| now.duration_since(at) >= ASK_EVERY)
}

impl Home {
    pub fn new(control_plane: ControlPlane) -> Home {
        let service = service_of_url(&control_plane.url);
        Home { control_plane, service, discovered: Vec::new(), failed_before: false, last_asked: None }
    }

    pub fn control_plane(&self) -> &ControlPlane {
        &self.control_plane
    }

    /// Connects by the first way that answers: the URL as written, the Service's endpoints
    /// the stored state has and those the API server gave before, all at once; and the
    /// endpoints the API server gives now — asked at the same time when the last attempt
    /// failed too (an outage: what the node knows is likely stale) or nothing but the URL
    /// is known, else once the known ways failed. Returns the channel and the address
    /// dialled (`None`: the URL's own).
    pub async fn dial(
        &mut self,
        agent: &SharedAgent,
        api: &ApiAccess,
    ) -> Result<(Channel, Option<SocketAddr>), anyhow::Error> {
        let mut candidates = vec![None];
        if let Some(service) = &self.service {
            let stored = stored_addresses(agent.lock().state(), service);
            for address in stored.into_iter().chain(self.discovered.iter().copied()) {
                if !candidates.contains(&Some(address)) {
                    candidates.push(Some(address));
                }
            }
        }
        let now = tokio::time::Instant::now();
        let service = self.service.clone().filter(|_| api.usable() && may_ask(self.last_asked, now));
        if service.is_some() {
            self.last_asked = Some(now);
        }
        let known = first_connected(&self.control_plane, &candidates);
        let result = match &service {
            None => known.await,
            Some(service) => {
                let servers = api.servers(agent.lock().state());
                let asked = ask_and_dial(&self.control_plane, agent, service, servers, &candidates);
                let (discovered, result) = if self.failed_before || candidates.len() == 1 {
                    first_of(known, asked).await
                } else {
                    match known.await {
                        Ok(connected) => (None, Ok(connected)),
                        Err(mut failures) => {
                            let (discovered, result) = asked.await;
                            (
                                discovered,
                                result.map_err(|more| {
                                    failures.extend(more);
                                    failures
                                }),
                            )
                        }
                    }
                };
                if let Some(discovered) = discovered {
                    self.discovered = discovered;
                }
                result
            }
        };
        self.failed_before = result.is_err();
        result.map_err(|failures| anyhow::anyhow!("{}", failures.join("; ")))
    }
}

type Dialled = Result<(Channel, Option<SocketAddr>), Vec<String>>;

/// The first success of the known ways and of asking the API server, or every failure.
async fn first_of(
    known: impl std::future::Future<Output = Dialled>,
    asked: impl std::future::Future<Output = (Option<Vec<SocketAddr>>, Dialled)>,
) -> (Option<Vec<SocketAddr>>, Dialled) {
    use futures::future::{select, Either};
    let (known, asked) = (std::pin::pin!(known), std::pin::pin!(asked));
    match select(known, asked).await {
        Either::Left((Ok(connected), _)) => (None, Ok(connected)),
        Either::Left((Err(mut failures), asked)) => {
            let (discovered, result) = asked.await;
            (
                discovered,
                result.map_err(|more| {
                    failures.extend(more);
                    failures
                }),
            )
        }
        Either::Right(((discovered, Ok(connected)), _)) => (discovered, Ok(connected)),
        Either::Right(((discovered, Err(mut failures)), known)) => {
            let result = known.await.map_err(|more| {
                failures.extend(more);
                failures
            });
            (discovered, result)
        }
    }
}

/// Asks the API servers, in turn, for `service`'s ready endpoints (recording its UID as
/// the install), and dials those not in `tried`; returns what it learned too.
async fn ask_and_dial(
    control_plane: &ControlPlane,
    agent: &SharedAgent,
    service: &ServiceRef,
    servers: Vec<ApiServer>,
    tried: &[Option<SocketAddr>],
) -> (Option<Vec<SocketAddr>>, Dialled) {
    let mut failures = Vec::new();
    if servers.is_empty() {
        failures.push(format!("no API server address to ask where {service} is (configure --api-server)"));
    }
    let mut discovered = None;
    for server in servers {
        match server.control_plane(service).await {
            Ok(found) => {
                tracing::info!(
                    api_server = server.url(),
                    service = %service,
                    endpoints = ?found.addresses,
                    "asked the API server where the control plane is"
                );
                agent.lock().note_install(&found.uid);
                discovered = Some(found.addresses);
                break;
            }
            Err(e) => failures.push(format!("API server {}: {e}", server.url())),
        }
    }
    let Some(addresses) = &discovered else { return (None, Err(failures)) };
    if addresses.is_empty() {
        failures.push(format!("the API server lists no ready endpoint of {service}"));
    }
    let fresh: Vec<Option<SocketAddr>> =
        addresses.iter().copied().map(Some).filter(|a| !tried.contains(a)).collect();
    if fresh.is_empty() {
        return (discovered, Err(failures));
    }
    let result = first_connected(control_plane, &fresh).await.map_err(|more| {
        failures.extend(more);
        failures
    });
    (discovered, result)
}

/// Dials every candidate at once; the first connection made, or every failure.
async fn first_connected(control_plane: &ControlPlane, candidates: &[Option<SocketAddr>]) -> Dialled {
    let mut attempts: futures::stream::FuturesUnordered<_> = candidates
        .iter()
        .map(|&address| async move {
            let whom = address.map_or_else(|| control_plane.url.clone(), |a| a.to_string());
            // The bound covers name resolution too (a resolver whose ClusterIP is not
            // routed waits far longer than a connect).
            match tokio::time::timeout(control_plane.keepalive, control_plane.connect_via(address)).await {
                Ok(Ok(channel)) => Ok((channel, address)),
                Ok(Err(e)) => Err(format!("connect {whom}: {}", kpx_proto::cli::causes(&e))),
                Err(_) => Err(format!("connect {whom}: no connection within {:?}", control_plane.keepalive)),
            }
        })
        .collect();
    let mut failures = Vec::new();
    while let Some(attempt) = futures::StreamExt::next(&mut attempts).await {
        match attempt {
            Ok(connected) => return Ok(connected),
            Err(failure) => failures.push(failure),
        }
    }
    Err(failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Versioned;
    use kpx_proto::types::{Endpoint, ServicePort, ServiceView};
    use std::sync::Arc;

    fn view(namespace: &str, name: &str, port: ServicePort) -> Versioned<Arc<ServiceView>> {
        let value = ServiceView::new("", namespace, name, vec!["10.96.0.9".parse().expect("ip")], vec![port]);
        Versioned { version: "1".into(), value: Arc::new(value) }
    }

    fn endpoint(address: &str, port: u16, terminating: bool) -> Endpoint {
        Endpoint::new(address.parse().expect("ip"), port, "n1", "", terminating)
    }

    #[test]
    fn the_api_server_is_asked_at_most_once_a_second() {
        let start = tokio::time::Instant::now();
        let at = |ms: u64| start + std::time::Duration::from_millis(ms);
        assert!(may_ask(None, start), "never asked: ask");
        assert!(!may_ask(Some(at(0)), at(100)), "the dial loop's first retry, 100 ms on");
        assert!(!may_ask(Some(at(0)), at(999)));
        assert!(may_ask(Some(at(0)), at(1000)));
    }

    #[test]
    fn a_url_names_a_service_only_by_its_service_dns_name() {
        let svc = service_of_url("https://kpx-controlplane.kube-system.svc:18000").expect("a Service");
        assert_eq!(
            (svc.namespace.as_str(), svc.name.as_str(), svc.port),
            ("kube-system", "kpx-controlplane", 18000)
        );
        let long = service_of_url("https://cp.kpx.svc.cluster.local").expect("with the cluster domain");
        assert_eq!((long.name.as_str(), long.port), ("cp", 443));
        for other in ["http://127.0.0.1:18000", "https://cp.example.com:18000", "https://cp:18000"] {
            assert_eq!(service_of_url(other), None, "{other}");
        }
    }

    #[test]
    fn stored_endpoints_of_the_port_serving_and_not_terminating() {
        let mut state = NodeState::default();
        let grpc = ServicePort::new(
            "grpc",
            Protocol::Tcp,
            18000,
            vec![endpoint("10.244.1.5", 18000, false), endpoint("10.244.2.5", 18000, true)],
        );
        state.services_mut().insert("cp".into(), view("kube-system", "kpx-controlplane", grpc));
        let api = ServicePort::new("https", Protocol::Tcp, 443, vec![endpoint("192.168.1.10", 6443, false)]);
        state.services_mut().insert("k".into(), view("default", "kubernetes", api));
        let cp = ServiceRef { namespace: "kube-system".into(), name: "kpx-controlplane".into(), port: 18000 };
        assert_eq!(stored_addresses(&state, &cp), ["10.244.1.5:18000".parse::<SocketAddr>().expect("addr")]);
        assert!(stored_addresses(&state, &ServiceRef { port: 18002, ..cp }).is_empty());
        assert_eq!(stored_api_servers(&state), ["192.168.1.10:6443".parse::<SocketAddr>().expect("addr")]);
        let access = ApiAccess {
            configured: None,
            credentials: ApiCredentials { token_file: Some("/t".into()), ca: Some("/ca".into()) },
        };
        assert_eq!(access.servers(&state)[0].url(), "https://192.168.1.10:6443");
    }
}
