//! kpx against kube-proxy, case by case: one real kube-apiserver holds a table of
//! Services and EndpointSlices; the real kube-proxy v1.36 (nftables mode) serves them on
//! one node, kpx (control plane and agent, nftables) on another node built the same way
//! (same addresses, same pods, linked to the API server's namespace). The same probes,
//! from each node's client, must get the same answers: which pods answer, or that the
//! connection is refused, or that nothing answers. The cases are kube-proxy's own
//! packet-flow tests' and the Service e2e specs' (ClusterIP, NodePort, external and
//! load-balancer IPs, source ranges, traffic policies, terminating endpoints, affinity,
//! a port the Service does not have).

use std::collections::BTreeSet;
use std::net::SocketAddr;

use kpx_e2e::harness::install;
use kpx_e2e::harness::kube_apiserver::{self, KubeApiServer, KubeProxy};
use kpx_e2e::harness::manifests::{documents, ep, service, slice, Ep};
use kpx_e2e::harness::topology::{node_yaml, sock, Topology, CLIENT_IP_2, NODE_IP, NODE_IP_2, NODE_NAME};
use kpx_e2e::harness::traffic::{tcp_request, udp_request, Answer, Backend};
use kpx_e2e::{wait_for, DEADLINE};

/// One Service, its endpoints, and where a client sends to.
struct Case {
    name: &'static str,
    spec: String,
    /// The load balancer's address, written to the Service's status.
    load_balancer: Option<&'static str>,
    endpoints: Vec<Ep>,
    udp: bool,
    to: SocketAddr,
    /// From the client's second address (10.0.0.3) rather than its first.
    from_second_address: bool,
    /// ClientIP affinity: one pod answers every try, whichever it is.
    sticky: bool,
}

fn clusterip(ip: &str, extra: &str) -> String {
    format!(
        "  clusterIP: {ip}\n  ports:\n  - {{name: p, protocol: TCP, port: 80, targetPort: 8080}}\n{extra}"
    )
}

fn cases() -> Vec<Case> {
    let both = || vec![ep(Topology::pod_ip(0)), ep(Topology::pod_ip(1))];
    let case = |name, spec: String, endpoints, to: SocketAddr| Case {
        name,
        spec,
        load_balancer: None,
        endpoints,
        udp: false,
        to,
        from_second_address: false,
        sticky: false,
    };
    let nodeport = |ip: &str, port: u16, extra: &str| {
        format!(
            "  type: NodePort\n  clusterIP: {ip}\n  ports:\n  - {{name: p, protocol: TCP, port: 80, targetPort: 8080, nodePort: {port}}}\n{extra}"
        )
    };
    vec![
        case("clusterip", clusterip("10.96.1.1", ""), both(), sock("10.96.1.1", 80)),
        Case {
            udp: true,
            ..case(
                "clusterip-udp",
                "  clusterIP: 10.96.1.2\n  ports:\n  - {name: p, protocol: UDP, port: 53, targetPort: 8080}\n".into(),
                both(),
                sock("10.96.1.2", 53),
            )
        },
        case("no-endpoints", clusterip("10.96.1.3", ""), vec![], sock("10.96.1.3", 80)),
        case("port-not-in-service", clusterip("10.96.1.4", ""), both(), sock("10.96.1.4", 81)),
        case("not-ready", clusterip("10.96.1.5", ""), vec![ep(Topology::pod_ip(0)).not_ready()], sock("10.96.1.5", 80)),
        case(
            "terminating-serving",
            clusterip("10.96.1.6", ""),
            vec![ep(Topology::pod_ip(0)).terminating(), ep(Topology::pod_ip(1)).not_ready()],
            sock("10.96.1.6", 80),
        ),
        case(
            "ready-beats-terminating",
            clusterip("10.96.1.7", ""),
            vec![ep(Topology::pod_ip(0)).terminating(), ep(Topology::pod_ip(1))],
            sock("10.96.1.7", 80),
        ),
        Case {
            sticky: true,
            ..case(
                "affinity",
                clusterip(
                    "10.96.1.8",
                    "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n",
                ),
                both(),
                sock("10.96.1.8", 80),
            )
        },
        case(
            "internal-local-none-here",
            clusterip("10.96.1.9", "  internalTrafficPolicy: Local\n"),
            vec![ep(Topology::pod_ip(0)).on("node-b")],
            sock("10.96.1.9", 80),
        ),
        case("nodeport", nodeport("10.96.2.1", 30081, ""), both(), sock(NODE_IP, 30081)),
        case("nodeport-second-node-ip", nodeport("10.96.2.5", 30088, ""), both(), sock(NODE_IP_2, 30088)),
        case("no-service-at-address", clusterip("10.96.2.6", ""), both(), sock("10.96.9.9", 80)),
        Case {
            udp: true,
            ..case(
                "udp-no-endpoints",
                "  clusterIP: 10.96.2.7\n  ports:\n  - {name: p, protocol: UDP, port: 53, targetPort: 8080}\n".into(),
                vec![],
                sock("10.96.2.7", 53),
            )
        },
        case(
            "nodeport-local",
            nodeport("10.96.2.2", 30082, "  externalTrafficPolicy: Local\n"),
            vec![ep(Topology::pod_ip(0)), ep(Topology::pod_ip(1)).on("node-b")],
            sock(NODE_IP, 30082),
        ),
        case(
            "nodeport-local-none-here",
            nodeport("10.96.2.3", 30083, "  externalTrafficPolicy: Local\n"),
            vec![ep(Topology::pod_ip(0)).on("node-b")],
            sock(NODE_IP, 30083),
        ),
        case(
            "nodeport-local-clusterip",
            nodeport("10.96.2.4", 30084, "  externalTrafficPolicy: Local\n"),
            vec![ep(Topology::pod_ip(0)).on("node-b")],
            sock("10.96.2.4", 80),
        ),
        case("external-ip", clusterip("10.96.3.1", "  externalIPs: [10.0.5.5]\n"), both(), sock("10.0.5.5", 80)),
        Case {
            load_balancer: Some("10.0.6.6"),
            ..case(
                "load-balancer",
                nodeport("10.96.3.2", 30085, "").replace("type: NodePort", "type: LoadBalancer"),
                both(),
                sock("10.0.6.6", 80),
            )
        },
        Case {
            load_balancer: Some("10.0.6.7"),
            ..case(
                "source-range-refused",
                nodeport("10.96.3.3", 30086, "  loadBalancerSourceRanges: [10.0.0.3/32]\n")
                    .replace("type: NodePort", "type: LoadBalancer"),
                both(),
                sock("10.0.6.7", 80),
            )
        },
        Case {
            load_balancer: Some("10.0.6.8"),
            from_second_address: true,
            ..case(
                "source-range-allowed",
                nodeport("10.96.3.4", 30087, "  loadBalancerSourceRanges: [10.0.0.3/32]\n")
                    .replace("type: NodePort", "type: LoadBalancer"),
                both(),
                sock("10.0.6.8", 80),
            )
        },
    ]
}

/// Every case's Service and EndpointSlice.
fn manifest(cases: &[Case]) -> String {
    let mut docs = Vec::new();
    for c in cases {
        docs.push(service(c.name, &c.spec, ""));
        let protocol = if c.udp { "UDP" } else { "TCP" };
        docs.push(slice(c.name, &format!("{}-1", c.name), false, &[("p", protocol, 8080)], &c.endpoints));
    }
    documents(&docs)
}

/// What a client saw: the pods that answered, or how it failed.
fn probe(t: &Topology, c: &Case) -> String {
    let (to, udp, second) = (c.to, c.udp, c.from_second_address);
    let answers: Vec<Answer> = t.client.run_in(move || {
        let mut answers = Vec::new();
        for _ in 0..8 {
            let answer = match (udp, second) {
                (true, _) => udp_request(to),
                (false, true) => {
                    kpx_e2e::harness::traffic::tcp_request_from(CLIENT_IP_2.parse().expect("IP"), to)
                }
                (false, false) => tcp_request(to),
            };
            let answered = matches!(answer, Answer::From(_));
            answers.push(answer);
            // A refusal or silence is what every try gets: one is enough.
            if !answered {
                break;
            }
        }
        answers
    });
    let kinds: BTreeSet<String> = answers
        .into_iter()
        .map(|a| match a {
            Answer::From(pod) => pod,
            Answer::Refused => "refused".into(),
            Answer::Failed(_) => "no answer".into(),
        })
        .collect();
    if c.sticky && kinds.len() == 1 && kinds.iter().all(|k| k.starts_with("pod")) {
        return "one pod, every time".into();
    }
    kinds.into_iter().collect::<Vec<_>>().join(",")
}

#[test]
fn kpx_answers_every_case_as_kube_proxy_does() {
    let test = "kpx_answers_every_case_as_kube_proxy_does";
    let Some(kube_proxy) = kube_apiserver::kube_proxy(test) else { return };
    // kube-proxy's node holds the API server; kpx's node reaches it over a link.
    let kp_node = Topology::new(2);
    let kpx_node = Topology::new(2);
    let _backends: Vec<Backend> = [&kp_node, &kpx_node].iter().flat_map(|t| t.start_backends(8080)).collect();
    let Some(api) = KubeApiServer::start(&kp_node.node, 16443, test) else { return };
    api.link(&kpx_node.node);
    let cases = cases();
    api.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    api.apply_yaml(&manifest(&cases));
    for c in &cases {
        if let Some(ip) = c.load_balancer {
            api.patch_status(
                "service",
                "test",
                c.name,
                &format!("{{\"loadBalancer\":{{\"ingress\":[{{\"ip\":\"{ip}\"}}]}}}}"),
            );
        }
    }
    api.apply_yaml(&install::rbac());
    let _kp = KubeProxy::new(&api, &kube_proxy, &kp_node).start(&kp_node.node);

    let kpx_kubeconfig = kpx_node.dir.path().join("kpx.kubeconfig");
    api.write_linked_kubeconfig(&kpx_kubeconfig, &api.create_token("kube-system", "kpx-controlplane", &[]));
    let _cp = kpx_node.start_control_plane_from(&[format!("kubeconfig:{}", kpx_kubeconfig.display())], &[]);
    let _dp = kpx_node.start_dataplane();

    // Everything was in the API server before either started: each programs it all in its
    // first sync, so once the first case answers on both, every case is in both kernels.
    let first = &cases[0];
    for t in [&kp_node, &kpx_node] {
        wait_for("the first case to be answered by both pods", DEADLINE, || {
            (probe(t, first) == "pod0,pod1").then_some(())
        });
    }
    let mut differ = Vec::new();
    let mut seen = BTreeSet::new();
    println!("{:<28} {:<22} kpx", "case", "kube-proxy v1.36");
    for c in &cases {
        let (by_kube_proxy, by_kpx) = (probe(&kp_node, c), probe(&kpx_node, c));
        println!("{:<28} {:<22} {by_kpx}", c.name, by_kube_proxy);
        if by_kube_proxy != by_kpx {
            differ.push(format!("{}: kube-proxy {by_kube_proxy:?}, kpx {by_kpx:?}", c.name));
        }
        seen.insert(by_kube_proxy);
    }
    assert!(differ.is_empty(), "kpx answers otherwise than kube-proxy:\n{}", differ.join("\n"));
    // A table where everything failed alike would prove nothing: kube-proxy must have
    // answered, refused and stayed silent somewhere.
    for kind in ["pod0,pod1", "refused", "no answer"] {
        assert!(seen.contains(kind), "no case got {kind:?} from kube-proxy: {seen:?}");
    }
}
