use super::*;

const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: true}
  nodeName: n1
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
"#;

#[test]
fn reads_services_slices_and_skips_other_kinds() {
    let objects: Vec<_> = parse(GOOD).into_iter().collect::<Result<_, _>>().expect("valid");
    assert_eq!(objects.len(), 2);
    let Object::Service(svc) = &objects[0] else { panic!("first is a Service") };
    assert_eq!(svc.key.to_string(), "shop/web");
    assert_eq!(svc.ports[0].port, 80);
    let Object::EndpointSlice(slice) = &objects[1] else { panic!("second is a slice") };
    assert_eq!(slice.service_name, "web");
    assert_eq!(slice.ports[0].port, 8080);
}

#[test]
fn a_bad_document_names_its_field_and_the_rest_is_read() {
    let text = "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 70000}]}\n---\n\
                    kind: Service\nmetadata: {name: b}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n---\n\
                    kind: Service\nmetadata: {name: c}\nspec: {ports: [{port: eighty}]}\n";
    let results = parse(text);
    assert_eq!(results.len(), 3);
    let err = results[0].as_ref().expect_err("port out of range");
    assert_eq!((err.document, err.field.as_str()), (0, "spec.ports[0].port"));
    assert!(err.to_string().contains("Service default/a"), "{err}");
    assert!(results[1].is_ok());
    let err = results[2].as_ref().expect_err("port not a number");
    assert_eq!((err.document, err.field.as_str()), (2, "spec.ports[0].port"));
}

#[test]
fn a_syntax_error_names_the_document_it_is_in() {
    // The parser reads `""` as a document and the `(` after it as another.
    let err = parse("\"\"(").pop().and_then(Result::err).expect("not YAML");
    assert_eq!((err.document, err.field.as_str()), (0, "<document>"), "{err}");
    let text = "---\nkind: ConfigMap\n---\n# a comment\nkind: Service\nmetadata: [\n";
    let err = parse(text).pop().and_then(Result::err).expect("not YAML");
    assert_eq!(err.document, 1, "{err}");
}

mod properties {
    //! For any text: every document is an object or an error naming its document and
    //! field; an object's ClusterIPs and ports are what was written.

    use super::*;
    use proptest::prelude::*;

    fn scalar() -> impl Strategy<Value = String> {
        prop_oneof![
            "10\\.96\\.[0-9]{1,3}\\.[0-9]{1,3}",
            "fd00:96::[0-9a-f]{1,4}",
            "-?[0-9]{1,6}",
            "[A-Za-z]{0,10}",
            Just("None".to_owned()),
            Just("{".to_owned()),
            Just("\"\\u0000\"".to_owned()),
            Just("[1, 2]".to_owned()),
        ]
    }

    fn service() -> impl Strategy<Value = String> {
        (
            "[a-z0-9-]{0,12}",
            scalar(),
            prop::collection::vec((scalar(), prop_oneof![Just("TCP"), Just("UDP"), Just("SCTP"), Just("ICMP"), Just("")], scalar(), scalar()), 0..3),
            prop_oneof![Just("ClusterIP"), Just("NodePort"), Just("LoadBalancer"), Just("ExternalName"), Just("Nope")],
            prop_oneof![Just("Local"), Just("Cluster"), Just("Sometimes")],
            prop::collection::vec(scalar(), 0..3),
        )
            .prop_map(|(name, ip, ports, ty, policy, ranges)| {
                let ports: Vec<String> = ports
                    .iter()
                    .map(|(port, proto, target, node)| {
                        format!("{{port: {port}, protocol: {proto}, targetPort: {target}, nodePort: {node}}}")
                    })
                    .collect();
                format!(
                    "kind: Service\napiVersion: v1\nmetadata: {{name: '{name}', namespace: ns}}\nspec:\n  type: {ty}\n  clusterIP: {ip}\n  externalTrafficPolicy: {policy}\n  loadBalancerSourceRanges: [{}]\n  ports: [{}]\n",
                    ranges.join(", "),
                    ports.join(", ")
                )
            })
    }

    fn slice() -> impl Strategy<Value = String> {
        ("[a-z0-9-]{0,8}", prop::collection::vec((scalar(), any::<bool>(), scalar()), 0..3), scalar(), prop_oneof![Just("IPv4"), Just("IPv6"), Just("FQDN"), Just("x")])
            .prop_map(|(name, endpoints, port, family)| {
                let eps: Vec<String> = endpoints
                    .iter()
                    .map(|(a, ready, node)| format!("{{addresses: [{a}], conditions: {{ready: {ready}}}, nodeName: {node}}}"))
                    .collect();
                format!(
                    "kind: EndpointSlice\napiVersion: discovery.k8s.io/v1\nmetadata: {{name: '{name}', namespace: ns, labels: {{kubernetes.io/service-name: web}}}}\naddressType: {family}\nports: [{{name: http, port: {port}}}]\nendpoints: [{}]\n",
                    eps.join(", ")
                )
            })
    }

    fn documents() -> impl Strategy<Value = String> {
        prop::collection::vec(prop_oneof![service(), slice(), ".{0,40}"], 1..4)
            .prop_map(|docs| docs.join("---\n"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn every_document_is_an_object_or_an_error_naming_its_field(text in documents()) {
            // (Counting with serde_yaml's document iterator never ends after a syntax error.)
            let documents = text.split("---\n").count();
            for result in parse(&text) {
                match result {
                    Ok(Object::Service(s)) => {
                        prop_assert!(s.ports.iter().all(|p| p.port > 0));
                        prop_assert!(s.cluster_ips.len() <= 2);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        prop_assert!(!e.field.is_empty() && !e.reason.is_empty(), "{}", e);
                        prop_assert!(e.document < documents.max(1), "{} of {}", e, documents);
                    }
                }
            }
        }
    }
}
