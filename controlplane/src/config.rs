//! The control plane's command line, parsed once into typed values ([`Config`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use kpx_proto::cli::{parse_duration, LogFormat};
use kpx_proto::tls::TlsFiles;

use crate::model::ObjectKey;
use crate::source::{SourceKind, SourceSpec};

#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "kpx-controlplane",
    version,
    about = "kpx control plane: serves per-node Service views over delta xDS"
)]
pub struct Flags {
    /// Where cluster state comes from: `[NAME=]file:DIR` (a folder of manifests),
    /// `[NAME=]kubeconfig:PATH[#CONTEXT]` or `[NAME=]in-cluster` (a Kubernetes API server).
    /// Repeatable: each NAME is a cluster, the home of its own nodes.
    #[arg(long = "source", required = true, value_name = "SOURCE")]
    pub sources: Vec<SourceSpec>,
    /// The cluster's pod CIDR(s): traffic from inside them is pod traffic, not
    /// masqueraded on its way to a ClusterIP. Repeatable (one per IP family).
    /// Without it, each node uses its own podCIDRs.
    #[arg(long = "cluster-cidr", value_name = "CIDR", value_parser = cidr)]
    pub cluster_cidrs: Vec<IpNet>,
    /// How long a cluster may be unreachable (API server or folder) before its endpoints
    /// are withdrawn from the other clusters' global Services (e.g. 90s, 5m).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub cluster_grace_period: Duration,
    /// A stream whose response goes unanswered (no ACK, no NACK) this long is closed and
    /// counted (`kpx_xds_unresponsive_streams_closed_total`): a node that stopped reading
    /// its stream holds no memory or initial-sync slot beyond it. `0s`: never.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub ack_timeout: Duration,
    /// gRPC address: delta ADS, the admin API, health and reflection.
    #[arg(long, default_value = "0.0.0.0:18000")]
    pub listen: SocketAddr,
    /// Prometheus /metrics, and the probes /readyz (every source synced) and /livez.
    #[arg(long, default_value = "127.0.0.1:18002")]
    pub metrics_listen: SocketAddr,
    /// This server's certificate (PEM): with --tls-key and --tls-client-ca, --listen
    /// speaks TLS 1.3 only. Re-read when the file changes.
    #[arg(long = "tls-cert")]
    pub tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long = "tls-key")]
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) that signs node (and admin) client certificates.
    #[arg(long = "tls-client-ca")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve plaintext gRPC on a non-loopback --listen address (no authentication at all).
    #[arg(long)]
    pub insecure: bool,
    /// A client certificate name (Subject CN or DNS SAN) allowed to call the admin API
    /// over TLS. Repeatable. Without TLS the admin API answers loopback clients only.
    #[arg(long = "admin-identity", value_name = "NAME")]
    pub admin_identities: Vec<String>,
    /// The audience a node's ServiceAccount token must be bound to (TokenReview).
    #[arg(long, default_value = "kpx")]
    pub token_audience: String,
    /// Be the clusterset's Multi-Cluster Services controller: allocate ClusterSetIPs from
    /// this range and write ServiceImports and the conditions of ServiceExports to every
    /// Kubernetes source. Repeatable, one range per IP family. Without it kpx writes
    /// nothing and serves the ServiceImports another controller writes.
    #[arg(long = "clusterset-cidr", value_name = "CIDR", value_parser = cidr)]
    pub clusterset_cidrs: Vec<IpNet>,
    /// The Lease (`NAMESPACE/NAME`, in the first Kubernetes source's cluster) that elects
    /// the one replica that writes the MCS objects; every replica serves nodes.
    #[arg(long, default_value = "kube-system/kpx-controlplane-mcs", value_parser = lease)]
    pub mcs_lease: ObjectKey,
    /// Log format: human or json.
    #[arg(long, default_value = "human", value_parser = str::parse::<LogFormat>)]
    pub log_format: LogFormat,
}

/// A `--mcs-lease` value.
fn lease(text: &str) -> Result<ObjectKey, String> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(ObjectKey { namespace: namespace.into(), name: name.into() })
        }
        _ => Err(format!("{text:?} is not NAMESPACE/NAME")),
    }
}

/// A `--cluster-cidr` value; host bits are cleared, as kube-proxy does.
fn cidr(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .map(|net| net.trunc())
        .map_err(|_| format!("{text:?} is not a CIDR (e.g. 10.244.0.0/16)"))
}

/// A command line that cannot be used; the message names the flag.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--source: cluster name {0:?} given twice")]
    DuplicateCluster(String),
    #[error("{0}: needed with {1}")]
    Needs(&'static str, &'static str),
    #[error("--listen {0}: plaintext gRPC on a non-loopback address needs --insecure (or TLS: --tls-cert, --tls-key, --tls-client-ca)")]
    Plaintext(SocketAddr),
    #[error("--admin-identity needs TLS (--tls-cert, --tls-key, --tls-client-ca): without it the admin API answers loopback clients only")]
    AdminWithoutTls,
    #[error("--clusterset-cidr {0} and {1}: one range per IP family")]
    ClustersetFamilies(IpNet, IpNet),
    #[error("--clusterset-cidr needs a Kubernetes --source (kubeconfig: or in-cluster) to write ServiceImports to")]
    ClustersetWithoutApi,
}

/// kpx as the clusterset's MCS controller (`--clusterset-cidr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McsController {
    /// One range per family, IPv4 first.
    pub clusterset_cidrs: Vec<IpNet>,
    pub lease: ObjectKey,
}

/// How the gRPC port is secured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Security {
    /// TLS 1.3 with client certificates (or ServiceAccount tokens) for nodes.
    Tls(TlsFiles),
    /// Plaintext: on loopback, or on any address with `--insecure`.
    Plaintext,
}

/// Everything the control plane runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub sources: Vec<SourceSpec>,
    /// Sorted, without repeats.
    pub cluster_cidrs: Vec<IpNet>,
    pub cluster_grace_period: Duration,
    /// `None`: never.
    pub ack_timeout: Option<Duration>,
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    pub security: Security,
    pub admin_identities: Vec<String>,
    pub token_audience: String,
    /// `None`: kpx writes no MCS object.
    pub mcs: Option<McsController>,
}

impl Config {
    pub fn resolve(flags: Flags) -> Result<Config, ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        if let Some(dup) = flags.sources.iter().find(|s| !names.insert(s.cluster.as_str())) {
            return Err(ConfigError::DuplicateCluster(dup.cluster.clone()));
        }
        let security = match (flags.tls_cert, flags.tls_key, flags.tls_client_ca) {
            (Some(cert), Some(key), Some(ca)) => Security::Tls(TlsFiles { cert, key, ca }),
            (None, None, None) if flags.listen.ip().is_loopback() || flags.insecure => Security::Plaintext,
            (None, None, None) => return Err(ConfigError::Plaintext(flags.listen)),
            (None, _, _) => return Err(ConfigError::Needs("--tls-cert", "--tls-key and --tls-client-ca")),
            (Some(_), None, _) => return Err(ConfigError::Needs("--tls-key", "--tls-cert")),
            (Some(_), Some(_), None) => return Err(ConfigError::Needs("--tls-client-ca", "--tls-cert")),
        };
        if !flags.admin_identities.is_empty() && security == Security::Plaintext {
            return Err(ConfigError::AdminWithoutTls);
        }
        let mcs = match flags.clusterset_cidrs.as_slice() {
            [] => None,
            [a, b, ..] if a.addr().is_ipv4() == b.addr().is_ipv4() || flags.clusterset_cidrs.len() > 2 => {
                return Err(ConfigError::ClustersetFamilies(*a, *b));
            }
            _ if !flags.sources.iter().any(|s| matches!(s.kind, SourceKind::Kube(_))) => {
                return Err(ConfigError::ClustersetWithoutApi);
            }
            cidrs => {
                let mut clusterset_cidrs = cidrs.to_vec();
                clusterset_cidrs.sort_by_key(|c| !c.addr().is_ipv4());
                Some(McsController { clusterset_cidrs, lease: flags.mcs_lease })
            }
        };
        let mut cluster_cidrs = flags.cluster_cidrs;
        cluster_cidrs.sort();
        cluster_cidrs.dedup();
        Ok(Config {
            sources: flags.sources,
            cluster_cidrs,
            cluster_grace_period: flags.cluster_grace_period,
            ack_timeout: Some(flags.ack_timeout).filter(|d| !d.is_zero()),
            listen: flags.listen,
            metrics_listen: flags.metrics_listen,
            security,
            admin_identities: flags.admin_identities,
            token_audience: flags.token_audience,
            mcs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        let mut all = vec!["kpx-controlplane", "--source=file:/tmp"];
        all.extend(args);
        Config::resolve(Flags::try_parse_from(all).expect("parses"))
    }

    #[test]
    fn the_clusterset_cidrs_make_kpx_the_mcs_controller_of_its_kubernetes_sources() {
        assert_eq!(
            parse(&["--listen=127.0.0.1:18000"]).expect("valid").mcs,
            None,
            "no range: kpx writes nothing"
        );
        let err = parse(&["--listen=127.0.0.1:18000", "--clusterset-cidr=10.200.0.0/16"])
            .expect_err("a file source only");
        assert_eq!(err, ConfigError::ClustersetWithoutApi);
        let mut all = vec![
            "kpx-controlplane",
            "--source=kubeconfig:/k",
            "--clusterset-cidr=fd00:c5::/64",
            "--insecure",
        ];
        all.extend(["--clusterset-cidr=10.200.0.0/16", "--mcs-lease=kpx/mcs"]);
        let config = Config::resolve(Flags::try_parse_from(&all).expect("parses")).expect("valid");
        let mcs = config.mcs.expect("the controller");
        assert_eq!(mcs.clusterset_cidrs[0].to_string(), "10.200.0.0/16", "IPv4 first");
        assert_eq!(mcs.lease.to_string(), "kpx/mcs");
        all[2] = "--clusterset-cidr=10.201.0.0/16";
        let err = Config::resolve(Flags::try_parse_from(&all).expect("parses")).expect_err("two IPv4");
        assert_eq!(
            err,
            ConfigError::ClustersetFamilies(
                "10.201.0.0/16".parse().expect("net"),
                "10.200.0.0/16".parse().expect("net")
            )
        );
        let err = Flags::try_parse_from(["kpx-controlplane", "--source=file:/a", "--mcs-lease=nons"])
            .expect_err("bad");
        assert!(
            err.to_string().contains("--mcs-lease") && err.to_string().contains("NAMESPACE/NAME"),
            "{err}"
        );
    }

    #[test]
    fn cluster_cidrs_are_repeatable_and_a_bad_one_names_the_flag() {
        let c = parse(&[
            "--listen=127.0.0.1:18000",
            "--cluster-cidr=10.244.0.1/16",
            "--cluster-cidr",
            "fd00:10::/56",
        ])
        .expect("valid");
        let shown: Vec<String> = c.cluster_cidrs.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.244.0.0/16", "fd00:10::/56"]);
        let err =
            Flags::try_parse_from(["kpx-controlplane", "--source=file:/tmp", "--cluster-cidr=10.0.0.0/33"])
                .expect_err("bad CIDR");
        assert!(err.use_stderr());
        assert!(
            err.to_string().contains("--cluster-cidr") && err.to_string().contains("is not a CIDR"),
            "{err}"
        );
    }

    #[test]
    fn plaintext_off_loopback_needs_insecure_and_tls_needs_all_three_files() {
        let err = parse(&[]).expect_err("the default listen is every address");
        assert_eq!(err, ConfigError::Plaintext("0.0.0.0:18000".parse().expect("addr")));
        assert!(err.to_string().contains("--insecure"), "{err}");
        assert_eq!(parse(&["--insecure"]).expect("insecure").security, Security::Plaintext);
        assert_eq!(parse(&["--listen=[::1]:18000"]).expect("loopback").security, Security::Plaintext);
        let tls = parse(&["--tls-cert=c", "--tls-key=k", "--tls-client-ca=ca", "--admin-identity=kpx-admin"])
            .expect("tls");
        assert!(matches!(tls.security, Security::Tls(_)) && tls.admin_identities == ["kpx-admin"]);
        assert_eq!(
            parse(&["--tls-cert=c", "--tls-key=k"]).expect_err("no CA"),
            ConfigError::Needs("--tls-client-ca", "--tls-cert")
        );
        assert_eq!(
            parse(&["--tls-cert=c", "--tls-client-ca=ca"]).expect_err("no key"),
            ConfigError::Needs("--tls-key", "--tls-cert")
        );
        let err = parse(&["--tls-key=k"]).expect_err("no cert").to_string();
        assert!(err.starts_with("--tls-cert"), "{err}");
        assert_eq!(
            parse(&["--insecure", "--admin-identity=x"]).expect_err("plaintext"),
            ConfigError::AdminWithoutTls
        );
        let err = Config::resolve(
            Flags::try_parse_from([
                "kpx-controlplane",
                "--source=a=file:/x",
                "--source=a=file:/y",
                "--insecure",
            ])
            .expect("parses"),
        )
        .expect_err("twice");
        assert_eq!(err.to_string(), "--source: cluster name \"a\" given twice");
    }
}
