//! The install as a cluster receives it: the objects `kubectl kustomize` and `helm
//! template` render from deploy/, read as JSON values, and what their RBAC grants.
//! kubectl, helm and kubernetes-validate come from tests/deploy/tools.sh (tests/run.sh
//! runs it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The namespace everything is rendered into.
pub const NAMESPACE: &str = "kube-system";

/// A path inside the repository.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative)
}

/// A tool tests/deploy/tools.sh provides under target/.
pub fn provided_tool(relative: &str) -> PathBuf {
    let path = repo_path(relative);
    assert!(path.exists(), "{} is missing: run tests/deploy/tools.sh (tests/run.sh does)", path.display());
    path
}

/// Runs `command`, which must succeed; its standard output.
pub fn output_of(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl kustomize deploy/kubernetes/<dir>`.
pub fn kustomize(dir: &str) -> String {
    output_of(
        Command::new(provided_tool("target/tools/kubectl"))
            .arg("kustomize")
            .arg(repo_path(&format!("deploy/kubernetes/{dir}"))),
    )
}

/// `helm template kpx deploy/helm/kpx --namespace kube-system`, with `values` files of the
/// chart's folder (`-f`).
pub fn helm_template(values: Option<&str>) -> String {
    helm_template_with(values, &[])
}

/// [`helm_template`] with `--set` values too (`key=value`).
pub fn helm_template_with(values: Option<&str>, set: &[&str]) -> String {
    let chart = repo_path("deploy/helm/kpx");
    let mut command = Command::new(provided_tool("target/tools/helm"));
    command.args(["template", "kpx"]).arg(&chart).args(["--namespace", NAMESPACE]);
    if let Some(values) = values {
        command.arg("-f").arg(chart.join(values));
    }
    for value in set {
        command.args(["--set", value]);
    }
    output_of(&mut command)
}

/// The objects of a multi-document YAML stream (empty documents skipped).
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|document| serde::Deserialize::deserialize(document).expect("rendered YAML parses"))
        .filter(|value: &Value| !value.is_null())
        .collect()
}

/// Objects by `Kind namespace/name`, each ConfigMap's data values parsed as YAML where
/// they are YAML (so that two renderings of one file compare by content, not layout).
pub fn by_identity(objects: &[Value]) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for object in objects {
        let mut object = object.clone();
        let id = format!(
            "{} {}/{}",
            object["kind"].as_str().unwrap_or("?"),
            object["metadata"]["namespace"].as_str().unwrap_or(""),
            object["metadata"]["name"].as_str().unwrap_or("?")
        );
        if object["kind"] == "ConfigMap" {
            if let Some(data) = object.get_mut("data").and_then(Value::as_object_mut) {
                for value in data.values_mut() {
                    if let Some(parsed) = value.as_str().and_then(|s| serde_yaml::from_str::<Value>(s).ok()) {
                        *value = parsed;
                    }
                }
            }
        }
        assert!(out.insert(id.clone(), object).is_none(), "{id} rendered twice");
    }
    out
}

/// The object of `kind` named `name`.
pub fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// `group/resource:verb` for every rule of the ClusterRoles bound to the ServiceAccount
/// the kpx-controlplane Deployment runs as.
pub fn granted_to_control_plane(objects: &[Value]) -> BTreeSet<String> {
    let deployment = object(objects, "Deployment", "kpx-controlplane");
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap_or("default");
    let namespace = deployment["metadata"]["namespace"].as_str().unwrap_or("default");
    let bound: BTreeSet<&str> =
        objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRoleBinding" && o["roleRef"]["kind"] == "ClusterRole")
            .filter(|o| {
                o["subjects"].as_array().into_iter().flatten().any(|s| {
                    s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == namespace
                })
            })
            .filter_map(|o| o["roleRef"]["name"].as_str())
            .collect();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
    };
    let mut granted = BTreeSet::new();
    for role in objects.iter().filter(|o| o["kind"] == "ClusterRole") {
        if !role["metadata"]["name"].as_str().is_some_and(|n| bound.contains(n)) {
            continue;
        }
        for rule in role["rules"].as_array().into_iter().flatten() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        granted.insert(format!("{group}/{resource}:{verb}"));
                    }
                }
            }
        }
    }
    granted
}

/// `NAMESPACE group/resource[/name]:verb` for every rule of the Roles bound (by
/// RoleBindings) to the ServiceAccount the kpx-dataplane DaemonSet runs as.
pub fn granted_to_agent(objects: &[Value]) -> BTreeSet<String> {
    let daemonset = object(objects, "DaemonSet", "kpx-dataplane");
    granted_by_roles(objects, daemonset)
}

/// The same for the kpx-controlplane Deployment's ServiceAccount (the MCS Lease).
pub fn granted_by_roles_to_control_plane(objects: &[Value]) -> BTreeSet<String> {
    granted_by_roles(objects, object(objects, "Deployment", "kpx-controlplane"))
}

/// `NAMESPACE group/resource[/name]:verb` granted by Roles to the ServiceAccount `workload` runs as.
fn granted_by_roles(objects: &[Value], workload: &Value) -> BTreeSet<String> {
    let account = workload["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap_or("default");
    let namespace = workload["metadata"]["namespace"].as_str().unwrap_or("default");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
    };
    let mut granted = BTreeSet::new();
    for binding in objects.iter().filter(|o| o["kind"] == "RoleBinding" && o["roleRef"]["kind"] == "Role") {
        let to_account =
            binding["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == namespace
            });
        if !to_account {
            continue;
        }
        let at = binding["metadata"]["namespace"].as_str().unwrap_or("default");
        let role = objects.iter().find(|o| {
            o["kind"] == "Role"
                && o["metadata"]["name"] == binding["roleRef"]["name"]
                && o["metadata"]["namespace"] == at
        });
        for rule in role.and_then(|r| r["rules"].as_array()).into_iter().flatten() {
            let names = strings(&rule["resourceNames"]);
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        if names.is_empty() {
                            granted.insert(format!("{at} {group}/{resource}:{verb}"));
                        }
                        for name in &names {
                            granted.insert(format!("{at} {group}/{resource}/{name}:{verb}"));
                        }
                    }
                }
            }
        }
    }
    granted
}

/// The default install both ways: kustomize's and Helm's objects.
pub fn default_installs() -> [(&'static str, Vec<Value>); 2] {
    [("kubectl kustomize", documents(&kustomize(""))), ("helm template", documents(&helm_template(None)))]
}

/// The ServiceAccounts, roles and bindings of the default install (kustomize's rendering;
/// deploy.rs holds Helm's to the same objects), as one manifest to apply to an API server.
pub fn rbac() -> String {
    rbac_of("")
}

/// [`rbac`] of the kustomization `dir` (`overlays/mcs`).
pub fn rbac_of(dir: &str) -> String {
    let kinds = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];
    documents(&kustomize(dir))
        .iter()
        .filter(|o| kinds.iter().any(|k| o["kind"] == *k))
        .map(|o| serde_yaml::to_string(o).expect("YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}
