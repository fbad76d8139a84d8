use super::super::{parse, Object};
use super::*;

fn one(spec: &str) -> Result<Service, (String, String)> {
    let text = format!("kind: Service\nmetadata: {{name: s}}\n{spec}");
    let mut results = parse(&text);
    assert_eq!(results.len(), 1, "{text}");
    match results.remove(0) {
        Ok(Object::Service(s)) => Ok(s),
        Ok(other) => panic!("not a Service: {other:?}"),
        Err(e) => Err((e.field, e.reason)),
    }
}

#[test]
fn the_ipvs_scheduler_annotation_is_one_of_the_known_schedulers() {
    let annotated = |value: &str| {
        let text = format!(
                "kind: Service\nmetadata: {{name: s, annotations: {{service.kpx.io/ipvs-scheduler: {value}}}}}\nspec: {{clusterIP: 10.96.0.1, ports: [{{port: 80}}]}}"
            );
        match parse(&text).remove(0) {
            Ok(Object::Service(s)) => Ok(s.ipvs_scheduler),
            Ok(other) => panic!("not a Service: {other:?}"),
            Err(e) => Err(e.field),
        }
    };
    assert_eq!(annotated("mh"), Ok(Some("mh".to_owned())));
    assert_eq!(annotated("fastest"), Err("metadata.annotations[service.kpx.io/ipvs-scheduler]".to_owned()));
}

fn field_of(spec: &str) -> String {
    one(spec).expect_err("invalid").0
}

const LB: &str = "spec:\n  type: LoadBalancer\n  clusterIPs: [10.96.0.1, fd00::1]\n";

#[test]
fn reads_external_entry_points_policies_and_affinity() {
    let svc = one(&format!(
            "{LB}  ports: [{{name: a, port: 80, nodePort: 30080}}, {{name: b, port: 81, protocol: UDP}}]\n  \
             externalIPs: [192.0.2.1, '2001:db8::1']\n  loadBalancerSourceRanges: [' 198.51.100.7/24 ', '2001:db8::/32']\n  \
             externalTrafficPolicy: Local\n  internalTrafficPolicy: Local\n  healthCheckNodePort: 31000\n  \
             sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: 60}}}}\n\
             status:\n  loadBalancer:\n    ingress: [{{ip: 203.0.113.9}}, {{hostname: lb.example}}, {{ip: 203.0.113.10, ipMode: Proxy}}]\n"
        ))
        .expect("valid");
    assert_eq!(svc.ports[0].node_port, Some(30080));
    assert_eq!(svc.ports[1].node_port, None);
    assert_eq!(
        svc.external_ips,
        ["192.0.2.1".parse::<IpAddr>().expect("ip"), "2001:db8::1".parse().expect("ip")]
    );
    assert_eq!(svc.load_balancer_ips, ["203.0.113.9".parse::<IpAddr>().expect("ip")]);
    let ranges: Vec<String> = svc.load_balancer_source_ranges.iter().map(ToString::to_string).collect();
    assert_eq!(ranges, ["198.51.100.0/24", "2001:db8::/32"]);
    assert_eq!(svc.external_traffic_policy, TrafficPolicy::Local);
    assert_eq!(svc.internal_traffic_policy, TrafficPolicy::Local);
    assert!(svc.external_traffic_local());
    assert_eq!(svc.health_check_node_port, Some(31000));
    assert_eq!(svc.session_affinity_timeout, Some(60));
}

#[test]
fn defaults() {
    let svc = one("spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n").expect("valid");
    assert_eq!(svc.external_traffic_policy, TrafficPolicy::Cluster);
    assert_eq!(svc.internal_traffic_policy, TrafficPolicy::Cluster);
    assert_eq!(svc.session_affinity_timeout, None);
    assert!(svc.external_ips.is_empty() && svc.load_balancer_ips.is_empty());
    assert_eq!(svc.ports[0].node_port, None);
    let affinity = one("spec: {clusterIP: 10.96.0.1, sessionAffinity: ClientIP}\n").expect("valid");
    assert_eq!(affinity.session_affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
    let none = one("spec: {clusterIP: 10.96.0.1, sessionAffinity: None, \
                        sessionAffinityConfig: {clientIP: {timeoutSeconds: 5}}}\n")
    .expect("valid");
    assert_eq!(none.session_affinity_timeout, None);
}

#[test]
fn local_external_policy_counts_only_with_an_external_entry_point() {
    let plain = one("spec: {clusterIP: 10.96.0.1, externalTrafficPolicy: Local, ports: [{port: 80}]}\n")
        .expect("valid");
    assert_eq!(plain.external_traffic_policy, TrafficPolicy::Local);
    assert!(!plain.external_traffic_local());
    let external =
        one("spec: {clusterIP: 10.96.0.1, externalTrafficPolicy: Local, externalIPs: [192.0.2.1]}\n")
            .expect("valid");
    assert!(external.external_traffic_local());
    let node_port = one("spec: {type: NodePort, clusterIP: 10.96.0.1, externalTrafficPolicy: Local, \
                             ports: [{port: 80, nodePort: 30000}]}\n")
    .expect("valid");
    assert!(node_port.external_traffic_local());
}

#[test]
fn bad_fields_are_named() {
    let cases = [
            (format!("{LB}  ports: [{{port: 80}}, {{port: 81, nodePort: 70000}}]\n"), "spec.ports[1].nodePort"),
            (format!("{LB}  ports: [{{port: 80, nodePort: -1}}]\n"), "spec.ports[0].nodePort"),
            ("spec: {clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30080}]}\n".into(), "spec.ports[0].nodePort"),
            (format!("{LB}  externalIPs: [192.0.2.300]\n"), "spec.externalIPs[0]"),
            (format!("{LB}  loadBalancerSourceRanges: [10.0.0.0/33]\n"), "spec.loadBalancerSourceRanges[0]"),
            (format!("{LB}  loadBalancerSourceRanges: [10.0.0.0/8, nonsense]\n"), "spec.loadBalancerSourceRanges[1]"),
            (format!("{LB}  externalTrafficPolicy: Global\n"), "spec.externalTrafficPolicy"),
            (format!("{LB}  internalTrafficPolicy: local\n"), "spec.internalTrafficPolicy"),
            (format!("{LB}  healthCheckNodePort: 65536\n"), "spec.healthCheckNodePort"),
            (format!("{LB}  sessionAffinity: Cookie\n"), "spec.sessionAffinity"),
            (
                format!("{LB}  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: 86401}}}}\n"),
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            ),
            (
                format!("{LB}  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: 0}}}}\n"),
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            ),
            (
                format!("{LB}status: {{loadBalancer: {{ingress: [{{ip: 203.0.113.1}}, {{ip: bad}}]}}}}\n"),
                "status.loadBalancer.ingress[1].ip",
            ),
            (
                format!("{LB}status: {{loadBalancer: {{ingress: [{{ip: 203.0.113.1, ipMode: Tunnel}}]}}}}\n"),
                "status.loadBalancer.ingress[0].ipMode",
            ),
        ];
    for (spec, field) in cases {
        assert_eq!(field_of(&spec), field, "{spec}");
    }
}

#[test]
fn addresses_of_another_family_are_left_out_and_the_service_kept() {
    let svc = one("spec: {clusterIP: 10.96.0.1, externalIPs: [192.0.2.1, '2001:db8::1']}\n").expect("kept");
    assert_eq!(svc.external_ips, ["192.0.2.1".parse::<IpAddr>().expect("ip")]);
    let svc = one(
            "spec: {type: LoadBalancer, clusterIP: 'fd00::1'}\nstatus: {loadBalancer: {ingress: [{ip: 203.0.113.1}, {ip: 'fd00::99'}]}}\n",
        )
        .expect("kept");
    assert_eq!(svc.load_balancer_ips, ["fd00::99".parse::<IpAddr>().expect("ip")]);
}

#[test]
fn the_headless_label_is_read() {
    let text = "kind: Service\nmetadata: {name: h, labels: {service.kubernetes.io/headless: ''}}\nspec: {clusterIP: 10.96.0.1}\n";
    let Ok(Object::Service(svc)) = parse(text).remove(0) else { panic!("a valid Service") };
    assert!(svc.headless_label);
    assert!(!crate::view::is_proxied(&svc), "left alone");
}

#[test]
fn zero_node_ports_mean_none_and_the_rest_of_the_folder_is_still_read() {
    let svc =
        one(&format!("{LB}  ports: [{{port: 80, nodePort: 0}}]\n  healthCheckNodePort: 0\n")).expect("valid");
    assert_eq!((svc.ports[0].node_port, svc.health_check_node_port), (None, None));
    let text = format!(
        "kind: Service\nmetadata: {{name: bad}}\n{LB}  externalIPs: [nope]\n---\n\
             kind: Service\nmetadata: {{name: good}}\n{LB}  externalIPs: [192.0.2.1]\n"
    );
    let results = parse(&text);
    assert!(results[0].is_err());
    assert!(matches!(&results[1], Ok(Object::Service(s)) if s.key.name == "good"));
}
