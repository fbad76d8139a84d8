//! How the agent reaches its control plane: the URL, TLS (the CA that signs the control
//! plane's certificate and, for mutual TLS, this node's certificate and key) and, for
//! clusters without a per-node PKI, a projected ServiceAccount token. The files are read
//! again for every connection, so certificates and tokens that kubelet or cert-manager
//! rotate are picked up by the next connection while an open stream keeps its own.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// This node's client certificate and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// TLS towards the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA the control plane's certificate must chain to.
    pub ca: PathBuf,
    /// Mutual TLS: who this node is.
    pub identity: Option<ClientIdentity>,
}

/// Everything needed to open a stream to the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlane {
    pub url: String,
    pub tls: Option<ClientTls>,
    /// A file holding a ServiceAccount token, sent as `authorization: Bearer …`.
    pub token_file: Option<PathBuf>,
    /// An HTTP/2 PING this often, the connection given up when one is not answered within
    /// as long (a dead link or a vanished control plane is noticed within twice this);
    /// also the bound on connecting.
    pub keepalive: Duration,
}

/// The default of [`ControlPlane::keepalive`]: a dead stream is noticed within 20 s.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(10);

/// A connection that could not be made; the message names the file or the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{}: cannot read: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: the token file is empty", path.display())]
    EmptyToken { path: PathBuf },
    #[error("{0}")]
    Url(String),
    #[error("{0}")]
    Transport(#[from] tonic::transport::Error),
}

fn read(path: &PathBuf) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|source| ConnectError::Read { path: path.clone(), source })
}

impl ControlPlane {
    /// A plaintext control plane at `url`.
    pub fn plaintext(url: impl Into<String>) -> Self {
        ControlPlane { url: url.into(), tls: None, token_file: None, keepalive: DEFAULT_KEEPALIVE }
    }

    /// Opens a connection, with the TLS files as they are now, to `address` instead of the
    /// URL's host (`None`: the URL as written), the control plane's certificate still
    /// checked against the URL's host.
    pub async fn connect_via(&self, address: Option<SocketAddr>) -> Result<Channel, ConnectError> {
        let url = match address {
            None => self.url.clone(),
            Some(address) => {
                let uri: tonic::codegen::http::Uri =
                    self.url.parse().map_err(|e: tonic::codegen::http::uri::InvalidUri| {
                        ConnectError::Url(format!("{}: {e}", self.url))
                    })?;
                format!("{}://{address}", uri.scheme_str().unwrap_or("http"))
            }
        };
        let mut endpoint = Endpoint::from_shared(url)?
            .connect_timeout(self.keepalive)
            .http2_keep_alive_interval(self.keepalive)
            .keep_alive_timeout(self.keepalive)
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
            if address.is_some() {
                config = config.domain_name(self.host());
            }
            if let Some(identity) = &tls.identity {
                config = config.identity(Identity::from_pem(read(&identity.cert)?, read(&identity.key)?));
            }
            endpoint = endpoint.tls_config(config)?;
        }
        Ok(endpoint.connect().await?)
    }

    /// The URL's host, as its certificate must name it.
    pub fn host(&self) -> String {
        let uri: Option<tonic::codegen::http::Uri> = self.url.parse().ok();
        uri.and_then(|u| u.host().map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned()))
            .unwrap_or_default()
    }

    /// The `authorization` header value for the next stream (`None` without a token file).
    pub fn bearer(&self) -> Result<Option<String>, ConnectError> {
        let Some(path) = &self.token_file else { return Ok(None) };
        let token = String::from_utf8_lossy(&read(path)?).trim().to_owned();
        if token.is_empty() {
            return Err(ConnectError::EmptyToken { path: path.clone() });
        }
        Ok(Some(format!("Bearer {token}")))
    }
}
