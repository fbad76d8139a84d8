//! Multi-Cluster Services at a size: one Service exported by three clusters (each its
//! own API server speaking list/watch), `--mcs-endpoints` endpoints in all, in slices of
//! 100 as Kubernetes' EndpointSlice controller cuts them; the control plane is the MCS
//! controller. Measured at a real node agent of one cluster (every node of a cluster is
//! sent the same view of an import): from the exports to the import's endpoints all in
//! the node's kernel, and from each endpoint change in an EndpointSlice of any of the
//! three clusters to the kernel committing it.

use std::time::{Duration, Instant};

use super::measure::*;
use super::Args;
use crate::harness::fake_apiserver::{FakeApiServer, Kind};
use crate::harness::kernel_rules::{tcp_cluster_ips, Programmed};
use crate::harness::percentile;
use crate::harness::topology::{node_yaml, sock, ProxyBackend, Topology, NODE_NAME};
use serde_json::json;

const CLUSTERS: [&str; 3] = ["east", "west", "south"];
const PER_SLICE: usize = 100;

/// Service shop/web, its `count` endpoints (the `generation`-th set) in slices of
/// [`PER_SLICE`], and its ServiceExport, of the `index`-th cluster.
fn exported(index: usize, count: usize, generation: usize) -> String {
    let mut yaml = String::from(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n\
         spec: {clusterIP: 10.96.0.10, ports: [{name: http, protocol: TCP, port: 80}]}\n---\n\
         apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: web, namespace: shop}\n---\n",
    );
    for (slice, start) in (0..count).step_by(PER_SLICE).enumerate() {
        yaml.push_str(&slice_yaml(index, slice, start..count.min(start + PER_SLICE), generation));
    }
    yaml
}

/// Slice `slice` of the `index`-th cluster's web, with endpoints `range`; the last one's
/// address moves with `generation`.
fn slice_yaml(index: usize, slice: usize, range: std::ops::Range<usize>, generation: usize) -> String {
    let last = range.end.saturating_sub(1);
    let endpoints: Vec<String> = range
        .map(|i| {
            // The moved endpoint goes to 10.x.200+.y, which no other endpoint has.
            let (third, fourth) = if i == last && generation > 0 {
                (200 + generation / 250 % 50, generation % 250)
            } else {
                (i / 250, i % 250)
            };
            format!("{{addresses: [10.{}.{third}.{}]}}", 100 + index, fourth + 1)
        })
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: web-{slice}, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\n\
         addressType: IPv4\nports: [{{name: http, protocol: TCP, port: 8080}}]\nendpoints: [{}]\n---\n",
        endpoints.join(", ")
    )
}

/// How many endpoints the `index`-th cluster has of `total`.
fn share(index: usize, total: usize) -> usize {
    total / CLUSTERS.len() + usize::from(index < total % CLUSTERS.len())
}

/// The endpoints the node's kernel DNATs `vip`:80 to (nft's own listing).
fn kernel_endpoints(t: &Topology, vip: &str) -> usize {
    match tcp_cluster_ips(&t.node, ProxyBackend::Nftables).get(&format!("{vip}:80")) {
        Some(Programmed::Whole(endpoints)) => endpoints.len(),
        _ => 0,
    }
}

pub fn mcs_latency(a: &Args) -> serde_json::Value {
    let total = a.mcs_endpoints;
    println!(
        "\n== an MCS export across {} clusters: one Service, {total} endpoints in slices of {PER_SLICE}, {} endpoint changes (at a node of {})",
        CLUSTERS.len(),
        a.node_changes,
        CLUSTERS[0]
    );
    let t = Topology::new(1);
    let apis: Vec<FakeApiServer> = (0..CLUSTERS.len())
        .map(|i| FakeApiServer::start(&t.node, sock("127.0.0.1", 16443 + i as u16)))
        .collect();
    apis[0].apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    let mut sources = Vec::new();
    for (i, api) in apis.iter().enumerate() {
        api.install_mcs_crds();
        api.apply_yaml(&exported(i, share(i, total), 0));
        let kubeconfig = t.dir.path().join(format!("{}.kubeconfig", CLUSTERS[i]));
        api.write_kubeconfig(&kubeconfig);
        sources.push(format!("{}=kubeconfig:{}", CLUSTERS[i], kubeconfig.display()));
    }
    let started = Instant::now();
    let _cp = t.start_control_plane_from(&sources, &["--clusterset-cidr=10.200.0.0/16"]);
    let dp = t.start_dataplane_with(ProxyBackend::Nftables, &[]);
    let (written, vip) = crate::wait_for("the ServiceImports written", Duration::from_secs(300), || {
        let ips: Vec<String> = (apis.iter())
            .filter_map(|api| {
                api.object(Kind::ServiceImport, "shop", "web")?["spec"]["ips"][0].as_str().map(str::to_owned)
            })
            .collect();
        (ips.len() == apis.len()).then(|| (started.elapsed(), ips[0].clone()))
    });
    let programmed = crate::wait_for(
        "every endpoint of the import in the node's kernel",
        Duration::from_secs(300),
        || {
            exited_before(&dp, "the import programmed");
            (kernel_endpoints(&t, &vip) == total).then(|| started.elapsed())
        },
    );
    println!(
        "control plane started → ServiceImports written in the 3 clusters: {} ms; → all {total} endpoints in the node's kernel: {} ms",
        ms(written),
        ms(programmed)
    );
    let mut latencies = Vec::new();
    for change in 1..=a.node_changes {
        let index = change % CLUSTERS.len();
        let count = share(index, total);
        let before = service_deltas(&dp.log).len();
        std::thread::sleep(Duration::from_millis(100));
        let last_slice = (count - 1) / PER_SLICE;
        let start = last_slice * PER_SLICE;
        let at = unix_now();
        apis[index].apply_yaml(&slice_yaml(index, last_slice, start..count, change));
        let event = crate::wait_for("the change in the node's kernel", Duration::from_secs(120), || {
            exited_before(&dp, "the change applied");
            service_deltas(&dp.log).into_iter().skip(before).find(|e| e["resources"].as_u64() > Some(0))
        });
        latencies.push(committed_after(&event, at));
    }
    latencies.sort();
    let (p50, p99, max) = (
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
    );
    println!(
        "an endpoint changed in one cluster's EndpointSlice → the node's kernel committed it, over {} changes: p50 {} ms, p99 {} ms, max {} ms",
        latencies.len(),
        ms(p50),
        ms(p99),
        ms(max)
    );
    json!({
        "clusters": CLUSTERS.len(), "endpoints": total, "endpoints_per_slice": PER_SLICE,
        "changes": latencies.len(),
        "imports_written_ms": ms(written), "all_endpoints_programmed_ms": ms(programmed),
        "change_to_kernel_p50_ms": ms(p50), "change_to_kernel_p99_ms": ms(p99), "change_to_kernel_max_ms": ms(max),
    })
}
