//! The manifests under `deploy/` against the Kubernetes schemas (kubernetes-validate, offline
//! once installed by scripts/install-deps.sh; strict: unknown fields are errors), for the
//! oldest and newest versions it knows that the DaemonSet's fields need; and the rules that
//! the schemas do not carry but the API server or the kubelet enforce.

use std::path::PathBuf;
use std::process::Command;

use mirror_e2e::cluster::kube::{deploy_dir, load, Manifests};

/// Where scripts/install-deps.sh installs the validator.
const VALIDATOR: &str = "/opt/kubernetes-validate/bin/kubernetes-validate";
/// DaemonSet maxSurge is GA from 1.25; the newest schema the validator ships.
const VERSIONS: [&str; 2] = ["1.25.0", "1.37.0"];

fn validator() -> PathBuf {
    let p = PathBuf::from(std::env::var("KUBERNETES_VALIDATE").unwrap_or_else(|_| VALIDATOR.into()));
    assert!(p.is_file(), "{} is missing: run scripts/install-deps.sh", p.display());
    p
}

fn validate(files: &[PathBuf], version: &str) -> (bool, String) {
    let out = Command::new(validator())
        .args(["--strict", "--quiet", "-k", version])
        .args(files)
        .output()
        .expect("running kubernetes-validate");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The resources the kustomization lists.
fn resources() -> Vec<PathBuf> {
    let k = load(&deploy_dir().join("kustomization.yaml"));
    let list: Vec<PathBuf> = k["resources"]
        .as_sequence()
        .expect("kustomization resources")
        .iter()
        .map(|r| deploy_dir().join(r.as_str().expect("a file name")))
        .collect();
    assert!(list.len() >= 4, "{list:?}");
    list
}

#[test]
fn the_manifests_validate_against_the_kubernetes_schemas() {
    let files = resources();
    // Every YAML file of deploy/ is in the kustomization.
    for e in std::fs::read_dir(deploy_dir()).expect("deploy/") {
        let p = e.expect("an entry").path();
        if p.extension().is_some_and(|x| x == "yaml") && !p.ends_with("kustomization.yaml") {
            assert!(files.contains(&p), "{} is not in kustomization.yaml", p.display());
        }
    }
    for v in VERSIONS {
        let (ok, text) = validate(&files, v);
        assert!(ok, "against Kubernetes {v}:\n{text}");
    }
}

#[test]
fn the_validator_refuses_a_broken_daemonset() {
    // The check above can fail: the same DaemonSet with an unknown field and a wrong type.
    let dir = tempfile::tempdir().expect("a temp dir");
    let text = std::fs::read_to_string(deploy_dir().join("daemonset.yaml")).expect("daemonset.yaml");
    for (what, broken) in [
        ("unknown field", text.replace("hostNetwork: true", "hostNetwork: true\n      hostNetworking: true")),
        (
            "wrong type",
            text.replace("terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: soon"),
        ),
    ] {
        assert_ne!(broken, text, "{what}: nothing replaced");
        let f = dir.path().join("daemonset.yaml");
        std::fs::write(&f, broken).expect("writing");
        let (ok, out) = validate(&[f], VERSIONS[1]);
        assert!(!ok, "{what} passed: {out}");
    }
}

#[test]
fn the_pod_spec_keeps_the_rules_the_schemas_do_not_carry() {
    let m = Manifests::load();
    let spec = m.pod_spec();
    let containers =
        spec["initContainers"].as_sequence().into_iter().chain(spec["containers"].as_sequence()).flatten();
    for c in containers {
        let name = c["name"].as_str().expect("a name");
        let privileged = c["securityContext"]["privileged"].as_bool() == Some(true);
        // The API server refuses Bidirectional propagation outside privileged containers.
        for mnt in c["volumeMounts"].as_sequence().into_iter().flatten() {
            if mnt["mountPropagation"].as_str() == Some("Bidirectional") {
                assert!(privileged, "{name}: Bidirectional mount in a container that is not privileged");
            }
        }
        // With hostNetwork a declared port is a host port: the surge pod of an upgrade could
        // not be scheduled beside the old one.
        assert!(c["ports"].is_null(), "{name} declares ports");
        // A pull policy that works with a node-local or pushed image.
        assert_eq!(c["imagePullPolicy"].as_str(), Some("IfNotPresent"), "{name}");
    }
    let agent = m.container("agent");
    assert_ne!(
        agent["securityContext"]["privileged"].as_bool(),
        Some(true),
        "the agent runs with capabilities"
    );
    let strategy = &m.daemonset["spec"]["updateStrategy"];
    assert_eq!(strategy["rollingUpdate"]["maxUnavailable"].as_u64(), Some(0), "{strategy:?}");
    assert!(agent["args"].as_sequence().expect("args").iter().any(|a| a.as_str() == Some("--take-over")));
    assert!(spec["tolerations"]
        .as_sequence()
        .expect("tolerations")
        .iter()
        .any(|t| t["operator"] == "Exists"));
    // The image the kustomization names is the one the image test builds.
    assert_eq!(m.image("mirror-agent"), "localhost/mirror-agent:dev");
}

#[test]
fn the_configmap_configuration_passes_the_agents_check() {
    let m = Manifests::load();
    let dir = tempfile::tempdir().expect("a temp dir");
    let files = m.write_config_files(dir.path());
    // As the DaemonSet gives them: the ConfigMap's files, agent.yaml first.
    let names: Vec<_> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["agent.yaml", "overrides.yaml"]);
    let args = m.container("agent")["args"].as_sequence().expect("the agent's args").clone();
    let configs: Vec<&str> = args.iter().filter_map(|a| a.as_str()?.strip_prefix("--config=")).collect();
    assert_eq!(configs, ["/etc/mirror-agent/agent.yaml", "/etc/mirror-agent/overrides.yaml"]);
    let bins = mirror_e2e::agent::Binaries::locate().expect("the binaries");
    let mut cmd = Command::new(&bins.agent);
    for f in &files {
        cmd.arg("--config").arg(f);
    }
    let out = cmd.arg("--check").output().expect("mirror-agent --check");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("configuration is valid: ") && said.contains("overrides.yaml over "), "{said}");
}
