//! The Services and endpoints the benchmark writes as manifests.

use std::collections::BTreeMap;
use std::path::Path;

use crate::harness::topology::Topology;

pub fn vip(i: usize) -> String {
    format!("10.{}.{}.{}", 96 + i / 62_500, (i % 62_500) / 250, i % 250 + 1)
}

/// The `n`-th endpoint address of a benchmark (10.128.0.0/9: 8M distinct ones).
pub fn endpoint_address(n: usize) -> String {
    format!("10.{}.{}.{}", 128 + (n >> 16) % 128, (n >> 8) & 255, n & 255)
}

/// One Service of a benchmark manifest: name, ClusterIP, endpoint addresses.
pub struct BenchService {
    pub name: String,
    pub vip: String,
    pub endpoints: Vec<String>,
}

impl BenchService {
    /// Service `i` of a benchmark of `endpoints` distinct endpoints per Service. At
    /// `generation` g > 0, Service 0's last endpoint is another address (10.127.x.y): one
    /// endpoint changed.
    pub fn numbered(i: usize, endpoints: usize, generation: usize) -> BenchService {
        let mut eps: Vec<String> = (0..endpoints).map(|e| endpoint_address(i * endpoints + e)).collect();
        if i == 0 && generation > 0 {
            if let Some(last) = eps.last_mut() {
                *last = format!("10.127.{}.{}", (generation / 250) % 250, generation % 250 + 1);
            }
        }
        BenchService { name: format!("svc-{i}"), vip: vip(i), endpoints: eps }
    }

    pub fn yaml(&self) -> String {
        let name = &self.name;
        let mut text = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: bench}}\nspec: {{clusterIP: {}, ports: [{{name: http, protocol: TCP, port: 80}}]}}\n---\n",
            self.vip
        );
        text.push_str(&self.slice_yaml());
        text
    }

    /// Its EndpointSlice alone.
    pub fn slice_yaml(&self) -> String {
        let name = &self.name;
        let mut text = String::new();
        text.push_str(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: bench, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, protocol: TCP, port: 8080}}]\nendpoints:\n"
        ));
        for e in &self.endpoints {
            text.push_str(&format!(
                "- {{addresses: [{e}], conditions: {{ready: true}}, nodeName: node-a}}\n"
            ));
        }
        text.push_str("---\n");
        text
    }
}

/// Writes `services` Services of one port with `endpoints` distinct endpoints each, 500 to
/// a file; Service 0 alone in `svc-0.yaml` (the one changed, at `generation`).
pub fn write_manifests(dir: &Path, services: usize, endpoints: usize, generation: usize) {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..services {
        let file = if i == 0 { "svc-0.yaml".to_owned() } else { format!("svc-{:03}.yaml", 1 + i / 500) };
        files.entry(file).or_default().push_str(&BenchService::numbered(i, endpoints, generation).yaml());
    }
    for (file, text) in files {
        crate::harness::topology::write_atomically(&dir.join(file), &text);
    }
}

/// Rewrites Service 0's file at generation `g` (its last endpoint changed).
pub fn write_manifests_one(dir: &Path, endpoints: usize, g: usize) {
    let text = BenchService::numbered(0, endpoints, g).yaml();
    crate::harness::topology::write_atomically(&dir.join("svc-0.yaml"), &text);
}

/// The two Services of the data-path measurement, backed by a real pod: the first and
/// the last in every backend's order (keys sort by name).
pub const DATA_PATH_SERVICES: [(&str, &str); 2] = [("aaa-first", "10.95.0.1"), ("zzz-last", "10.95.0.2")];

pub fn write_data_path_services(dir: &Path) {
    let text: String = DATA_PATH_SERVICES
        .iter()
        .map(|(name, vip)| {
            BenchService {
                name: (*name).to_owned(),
                vip: (*vip).to_owned(),
                endpoints: vec![Topology::pod_ip(0)],
            }
            .yaml()
        })
        .collect();
    crate::harness::topology::write_atomically(&dir.join("data-path.yaml"), &text);
}
