//! Trust between node agents and the control plane, over real processes in network
//! namespaces: mutual TLS gives traffic; a certificate of another CA, an expired one, none
//! at all, or a plaintext client are refused with a clear error on both sides; a node-a
//! certificate claiming node-b is refused with PermissionDenied and served nothing; the
//! server's certificate replaced under open streams keeps them and new connections get
//! the new one; the admin API needs an admin certificate; ServiceAccount tokens are
//! checked by TokenReview (wrong audience, expired, another node refused). Run as root.

use kpx_e2e::harness::kube_apiserver::KubeApiServer;
use kpx_e2e::harness::manifests::web_on_pod0;
use kpx_e2e::harness::pki::{Issued, Pki, Validity};
use kpx_e2e::harness::process::KpxProcess;
use kpx_e2e::harness::topology::{node_yaml, sock, Topology, NODE_NAME};
use kpx_e2e::{wait_for, DEADLINE};

const URL: &str = "https://127.0.0.1:18000";

/// Flags of an agent's own TLS files, with a port set of its own (several agents run
/// one after another in the node namespace).
fn tls_flags(ca: &std::path::Path, identity: Option<&Issued>) -> Vec<String> {
    let mut flags = vec![
        format!("--tls-ca={}", ca.display()),
        "--admin-listen=127.0.0.1:0".into(),
        "--healthz-listen=127.0.0.1:0".into(),
        "--metrics-listen=127.0.0.1:0".into(),
    ];
    if let Some(i) = identity {
        flags.push(format!("--tls-cert={}", i.cert.display()));
        flags.push(format!("--tls-key={}", i.key.display()));
    }
    flags
}

fn message(e: &serde_json::Value) -> &str {
    e["message"].as_str().unwrap_or_default()
}

/// Waits for the agent to give up on a connection attempt; returns the error it logged.
fn refused(dp: &KpxProcess) -> String {
    let e = dp.wait_event("a refused connection", DEADLINE, |e| {
        message(e).starts_with("control plane unreachable")
    });
    assert!(
        !dp.events().iter().any(|e| message(e) == "delta applied"),
        "a refused agent is sent nothing: {}",
        dp.log_text()
    );
    e["error"].as_str().unwrap_or_default().to_owned()
}

fn cert_flags(ca: &std::path::Path, identity: &Issued) -> Vec<String> {
    vec![
        format!("--control-plane={URL}"),
        format!("--tls-ca={}", ca.display()),
        format!("--tls-cert={}", identity.cert.display()),
        format!("--tls-key={}", identity.key.display()),
    ]
}

#[test]
fn mutual_tls_identities_rotation_and_the_admin_api() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    t.write_node();
    t.write_manifest("web.yaml", &web_on_pod0("web", "10.96.8.1"));
    let pki = Pki::new(t.dir.path(), "cluster");
    let other = Pki::new(t.dir.path(), "other");
    let server = pki.server("server");
    let admin = pki.issue("admin", "kpx-admin", &[], &[], Validity::Current);
    let cp = t.start_control_plane_with(&[
        &format!("--tls-cert={}", server.cert.display()),
        &format!("--tls-key={}", server.key.display()),
        &format!("--tls-client-ca={}", pki.ca().display()),
        "--admin-identity=kpx-admin",
    ]);
    cp.wait_event("the control plane to listen", DEADLINE, |e| {
        message(e) == "serving delta xDS and the admin API"
    });
    let cp_refused = |what: &str, pred: &dyn Fn(&serde_json::Value) -> bool| {
        cp.wait_event(what, DEADLINE, |e| pred(e));
    };

    // A certificate of another CA, an expired one, none, plaintext: refused on both sides.
    let foreign = other.issue("foreign", "system:node:node-a", &[], &[], Validity::Current);
    let expired = pki.issue("expired", "system:node:node-a", &[], &[], Validity::Expired);
    let cases: Vec<(&str, String, Vec<String>)> = vec![
        ("another CA", URL.into(), tls_flags(&pki.ca(), Some(&foreign))),
        ("expired", URL.into(), tls_flags(&pki.ca(), Some(&expired))),
        ("no certificate", URL.into(), tls_flags(&pki.ca(), None)),
        ("plaintext", "http://127.0.0.1:18000".into(), tls_flags(&pki.ca(), None)[1..].to_vec()),
    ];
    for (i, (case, url, flags)) in cases.into_iter().enumerate() {
        let handshakes =
            cp.events().iter().filter(|e| message(e).starts_with("TLS handshake refused")).count();
        let mut dp = t.start_agent(NODE_NAME, &url, &format!("state-{i}"), &flags);
        let error = refused(&dp);
        println!("{case}: the agent says {error:?}");
        match case {
            "no certificate" => {
                assert!(
                    error.contains("Unauthenticated") && error.contains("no client certificate"),
                    "{case}: {error}"
                );
                cp_refused("the refused stream", &|e| {
                    message(e) == "stream refused"
                        && e["reason"].as_str().is_some_and(|r| r.contains("no client certificate"))
                });
            }
            _ => {
                assert!(
                    error.contains("TLS") || error.contains("certificate"),
                    "{case}: a hint on TLS: {error}"
                );
                wait_for(
                    &format!("{case}: the control plane to log the refused handshake"),
                    DEADLINE,
                    || {
                        (cp.events()
                            .iter()
                            .filter(|e| message(e).starts_with("TLS handshake refused"))
                            .count()
                            > handshakes)
                            .then_some(())
                    },
                );
            }
        }
        dp.stop();
    }

    // A node-a certificate claiming to be node-b: PermissionDenied naming both, nothing served.
    let node_a = pki.issue("node-a", "system:node:node-a", &[], &[], Validity::Current);
    let mut impostor = t.start_agent("node-b", URL, "state-impostor", &tls_flags(&pki.ca(), Some(&node_a)));
    let error = refused(&impostor);
    assert!(
        error.contains("PermissionDenied")
            && error.contains("\"node-b\"")
            && error.contains("node \"node-a\""),
        "{error}"
    );
    impostor.stop();
    let (_, metrics) = t
        .node
        .run_in(|| kpx_e2e::harness::traffic::http_get_path(sock("127.0.0.1", 18002), "/metrics"))
        .expect("metrics");
    assert!(metrics.contains("kpx_refused_total{reason=\"node_id_mismatch\"}"), "{metrics}");

    // The real node-a: traffic.
    let dp = t.start_agent(NODE_NAME, URL, "state", &tls_flags(&pki.ca(), Some(&node_a)));
    t.wait_answered_by("10.96.8.1", 80, "pod0");

    // The admin API: an admin certificate yes, a node's no.
    let ok = t.kpxctl(&[cert_flags(&pki.ca(), &admin), vec!["services".into()]].concat());
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("web"));
    let no = t.kpxctl(&[cert_flags(&pki.ca(), &node_a), vec!["services".into()]].concat());
    let said = String::from_utf8_lossy(&no.stderr);
    assert_eq!(no.status.code(), Some(1), "{said}");
    assert!(said.contains("refused") && said.contains("--admin-identity"), "{said}");

    // The server's certificate replaced (by one of a new CA) under the open stream: the
    // stream stays, a change still reaches the node; a new connection gets the new
    // certificate (it fails with the old CA and works with the new one).
    let streams =
        |dp: &KpxProcess| dp.events().iter().filter(|e| message(e).starts_with("stream open")).count();
    let before = streams(&dp);
    let renewed_ca = Pki::new(t.dir.path(), "renewed");
    let renewed = renewed_ca.server("renewed");
    std::fs::copy(&renewed.key, &server.key).expect("key");
    std::fs::copy(&renewed.cert, &server.cert).expect("cert");
    std::thread::sleep(std::time::Duration::from_secs(2));
    t.write_manifest("web2.yaml", &web_on_pod0("web2", "10.96.8.2"));
    t.wait_answered_by("10.96.8.2", 80, "pod0");
    assert_eq!(streams(&dp), before, "the open stream stayed: {}", dp.log_text());
    wait_for("a new connection to get the new certificate", DEADLINE, || {
        let old = t.kpxctl(&[cert_flags(&pki.ca(), &admin), vec!["services".into()]].concat());
        let new = t.kpxctl(&[cert_flags(&renewed_ca.ca(), &admin), vec!["services".into()]].concat());
        (!old.status.success() && new.status.success()).then_some(())
    });
}

/// Nodes that present a ServiceAccount token (`--node-token-file`): the control plane asks
/// the real kube-apiserver (TokenReview, with the install's RBAC and its ServiceAccount's
/// token) and takes the node from the pod the token is bound to. Tokens are made by the
/// API server itself (`kubectl create token … --bound-object-kind Pod`, TokenRequest).
#[test]
fn service_account_tokens_are_checked_by_token_review() {
    let t = Topology::new(1);
    let _backends = t.start_backends(8080);
    let Some(api) = KubeApiServer::start(&t.node, 16444, "service_account_tokens_are_checked") else {
        return;
    };
    api.apply_yaml(&node_yaml(NODE_NAME, "zone-a"));
    api.apply_yaml(
        &node_yaml("node-b", "zone-b").replace("10.0.0.1", "10.0.9.1").replace("10.0.1.1", "10.0.9.2"),
    );
    api.apply_yaml(&web_on_pod0("web", "10.96.8.3"));
    api.apply_yaml(&kpx_e2e::harness::install::rbac());
    let kubeconfig = t.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, &api.create_token("kube-system", "kpx-controlplane", &[]));
    // The agents' pods, as the DaemonSet's would be: kpx-dataplane's ServiceAccount, a node.
    let pod = |name: &str, node: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: kube-system}}\nspec:\n  \
             serviceAccountName: kpx-dataplane\n  automountServiceAccountToken: false\n  nodeName: {node}\n  \
             containers: [{{name: agent, image: kpx}}]\n"
        )
    };
    api.apply_yaml(&pod("agent-a", NODE_NAME));
    api.apply_yaml(&pod("agent-b", "node-b"));
    api.apply_yaml(&pod("agent-gone", NODE_NAME));
    let bound = |pod: &str, audience: &str| {
        api.create_token(
            "kube-system",
            "kpx-dataplane",
            &["--audience", audience, "--bound-object-kind=Pod", &format!("--bound-object-name={pod}")],
        )
    };
    let tokens = [
        ("other-audience", bound("agent-a", "vault"), "audience"),
        ("pod-deleted", bound("agent-gone", "kpx"), "token has been invalidated"),
        (
            "no-pod",
            api.create_token("kube-system", "kpx-dataplane", &["--audience", "kpx"]),
            "not bound to a pod",
        ),
        ("node-b", bound("agent-b", "kpx"), "PermissionDenied"),
    ];
    // No kubelet confirms a graceful deletion here: forced, as the node's would end.
    api.kubectl_ok(&["delete", "pod", "agent-gone", "-n", "kube-system", "--grace-period=0", "--force"]);
    let pki = Pki::new(t.dir.path(), "cluster");
    let server = pki.server("server");
    let cp = t.start_control_plane_from(
        &[format!("kubeconfig:{}", kubeconfig.display())],
        &[
            &format!("--tls-cert={}", server.cert.display()),
            &format!("--tls-key={}", server.key.display()),
            &format!("--tls-client-ca={}", pki.ca().display()),
        ],
    );
    cp.wait_event("the control plane to listen", DEADLINE, |e| {
        message(e) == "serving delta xDS and the admin API"
    });
    let with_token = |name: &str, token: &str| {
        let file = t.dir.path().join(format!("token-{name}"));
        std::fs::write(&file, format!("{token}\n")).expect("token");
        let mut flags = tls_flags(&pki.ca(), None);
        flags.push(format!("--node-token-file={}", file.display()));
        flags
    };
    for (name, token, expect) in &tokens {
        let mut dp = t.start_agent(NODE_NAME, URL, &format!("state-{name}"), &with_token(name, token));
        let error = refused(&dp);
        println!("{name}: the agent says {error:?}");
        assert!(error.contains(expect), "{name}: {error}");
        dp.stop();
    }
    let reviews = || api.audited("/apis/authentication.k8s.io/v1/tokenreviews").len();
    let before = reviews();
    let _dp = t.start_agent(NODE_NAME, URL, "state", &with_token("good", &bound("agent-a", "kpx")));
    t.wait_answered_by("10.96.8.3", 80, "pod0");
    assert!(reviews() > before, "the good token was reviewed too");
    let refused: Vec<_> = api.audited("/").into_iter().filter(|(_, _, code)| *code == 403).collect();
    assert_eq!(refused, [], "the install's RBAC grants the control plane its TokenReviews");
}
