//! TLS for both gRPC ends, through rustls (no OpenSSL): PEM files read with errors that
//! name the file, a server configuration that follows its files as they are rotated
//! (cert-manager, kubelet), and the node identity a client certificate carries.
//!
//! Identity rule (shared/DESIGN.md): the Subject CN `system:node:NAME` of the leaf
//! certificate (kubelet's client certificates qualify), else its first DNS SAN.

use crate::sync::Locked as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// A TLS file or configuration that cannot be used; the message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: cannot read: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: no PEM certificate in it", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: not a PEM private key: {reason}", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error("{}: a certificate in it is not usable as a CA: {reason}", path.display())]
    BadCa { path: PathBuf, reason: String },
    #[error("{} with {}: {reason}", cert.display(), key.display())]
    Mismatch { cert: PathBuf, key: PathBuf, reason: String },
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

/// Every certificate of a PEM file, in order.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path)?;
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&bytes).filter_map(Result::ok).collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_owned() });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| TlsError::BadKey { path: path.to_owned(), reason: e.to_string() })
}

/// The CA certificates of a PEM file, as trust anchors.
pub fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certificates(path)? {
        store.add(cert).map_err(|e| TlsError::BadCa { path: path.to_owned(), reason: e.to_string() })?;
    }
    Ok(store)
}

/// The files of one end: its certificate chain and key, and the CA it trusts for the
/// other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TlsFiles {
    fn paths(&self) -> [&Path; 3] {
        [&self.cert, &self.key, &self.ca]
    }

    /// Size and modification time of each file: what tells that one was replaced.
    fn fingerprint(&self) -> Vec<Option<(u64, SystemTime)>> {
        self.paths()
            .iter()
            .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.len(), m.modified().ok()?))))
            .collect()
    }

    /// A TLS 1.3 server configuration that checks client certificates against the CA.
    pub fn server_config(&self) -> Result<ServerConfig, TlsError> {
        let roots = Arc::new(roots(&self.ca)?);
        // A client without a certificate is let through TLS (it may carry a ServiceAccount
        // token instead); what it may do is decided above TLS. One that presents a
        // certificate must present a valid one.
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, Arc::new(provider()))
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::BadCa { path: self.ca.clone(), reason: e.to_string() })?;
        let mismatch = |e: rustls::Error| TlsError::Mismatch {
            cert: self.cert.clone(),
            key: self.key.clone(),
            reason: e.to_string(),
        };
        let mut config = ServerConfig::builder_with_provider(Arc::new(provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(mismatch)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certificates(&self.cert)?, private_key(&self.key)?)
            .map_err(mismatch)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// A server configuration that follows its files: at most once a second it looks at
/// them, and when one was replaced it builds a new configuration that the next
/// connections use (open ones keep theirs). A replaced file that cannot be used is
/// logged and the last good configuration kept.
pub struct ReloadingServerConfig {
    files: TlsFiles,
    state: Mutex<Reload>,
}

struct Reload {
    config: Arc<ServerConfig>,
    fingerprint: Vec<Option<(u64, SystemTime)>>,
    checked: Instant,
}

/// How often the files are looked at.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

impl ReloadingServerConfig {
    /// Loads the files; an error names the one that cannot be used.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let config = Arc::new(files.server_config()?);
        let fingerprint = files.fingerprint();
        Ok(ReloadingServerConfig {
            files,
            state: Mutex::new(Reload { config, fingerprint, checked: Instant::now() }),
        })
    }

    /// The configuration for the next connection.
    pub fn current(&self) -> Arc<ServerConfig> {
        let mut state = self.state.locked();
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let fingerprint = self.files.fingerprint();
            if fingerprint != state.fingerprint {
                match self.files.server_config() {
                    Ok(config) => {
                        tracing::info!(cert = %self.files.cert.display(), "TLS files changed: new connections use them");
                        state.config = Arc::new(config);
                        state.fingerprint = fingerprint;
                    }
                    // A rotation may be half written: keep the last good one, look again.
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS files changed but cannot be used yet; keeping the last good ones")
                    }
                }
            }
        }
        Arc::clone(&state.config)
    }
}

/// The node name a client certificate (DER, the leaf) claims: Subject CN
/// `system:node:NAME`, else its first DNS SAN.
pub fn node_identity(leaf: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
    let from_cn = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .find_map(|cn| cn.strip_prefix("system:node:"))
        .filter(|name| !name.is_empty())
        .map(str::to_owned);
    from_cn.or_else(|| {
        let san = cert.subject_alternative_name().ok().flatten()?;
        san.value.general_names.iter().find_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            _ => None,
        })
    })
}

/// Every identity a certificate carries for admin checks: its Subject CNs and DNS SANs.
pub fn names(leaf: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else { return Vec::new() };
    let mut out: Vec<String> =
        cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_owned).collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                out.push((*dns).to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

    struct Ca {
        cert: rcgen::Certificate,
        key: KeyPair,
    }

    fn ca() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, "kpx test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("key");
        Ca { cert: params.self_signed(&key).expect("ca"), key }
    }

    fn leaf(ca: &Ca, cn: &str, sans: &[&str]) -> (rcgen::Certificate, KeyPair) {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().expect("key");
        (params.signed_by(&key, &ca.cert, &ca.key).expect("leaf"), key)
    }

    #[test]
    fn the_identity_is_the_node_cn_else_the_first_dns_san() {
        let ca = ca();
        let (kubelet, _) = leaf(&ca, "system:node:node-a", &["other.example"]);
        assert_eq!(node_identity(kubelet.der()).as_deref(), Some("node-a"));
        let (by_san, _) = leaf(&ca, "some operator", &["node-b", "node-b.example"]);
        assert_eq!(node_identity(by_san.der()).as_deref(), Some("node-b"));
        let (nothing, _) = leaf(&ca, "system:node:", &[]);
        assert_eq!(node_identity(nothing.der()), None);
        assert_eq!(node_identity(b"not a certificate"), None);
        assert_eq!(names(kubelet.der()), ["system:node:node-a", "other.example"]);
    }

    #[test]
    fn files_that_cannot_be_used_are_named_and_a_replaced_certificate_is_taken_up() {
        let dir = tempfile::tempdir().expect("tmp");
        let ca = ca();
        let (server, key) = leaf(&ca, "kpx-controlplane", &["localhost"]);
        let files = TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            ca: dir.path().join("ca.crt"),
        };
        std::fs::write(&files.ca, ca.cert.pem()).expect("write");
        std::fs::write(&files.cert, server.pem()).expect("write");
        let err = ReloadingServerConfig::load(files.clone()).err().expect("no key yet").to_string();
        assert!(err.contains("tls.key") && err.contains("cannot read"), "{err}");
        std::fs::write(&files.key, "not a key").expect("write");
        let err = ReloadingServerConfig::load(files.clone()).err().expect("bad key").to_string();
        assert!(err.contains("tls.key") && err.contains("not a PEM private key"), "{err}");
        let (_, other_key) = leaf(&ca, "x", &[]);
        std::fs::write(&files.key, other_key.serialize_pem()).expect("write");
        let err = ReloadingServerConfig::load(files.clone()).err().expect("mismatch").to_string();
        assert!(err.contains("tls.crt with") && err.contains("tls.key"), "{err}");
        std::fs::write(&files.key, key.serialize_pem()).expect("write");
        std::fs::write(&files.ca, "garbage").expect("write");
        let err = ReloadingServerConfig::load(files.clone()).err().expect("no CA").to_string();
        assert!(err.contains("ca.crt") && err.contains("no PEM certificate"), "{err}");
        std::fs::write(&files.ca, ca.cert.pem()).expect("write");
        let reloading = ReloadingServerConfig::load(files.clone()).expect("valid");
        let first = reloading.current();
        std::fs::write(&files.cert, "half written").expect("write");
        reloading.state.locked().checked -= RELOAD_CHECK;
        assert!(Arc::ptr_eq(&first, &reloading.current()), "an unusable replacement keeps the last good one");
        let (renewed, renewed_key) = leaf(&ca, "kpx-controlplane", &["localhost", "renewed"]);
        std::fs::write(&files.key, renewed_key.serialize_pem()).expect("write");
        std::fs::write(&files.cert, renewed.pem()).expect("write");
        reloading.state.locked().checked -= RELOAD_CHECK;
        assert!(!Arc::ptr_eq(&first, &reloading.current()), "a renewed pair is taken up");
    }
}
