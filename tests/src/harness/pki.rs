//! Certificates for the trust tests, made with rcgen: a CA, server and client
//! certificates (kubelet-style `system:node:NAME`, admin, expired ones, ones of another
//! CA), written as PEM files.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};

/// A CA that issues certificates into a folder.
pub struct Pki {
    dir: PathBuf,
    name: String,
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// When a certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From yesterday for a year.
    Current,
    /// It ended yesterday.
    Expired,
}

impl Pki {
    /// A new CA named `name`; its certificate is `<dir>/<name>-ca.crt`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("CA");
        let pki = Pki { dir: dir.to_owned(), name: name.to_owned(), cert, key };
        std::fs::write(pki.ca(), pki.cert.pem()).expect("write CA");
        pki
    }

    /// The CA certificate's file.
    pub fn ca(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.crt", self.name))
    }

    /// Issues a certificate with Subject CN `cn`, DNS SANs `dns` and IP SANs `ips`, written
    /// to `<dir>/<file>.crt` and `.key`.
    pub fn issue(&self, file: &str, cn: &str, dns: &[&str], ips: &[IpAddr], validity: Validity) -> Issued {
        let mut params =
            CertificateParams::new(dns.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>()).expect("params");
        params.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name.push(DnType::CommonName, cn);
        let now = std::time::SystemTime::now();
        let day = std::time::Duration::from_secs(86_400);
        let (from, to) = match validity {
            Validity::Current => (now - day, now + 365 * day),
            Validity::Expired => (now - 30 * day, now - day),
        };
        params.not_before = from.into();
        params.not_after = to.into();
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("sign");
        let issued =
            Issued { cert: self.dir.join(format!("{file}.crt")), key: self.dir.join(format!("{file}.key")) };
        std::fs::write(&issued.cert, cert.pem()).expect("write cert");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write key");
        issued
    }

    /// A certificate for a server at 127.0.0.1 (and `localhost`).
    pub fn server(&self, file: &str) -> Issued {
        self.issue(
            file,
            "kpx-controlplane",
            &["localhost"],
            &["127.0.0.1".parse().expect("ip")],
            Validity::Current,
        )
    }
}
