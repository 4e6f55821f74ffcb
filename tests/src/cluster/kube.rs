//! The Kubernetes manifests under `deploy/` as the tests use them: the DaemonSet's pod spec
//! turned into `podman run` arguments (capabilities, seccomp, read-only root, mounts and their
//! propagation, memory limit, arguments with `$(VAR)` expanded, environment), the ConfigMap's
//! agent configuration, the image reference of the kustomization.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Reads one YAML document.
#[track_caller]
pub fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[track_caller]
fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("no string '{key}' in {v:?}"))
}

fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map(Vec::as_slice).unwrap_or_default()
}

/// The DaemonSet, ConfigMap and kustomization of `deploy/`.
pub struct Manifests {
    /// deploy/daemonset.yaml.
    pub daemonset: Value,
    /// deploy/configmap.yaml.
    pub configmap: Value,
    /// deploy/kustomization.yaml.
    pub kustomization: Value,
}

/// Where the host paths of the pod's volumes are in a test, and the values of the downward
/// API's fields.
pub struct Node<'a> {
    /// hostPath path -> the test's directory standing for it.
    pub host_paths: BTreeMap<&'a str, PathBuf>,
    /// ConfigMap name -> a directory holding its data as files.
    pub config_maps: BTreeMap<&'a str, PathBuf>,
    /// fieldRef fieldPath -> value (e.g. status.hostIP).
    pub fields: BTreeMap<&'a str, String>,
    /// The network namespace standing for the node's (hostNetwork).
    pub netns_path: String,
}

impl Manifests {
    /// Reads `deploy/`.
    pub fn load() -> Manifests {
        let dir = deploy_dir();
        Manifests {
            daemonset: load(&dir.join("daemonset.yaml")),
            configmap: load(&dir.join("configmap.yaml")),
            kustomization: load(&dir.join("kustomization.yaml")),
        }
    }

    /// The pod template's spec.
    pub fn pod_spec(&self) -> &Value {
        &self.daemonset["spec"]["template"]["spec"]
    }

    /// The agent configuration in the ConfigMap.
    pub fn agent_config(&self) -> &str {
        str_at(&self.configmap["data"], "agent.yaml")
    }

    /// Writes every file of the ConfigMap (`agent.yaml`, `overrides.yaml`) into `dir`, as the
    /// kubelet mounts it at /etc/mirror-agent; the paths written, in the ConfigMap's order.
    #[track_caller]
    pub fn write_config_files(&self, dir: &Path) -> Vec<PathBuf> {
        let data = self.configmap["data"].as_mapping().expect("the ConfigMap's data");
        data.iter()
            .map(|(k, v)| {
                let path = dir.join(k.as_str().expect("a file name"));
                std::fs::write(&path, v.as_str().expect("a file's text"))
                    .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
                path
            })
            .collect()
    }

    /// The image `name` stands for after the kustomization's `images:` (name:tag).
    pub fn image(&self, name: &str) -> String {
        for i in seq(&self.kustomization["images"]) {
            if str_at(i, "name") == name {
                let new_name = i["newName"].as_str().unwrap_or(name);
                let tag = i["newTag"].as_str().unwrap_or("latest");
                return format!("{new_name}:{tag}");
            }
        }
        name.to_string()
    }

    /// A container of the pod: `initContainers` or `containers`, by name.
    #[track_caller]
    pub fn container(&self, name: &str) -> &Value {
        let spec = self.pod_spec();
        seq(&spec["initContainers"])
            .iter()
            .chain(seq(&spec["containers"]))
            .find(|c| c["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no container {name} in the DaemonSet"))
    }

    /// `podman run` arguments (after `run`, before nothing: image and arguments included) that
    /// run container `name` of the pod as the kubelet would on `node`.
    #[track_caller]
    pub fn podman_args(&self, name: &str, node: &Node<'_>) -> Vec<String> {
        let spec = self.pod_spec();
        let c = self.container(name);
        let mut a: Vec<String> = Vec::new();
        assert_eq!(spec["hostNetwork"].as_bool(), Some(true), "the agent runs in the node's network");
        a.push(format!("--network=ns:{}", node.netns_path));
        if spec["hostPID"].as_bool() == Some(true) {
            a.push("--pid=host".into());
        }

        let sc = &c["securityContext"];
        if sc["privileged"].as_bool() == Some(true) {
            a.push("--privileged".into());
        } else {
            let caps = &sc["capabilities"];
            for d in seq(&caps["drop"]) {
                a.push(format!("--cap-drop={}", d.as_str().expect("a capability")));
            }
            for add in seq(&caps["add"]) {
                a.push(format!("--cap-add=CAP_{}", add.as_str().expect("a capability")));
            }
        }
        match sc["seccompProfile"]["type"].as_str() {
            Some("Unconfined") => a.push("--security-opt=seccomp=unconfined".into()),
            Some("RuntimeDefault") | None => {}
            Some(other) => panic!("seccompProfile {other} is not run by the test"),
        }
        if sc["allowPrivilegeEscalation"].as_bool() == Some(false) {
            a.push("--security-opt=no-new-privileges".into());
        }
        if sc["readOnlyRootFilesystem"].as_bool() == Some(true) {
            a.push("--read-only".into());
        }
        if let Some(uid) = sc["runAsUser"].as_u64() {
            a.push(format!("--user={uid}"));
        }
        if let Some(mem) = c["resources"]["limits"]["memory"].as_str() {
            let bytes = mem.strip_suffix("Mi").map(|m| format!("{m}m")).unwrap_or_else(|| mem.to_string());
            a.push(format!("--memory={bytes}"));
        }

        // Environment, with the downward API's fields.
        let mut env: Vec<(String, String)> = Vec::new();
        for e in seq(&c["env"]) {
            let value = match (e["value"].as_str(), e["valueFrom"]["fieldRef"]["fieldPath"].as_str()) {
                (Some(v), _) => v.to_string(),
                (None, Some(field)) => node
                    .fields
                    .get(field)
                    .unwrap_or_else(|| panic!("the test gives no value for field {field}"))
                    .clone(),
                _ => panic!("env {e:?} is neither a value nor a fieldRef"),
            };
            env.push((str_at(e, "name").to_string(), value));
        }
        for (k, v) in &env {
            a.push(format!("--env={k}={v}"));
        }

        // Volumes: hostPath and configMap ones, with their propagation; an optional Secret the
        // test does not give is left out (the kubelet mounts it empty).
        let volumes: BTreeMap<&str, &Value> =
            seq(&spec["volumes"]).iter().map(|v| (str_at(v, "name"), v)).collect();
        for m in seq(&c["volumeMounts"]) {
            let vol = volumes.get(str_at(m, "name")).unwrap_or_else(|| panic!("no volume for {m:?}"));
            if vol["secret"]["optional"].as_bool() == Some(true) {
                continue;
            }
            let source = if let Some(host) = vol["hostPath"]["path"].as_str() {
                node.host_paths
                    .get(host)
                    .unwrap_or_else(|| panic!("the test maps no directory to {host}"))
                    .clone()
            } else if let Some(cm) = vol["configMap"]["name"].as_str() {
                node.config_maps.get(cm).unwrap_or_else(|| panic!("the test has no ConfigMap {cm}")).clone()
            } else {
                panic!("volume {vol:?} is neither hostPath, configMap nor an optional Secret")
            };
            let mut opts = Vec::new();
            if m["readOnly"].as_bool() == Some(true) {
                opts.push("ro");
            }
            match m["mountPropagation"].as_str() {
                Some("Bidirectional") => opts.push("rshared"),
                Some("HostToContainer") => opts.push("rslave"),
                Some("None") | None => {}
                Some(p) => panic!("mountPropagation {p}"),
            }
            let opts = if opts.is_empty() { String::new() } else { format!(":{}", opts.join(",")) };
            a.push(format!("--volume={}:{}{opts}", source.display(), str_at(m, "mountPath")));
        }

        // Image, then command (entrypoint) and arguments, $(VAR) expanded as the kubelet does.
        let expand =
            |s: &str| env.iter().fold(s.to_string(), |acc, (k, v)| acc.replace(&format!("$({k})"), v));
        let command: Vec<String> =
            seq(&c["command"]).iter().map(|v| expand(v.as_str().expect("a string"))).collect();
        if let Some((entry, rest)) = command.split_first() {
            a.push(format!("--entrypoint={entry}"));
            a.push(self.image(str_at(c, "image")));
            a.extend(rest.iter().cloned());
        } else {
            a.push(self.image(str_at(c, "image")));
        }
        a.extend(seq(&c["args"]).iter().map(|v| expand(v.as_str().expect("a string"))));
        a
    }

    /// The command of the container's exec startup probe, as the kubelet runs it.
    pub fn startup_probe_command(&self, name: &str) -> Vec<String> {
        let c = self.container(name);
        seq(&c["startupProbe"]["exec"]["command"])
            .iter()
            .map(|v| v.as_str().expect("a string").to_string())
            .collect()
    }

    /// The probes of the agent container: (kind, path, port).
    pub fn probes(&self, name: &str) -> Vec<(String, String, u16)> {
        let c = self.container(name);
        ["livenessProbe", "readinessProbe"]
            .iter()
            .filter_map(|k| {
                let g = &c[*k]["httpGet"];
                Some((k.to_string(), g["path"].as_str()?.to_string(), g["port"].as_u64()? as u16))
            })
            .collect()
    }
}
