//! Service health-check servers (`healthCheckNodePort` of Services with
//! externalTrafficPolicy Local): an HTTP server per port that tells a load
//! balancer whether this node has local endpoints, in kube-proxy's shape:
//!
//! ```text
//! 200 (503 with no local endpoint, or while the proxy itself is unhealthy)
//! X-Load-Balancing-Endpoint-Weight: 1
//! {"service":{"namespace":"ns","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}
//! ```
//!
//! It listens on every address of both families (`[::]`, or `0.0.0.0` where the node
//! has no IPv6).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::state::NodeState;
use crate::status::ProxyHealth;

/// What one health-check port reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceHealth {
    pub namespace: String,
    pub name: String,
    pub local_endpoints: usize,
}

impl ServiceHealth {
    /// The answer, given whether the proxy itself is healthy (its rules match what it
    /// accepted, see [`ProxyHealth::healthy`]).
    fn response(&self, proxy_healthy: bool) -> String {
        let body = format!(
            "{{\"service\":{{\"namespace\":{},\"name\":{}}},\"localEndpoints\":{},\"serviceProxyHealthy\":{proxy_healthy}}}",
            json_string(&self.namespace),
            json_string(&self.name),
            self.local_endpoints
        );
        let status =
            if self.local_endpoints > 0 && proxy_healthy { "200 OK" } else { "503 Service Unavailable" };
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.local_endpoints,
            body.len()
        )
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The health-check ports the node state asks for. Local endpoints are this node's
/// ready (not terminating) endpoint addresses, over all the Service's ports.
pub fn desired(state: &NodeState) -> BTreeMap<u16, ServiceHealth> {
    let mut out = BTreeMap::new();
    for svc in state.services.values().map(|s| &s.value) {
        let Some(port) = svc.health_check_node_port.filter(|_| svc.external_traffic_local) else {
            continue;
        };
        let local: BTreeSet<IpAddr> = svc
            .ports
            .iter()
            .flat_map(|p| &p.local_endpoints)
            .filter(|e| !e.terminating)
            .map(|e| e.address)
            .collect();
        out.insert(
            port,
            ServiceHealth {
                namespace: svc.namespace.clone(),
                name: svc.name.clone(),
                local_endpoints: local.len(),
            },
        );
    }
    out
}

/// Keeps one listener per desired port, answering from the latest state and the proxy's
/// own health; runs until the sender goes away.
pub async fn serve(
    mut desired: watch::Receiver<BTreeMap<u16, ServiceHealth>>,
    proxy_health: watch::Receiver<ProxyHealth>,
) {
    let mut servers: HashMap<u16, (watch::Sender<ServiceHealth>, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    // Ports another process holds (kube-proxy's servers, beside it during a migration):
    // tried again until they are free.
    let mut held: BTreeSet<u16> = BTreeSet::new();
    loop {
        let wanted = desired.borrow_and_update().clone();
        held.retain(|port| wanted.contains_key(port));
        servers.retain(|port, (_, task)| {
            let keep = wanted.contains_key(port);
            if !keep {
                task.abort();
                tracing::info!(port, "health-check server stopped");
            }
            keep
        });
        for (port, health) in wanted {
            if let Some((tx, _)) = servers.get(&port) {
                tx.send_if_modified(|h| {
                    let changed = *h != health;
                    *h = health.clone();
                    changed
                });
                continue;
            }
            match listen(port) {
                Ok(listener) => {
                    held.remove(&port);
                    tracing::info!(port, service = %format!("{}/{}", health.namespace, health.name), "health-check server listening");
                    let (tx, rx) = watch::channel(health);
                    servers.insert(port, (tx, tokio::spawn(accept_loop(listener, rx, proxy_health.clone()))));
                }
                Err(e) => {
                    if held.insert(port) {
                        tracing::warn!(port, error = %e, retry_in_s = RETRY.as_secs(), "cannot open health-check port (another process holds it: kube-proxy, beside kpx during a migration?); trying again until it is free");
                    }
                }
            }
        }
        let retry = async {
            if held.is_empty() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(RETRY).await;
        };
        tokio::select! {
            changed = desired.changed() => if changed.is_err() { return },
            () = retry => {}
        }
    }
}

/// How often a health-check port another process holds is tried again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// A listener on `port` of both families: `[::]` taking IPv4 too, or `0.0.0.0` where the
/// node has no IPv6.
fn listen(port: u16) -> std::io::Result<tokio::net::TcpListener> {
    let both = || -> std::io::Result<tokio::net::TcpListener> {
        let socket = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)?;
        socket.set_only_v6(false)?;
        socket.set_reuse_address(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&SocketAddr::from(([0u16; 8], port)).into())?;
        socket.listen(128)?;
        tokio::net::TcpListener::from_std(socket.into())
    };
    both().or_else(|_| {
        let socket = std::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))?;
        socket.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(socket)
    })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    health: watch::Receiver<ServiceHealth>,
    proxy_health: watch::Receiver<ProxyHealth>,
) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let response = health.borrow().response(proxy_health.borrow().healthy());
        tokio::spawn(async move {
            // Read the request head (best effort), then answer whatever was asked.
            let mut buf = [0u8; 2048];
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn.read(&mut buf)).await;
            let _ = conn.write_all(response.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_in_kube_proxy_shape() {
        let h = ServiceHealth { namespace: "ns".into(), name: "web".into(), local_endpoints: 2 };
        let r = h.response(true);
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("\r\nX-Load-Balancing-Endpoint-Weight: 2\r\n"), "{r}");
        assert!(r.ends_with(
            "{\"service\":{\"namespace\":\"ns\",\"name\":\"web\"},\"localEndpoints\":2,\"serviceProxyHealthy\":true}"
        ));
        let unhealthy = h.response(false);
        assert!(unhealthy.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{unhealthy}");
        assert!(unhealthy.ends_with("\"localEndpoints\":2,\"serviceProxyHealthy\":false}"), "{unhealthy}");
        let none = ServiceHealth { local_endpoints: 0, ..h };
        assert!(none.response(true).starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
    }
}
