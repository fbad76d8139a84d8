//! The node agent's few requests to the Kubernetes API server, made to its real address
//! and never through a Service kpx programs: where the control plane's pods are and which
//! install it is ([`ApiServer::control_plane`]), and Events on the agent's Node
//! ([`ApiServer::post_event`]). One HTTP/1.1 request per connection: these are rare (at
//! start, when no known address of the control plane answers, when an outage begins and
//! ends), so nothing is kept open.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// The name the API server's certificate is checked against when it is dialled by address:
/// every kube-apiserver serving certificate carries it (it is the `kubernetes` Service's).
pub const IN_CLUSTER_NAME: &str = "kubernetes.default.svc";

/// How long one request may take, connecting included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How the agent proves who it is and checks the API server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApiCredentials {
    /// A ServiceAccount token (for the API server's audience), read for every request.
    pub token_file: Option<PathBuf>,
    /// The cluster's CA (a pod's `ca.crt`); without it, only `http://` addresses are used.
    pub ca: Option<PathBuf>,
}

/// One address of the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServer {
    pub https: bool,
    /// Host (a name or an address) and port.
    pub host: String,
    pub port: u16,
    /// The name its certificate must carry.
    pub server_name: String,
    pub credentials: ApiCredentials,
}

/// A request that failed; the message says where and why.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{}: cannot read: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Tls(String),
    #[error("request: {0}")]
    Request(String),
    #[error("connect {address}: {source}")]
    Connect { address: String, source: std::io::Error },
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("{method} {path}: {status} {message}")]
    Status { method: &'static str, path: String, status: u16, message: String },
    #[error("{path}: not the JSON expected: {reason}")]
    Decode { path: String, reason: String },
    #[error("no answer within {}s", REQUEST_TIMEOUT.as_secs())]
    Timeout,
}

/// The control plane's Service as the API server knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneService {
    /// The Service's UID: a new install (uninstalled and installed again) has a new one.
    pub uid: String,
    /// Its ready endpoints' addresses for the port asked about.
    pub addresses: Vec<SocketAddr>,
}

/// A Service by namespace, name and port (the port of a URL that names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
    }
}

impl ApiServer {
    /// The API server at `url` (`https://HOST:PORT`, or `http://` without TLS).
    pub fn from_url(url: &str, credentials: ApiCredentials) -> Result<ApiServer, String> {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err("expected https:// or http://".into()),
        };
        let host = uri.host().ok_or("no host")?.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let server_name =
            if host.parse::<std::net::IpAddr>().is_ok() { IN_CLUSTER_NAME.to_owned() } else { host.clone() };
        Ok(ApiServer { https, host, port, server_name, credentials })
    }

    /// The API server at an address learned from the `kubernetes` Service's endpoints.
    pub fn at(address: SocketAddr, credentials: ApiCredentials) -> ApiServer {
        ApiServer {
            https: true,
            host: address.ip().to_string(),
            port: address.port(),
            server_name: IN_CLUSTER_NAME.to_owned(),
            credentials,
        }
    }

    /// `https://HOST:PORT`, as logs show it.
    pub fn url(&self) -> String {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        format!("{}://{host}:{}", if self.https { "https" } else { "http" }, self.port)
    }

    /// The Service's UID and its ready endpoints for `service.port`.
    pub async fn control_plane(&self, service: &ServiceRef) -> Result<ControlPlaneService, ApiError> {
        let path = format!("/api/v1/namespaces/{}/services/{}", service.namespace, service.name);
        let object = self.request("GET", &path, None).await?;
        let decode = |reason: &str| ApiError::Decode { path: path.clone(), reason: reason.to_owned() };
        let uid = object["metadata"]["uid"].as_str().ok_or_else(|| decode("no metadata.uid"))?.to_owned();
        let ports = object["spec"]["ports"].as_array().ok_or_else(|| decode("no spec.ports"))?;
        let port = ports
            .iter()
            .find(|p| p["port"].as_u64() == Some(u64::from(service.port)))
            .ok_or_else(|| decode(&format!("no port {}", service.port)))?;
        let port_name = port["name"].as_str().unwrap_or_default();
        let slices_path = format!(
            "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{}",
            service.namespace, service.name
        );
        let slices = self.request("GET", &slices_path, None).await?;
        Ok(ControlPlaneService { uid, addresses: ready_addresses(&slices, port_name) })
    }

    /// Creates an Event (core/v1) in the `default` namespace, where Node events go.
    pub async fn post_event(&self, event: &Value) -> Result<(), ApiError> {
        self.request("POST", "/api/v1/namespaces/default/events", Some(event.to_string())).await.map(|_| ())
    }

    async fn request(
        &self,
        method: &'static str,
        path: &str,
        body: Option<String>,
    ) -> Result<Value, ApiError> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(method, path, body))
            .await
            .map_err(|_| ApiError::Timeout)?
    }

    async fn exchange(
        &self,
        method: &'static str,
        path: &str,
        body: Option<String>,
    ) -> Result<Value, ApiError> {
        let address = format!("{}:{}", self.host, self.port);
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| ApiError::Connect { address: address.clone(), source })?;
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, address.as_str())
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::USER_AGENT, concat!("kpx-dataplane/", env!("CARGO_PKG_VERSION")));
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if let Some(path) = &self.credentials.token_file {
            let token = std::fs::read_to_string(path)
                .map_err(|source| ApiError::Read { path: path.clone(), source })?;
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {}", token.trim()));
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ApiError::Request(e.to_string()))?;
        let response = if self.https {
            let tls = self.tls_connector()?;
            let name = rustls::pki_types::ServerName::try_from(self.server_name.clone())
                .map_err(|e| ApiError::Tls(format!("{:?}: {e}", self.server_name)))?;
            let stream = tls.connect(name, tcp).await.map_err(|e| {
                ApiError::Tls(format!("TLS with {address} (expected {:?}): {e}", self.server_name))
            })?;
            send(stream, request).await?
        } else {
            send(tcp, request).await?
        };
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            let message = value["message"]
                .as_str()
                .map_or_else(|| String::from_utf8_lossy(&bytes).into_owned(), str::to_owned);
            return Err(ApiError::Status { method, path: path.to_owned(), status: status.as_u16(), message });
        }
        Ok(value)
    }

    fn tls_connector(&self) -> Result<tokio_rustls::TlsConnector, ApiError> {
        let ca = self.credentials.ca.as_ref().ok_or_else(|| {
            ApiError::Tls(format!("{}: no CA to check the API server with (--api-server-ca)", self.url()))
        })?;
        let roots = kpx_proto::tls::roots(ca).map_err(|e| ApiError::Tls(e.to_string()))?;
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| ApiError::Tls(e.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth();
        Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
    }
}

async fn send<S>(
    stream: S,
    request: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, ApiError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender.send_request(request).await?)
}

/// The addresses of the endpoints not known to be unready, with the port named
/// `port_name`, from an EndpointSliceList.
fn ready_addresses(slices: &Value, port_name: &str) -> Vec<SocketAddr> {
    let mut addresses = Vec::new();
    for slice in slices["items"].as_array().into_iter().flatten() {
        let Some(port) = slice["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or_default() == port_name)
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
            if endpoint["conditions"]["ready"].as_bool() == Some(false) {
                continue;
            }
            for address in endpoint["addresses"].as_array().into_iter().flatten() {
                if let Some(ip) = address.as_str().and_then(|a| a.parse().ok()) {
                    addresses.push(SocketAddr::new(ip, port));
                }
            }
        }
    }
    addresses.sort();
    addresses.dedup();
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn takes_the_named_port_of_endpoints_not_known_unready() {
        let slices = json!({"items": [
            {"ports": [{"name": "grpc", "port": 18000}, {"name": "metrics", "port": 18002}],
             "endpoints": [
                {"addresses": ["10.244.1.5"], "conditions": {"ready": true}},
                {"addresses": ["10.244.2.5"], "conditions": {"ready": false}},
                {"addresses": ["fd00::5"], "conditions": {}}]},
            {"ports": [{"name": "other", "port": 1}], "endpoints": [{"addresses": ["10.0.0.9"]}]},
        ]});
        let found: Vec<String> = ready_addresses(&slices, "grpc").iter().map(ToString::to_string).collect();
        assert_eq!(found, ["10.244.1.5:18000", "[fd00::5]:18000"]);
        assert!(ready_addresses(&json!({}), "grpc").is_empty());
    }

    #[test]
    fn an_address_is_checked_as_the_kubernetes_service_a_name_as_itself() {
        let by_ip = ApiServer::from_url("https://192.168.1.10:6443", ApiCredentials::default()).expect("url");
        assert_eq!((by_ip.server_name.as_str(), by_ip.port), (IN_CLUSTER_NAME, 6443));
        let by_name =
            ApiServer::from_url("https://api.example.test", ApiCredentials::default()).expect("url");
        assert_eq!((by_name.server_name.as_str(), by_name.port), ("api.example.test", 443));
        assert_eq!(
            ApiServer::from_url("https://[fd00::1]:6443", ApiCredentials::default()).expect("v6").url(),
            "https://[fd00::1]:6443"
        );
        assert!(ApiServer::from_url("ftp://x", ApiCredentials::default()).is_err());
    }
}
