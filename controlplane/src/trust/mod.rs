//! Who is calling. A node's stream is served only the views of the node it proved to be
//! — by its client certificate (Subject CN `system:node:NAME`, else its first DNS SAN) or
//! by a ServiceAccount token bound to it (TokenReview) — whatever `node.id` it sends. The
//! admin API answers clients whose certificate carries an `--admin-identity`, or, without
//! TLS, loopback clients only. Health and reflection stay open.

pub mod connection;
pub mod listener;
pub mod review_cache;

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Status};

use crate::metrics::ControlPlaneMetrics;
use connection::{ConnectionCloser, ConnectionInfo};

/// What a caller proved about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A node, by its client certificate.
    Certificate(String),
    /// A node, by a ServiceAccount token bound to it.
    Token(String),
    /// Nothing (plaintext, no token): the node is who its `node.id` says.
    Anonymous,
}

impl Caller {
    /// The node it proved to be, and how.
    pub fn node(&self) -> Option<(&str, &'static str)> {
        match self {
            Caller::Certificate(n) => Some((n, "client certificate")),
            Caller::Token(n) => Some((n, "ServiceAccount token")),
            Caller::Anonymous => None,
        }
    }
}

/// Checks a ServiceAccount token against the cluster(s) it may come from.
#[tonic::async_trait]
pub trait TokenReviewer: Send + Sync {
    /// The node `token` is bound to, if it is valid for `audience`; else why not.
    async fn node_of(&self, token: &str, audience: &str) -> Result<String, String>;
}

/// Where a request comes from.
#[derive(Debug, Default)]
pub struct Peer {
    pub addr: Option<SocketAddr>,
    /// Its client certificates (TLS only).
    pub certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    /// What closes its connection (connections of `--listen`; none in tests that make
    /// requests by hand).
    pub closer: Option<ConnectionCloser>,
}

/// The peer of a request, whether the port speaks TLS or not.
pub fn peer(extensions: &http::Extensions) -> Peer {
    if let Some(tls) = extensions.get::<ConnectionInfo<TlsConnectInfo<TcpConnectInfo>>>() {
        let transport = &tls.transport;
        return Peer {
            addr: transport.get_ref().remote_addr(),
            certs: transport.peer_certs(),
            closer: Some(tls.closer.clone()),
        };
    }
    if let Some(tcp) = extensions.get::<ConnectionInfo<TcpConnectInfo>>() {
        return Peer { addr: tcp.transport.remote_addr(), certs: None, closer: Some(tcp.closer.clone()) };
    }
    Peer::default()
}

/// The control plane's rules of who may do what.
pub struct Trust {
    /// The port speaks TLS: a node must prove who it is.
    tls: bool,
    reviewer: Option<Arc<dyn TokenReviewer>>,
    audience: String,
    admins: Vec<String>,
    metrics: Arc<ControlPlaneMetrics>,
}

impl Trust {
    pub fn new(
        tls: bool,
        reviewer: Option<Arc<dyn TokenReviewer>>,
        audience: String,
        admins: Vec<String>,
        metrics: Arc<ControlPlaneMetrics>,
    ) -> Self {
        Trust { tls, reviewer, audience, admins, metrics }
    }

    /// Plaintext, nothing checked (tests of the stream logic).
    pub fn open(metrics: Arc<ControlPlaneMetrics>) -> Self {
        Trust::new(false, None, String::new(), Vec::new(), metrics)
    }

    fn refuse(&self, reason: &'static str, status: Status) -> Status {
        self.metrics.refused_streams.get_or_create(&ControlPlaneMetrics::reason(reason)).inc();
        status
    }

    /// Who a stream's caller is: its certificate's node, else its token's, else (TLS) no one.
    pub async fn identify(
        &self,
        certs: Option<&[CertificateDer<'static>]>,
        authorization: Option<&str>,
    ) -> Result<Caller, Status> {
        if let Some(leaf) = certs.and_then(<[_]>::first) {
            return match kpx_proto::tls::node_identity(leaf) {
                Some(node) => Ok(Caller::Certificate(node)),
                None => Err(self.refuse(
                    "certificate_names_no_node",
                    Status::unauthenticated(
                        "the client certificate names no node (Subject CN system:node:NAME, or a DNS SAN)",
                    ),
                )),
            };
        }
        if let Some(value) = authorization {
            let Some(token) = value.strip_prefix("Bearer ").map(str::trim).filter(|t| !t.is_empty()) else {
                return Err(self.refuse(
                    "bad_token",
                    Status::unauthenticated("authorization: expected \"Bearer <token>\""),
                ));
            };
            let Some(reviewer) = &self.reviewer else {
                return Err(self.refuse(
                    "bad_token",
                    Status::unauthenticated(
                        "a ServiceAccount token was sent, but no Kubernetes source can review it",
                    ),
                ));
            };
            return match reviewer.node_of(token, &self.audience).await {
                Ok(node) => Ok(Caller::Token(node)),
                Err(reason) => {
                    Err(self.refuse("bad_token", Status::unauthenticated(format!("token refused: {reason}"))))
                }
            };
        }
        if self.tls {
            return Err(self.refuse(
                "no_credentials",
                Status::unauthenticated(
                    "no client certificate and no ServiceAccount token: the control plane serves a node only once it knows which",
                ),
            ));
        }
        Ok(Caller::Anonymous)
    }

    /// Whether a request may use the admin API.
    pub fn admit_admin(&self, request: &Request<()>) -> Result<(), Status> {
        let peer = peer(request.extensions());
        self.admit(peer.addr, peer.certs.as_deref().map(Vec::as_slice))
    }

    /// Whether a caller at `peer` with `certs` may use the admin API.
    fn admit(
        &self,
        peer: Option<SocketAddr>,
        certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<(), Status> {
        let refused = |message: String| {
            self.metrics.refused_streams.get_or_create(&ControlPlaneMetrics::reason("admin")).inc();
            tracing::warn!(?peer, reason = message, "admin call refused");
            Err(Status::permission_denied(message))
        };
        if !self.tls {
            return match peer {
                Some(p) if p.ip().is_loopback() => Ok(()),
                _ => refused("without TLS the admin API answers loopback clients only".into()),
            };
        }
        let names = certs.and_then(<[_]>::first).map(|leaf| kpx_proto::tls::names(leaf)).unwrap_or_default();
        if names.iter().any(|n| self.admins.contains(n)) {
            return Ok(());
        }
        if names.is_empty() {
            return refused("the admin API needs a client certificate carrying an --admin-identity".into());
        }
        refused(format!(
            "the admin API needs a client certificate carrying an --admin-identity; this one carries {}",
            names.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair};

    fn cert(cn: &str, sans: &[&str]) -> Vec<CertificateDer<'static>> {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().expect("key");
        vec![params.self_signed(&key).expect("cert").der().clone()]
    }

    struct Reviews;

    #[tonic::async_trait]
    impl TokenReviewer for Reviews {
        async fn node_of(&self, token: &str, audience: &str) -> Result<String, String> {
            match (token, audience) {
                ("good", "kpx") => Ok("node-a".into()),
                (_, "kpx") => Err("token has expired".into()),
                _ => Err("wrong audience".into()),
            }
        }
    }

    fn trust(tls: bool) -> (Trust, Arc<ControlPlaneMetrics>) {
        let metrics = Arc::new(ControlPlaneMetrics::default());
        let t = Trust::new(
            tls,
            Some(Arc::new(Reviews)),
            "kpx".into(),
            vec!["kpx-admin".into()],
            Arc::clone(&metrics),
        );
        (t, metrics)
    }

    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(f)
    }

    #[test]
    fn a_stream_is_its_certificates_node_else_its_tokens_else_refused_over_tls() {
        let (t, metrics) = trust(true);
        let kubelet = cert("system:node:node-a", &[]);
        assert_eq!(
            block(t.identify(Some(&kubelet), None)).expect("cert"),
            Caller::Certificate("node-a".into())
        );
        assert_eq!(
            block(t.identify(None, Some("Bearer good"))).expect("token"),
            Caller::Token("node-a".into())
        );
        let err = block(t.identify(None, Some("Bearer old"))).expect_err("refused");
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(err.message().contains("token has expired"), "{}", err.message());
        assert!(block(t.identify(None, Some("Basic abc"))).is_err());
        let err = block(t.identify(None, None)).expect_err("no credentials");
        assert!(
            err.message().contains("no client certificate and no ServiceAccount token"),
            "{}",
            err.message()
        );
        assert!(block(t.identify(Some(&cert("operator", &[])), None)).is_err(), "names no node");
        let text = metrics.render();
        assert!(text.contains("kpx_refused_total{reason=\"no_credentials\"} 1"), "{text}");
        assert!(text.contains("kpx_refused_total{reason=\"bad_token\"} 2"), "{text}");
        let (plain, _) = trust(false);
        assert_eq!(block(plain.identify(None, None)).expect("plaintext"), Caller::Anonymous);
    }

    #[test]
    fn the_admin_api_needs_an_admin_certificate_or_loopback_plaintext() {
        let (tls, _) = trust(true);
        let remote: SocketAddr = "10.0.0.9:5000".parse().expect("addr");
        let local: SocketAddr = "127.0.0.1:5000".parse().expect("addr");
        tls.admit(Some(remote), Some(&cert("kpx-admin", &[]))).expect("admin by CN");
        tls.admit(Some(remote), Some(&cert("x", &["kpx-admin"]))).expect("admin by DNS SAN");
        let err =
            tls.admit(Some(local), Some(&cert("system:node:node-a", &[]))).expect_err("a node is no admin");
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.message().contains("system:node:node-a"), "{}", err.message());
        assert!(tls.admit(Some(local), None).is_err(), "TLS without a certificate");
        let (plain, _) = trust(false);
        plain.admit(Some(local), None).expect("loopback plaintext");
        assert_eq!(
            plain.admit(Some(remote), None).expect_err("remote").code(),
            tonic::Code::PermissionDenied
        );
    }
}
