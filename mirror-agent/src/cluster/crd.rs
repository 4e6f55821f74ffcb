//! The two resources a cluster's mirror rules are written as (API group `mirror.ebpf.io`,
//! version `v1alpha1`): `MirrorRule`, namespaced, which selects pods of its own namespace (a
//! team mirrors its own services without cluster rights), and `ClusterMirrorRule`, which
//! selects pods of the namespaces its `namespaceSelector` picks. Both carry the rule's
//! fields (the syntax of `mirrorctl rules add`, one field per token), which pods and nodes
//! it covers, and when it ends; their status says, per node, what that node's agent made of
//! it. `mirror-agent --crds` prints the CustomResourceDefinitions (`deploy/crds.yaml`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "mirror.ebpf.io";
/// The version served.
pub const VERSION: &str = "v1alpha1";

/// A rule's trigger, request filters, per-flow limits, and reach. At least one trigger field
/// (`status`, `grpcStatus`, `dns`, `reset`, `noResponse`, `latency`, `drop`) is needed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleFields {
    /// HTTP statuses that trigger, as `status=` takes them: `500`, `5xx`, `500-504`. The
    /// HTTP/1.x status line and HTTP/2's `:status` alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// gRPC status codes (in a call's trailers) that trigger: codes 0-63 or gRPC's names, as
    /// `grpc-status=` takes them: `13`, `internal,unavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<String>,
    /// DNS response codes that trigger, as `dns=` takes them: names (`NXDOMAIN`, `SERVFAIL`,
    /// any case) or numbers 0-15, or `any` alone for all: `[NXDOMAIN, SERVFAIL]`, `[3]`, `[any]`.
    /// With `latency`, only answers at least that slow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "rcodes_schema")]
    pub dns: Option<Vec<IntOrString>>,
    /// A TCP reset of an HTTP connection triggers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<bool>,
    /// The kernel dropping a packet of the pod's flow triggers, for these reasons: the kernel's
    /// names (`SKB_DROP_REASON_*` lower case, without the prefix), as `drop=` takes them:
    /// `[netfilter_drop]`, `[netfilter_drop, no_socket]`, or `[any]` for every real drop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop: Option<Vec<String>>,
    /// A request unanswered for this long triggers (`2s`, `500ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_response: Option<String>,
    /// Only responses at least this slow (`200ms`); without `status`, any status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<String>,
    /// Only responses from this server port (the pod's port, after any Service translation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u32>,
    /// Only requests with these methods: `POST`, `GET,POST`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Only requests whose target (HTTP/2: `:path`) begins with this: `/api/checkout`,
    /// `/pkg.Service/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Only requests to this host (`Host` header, HTTP/2 `:authority`), without a port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// With `dns` or `noResponse`: only questions for this name or a name under it
    /// (`example.com`), or under it only (`.svc.cluster.local`); after a `!`, the names those
    /// leave out (`"!.cluster.local"`, quoted: YAML reads `!` as a tag); case-insensitive, up to
    /// 64 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qname: Option<String>,
    /// With `dns` or `noResponse`: only questions of this type: `A`, `AAAA`, `MX`, `SRV`, ... or
    /// a number 1-65535.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qtype: Option<IntOrString>,
    /// Packets mirrored per flow at most (0: no limit; default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<u64>,
    /// Bytes mirrored per flow at most (0: no limit, the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// How long a flow is mirrored after its trigger at most (`30s`; `0`: until a limit above;
    /// default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// The pods whose flows the rule applies to, as the server of the flow (the pod that sent
    /// the response, was reset, or was asked): a label selector. Absent: every pod (of the
    /// rule's namespace, for a MirrorRule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// The nodes whose agents apply the rule, by the Node's labels. Absent: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// When the rule ends by itself (RFC 3339). Flows it marked before stay mirrored until
    /// their limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// How long after its creation the rule ends by itself (`2h`); with `expiresAt`, the
    /// earlier of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

/// `dns`: a list of rcodes, each a name or a number (without IntOrString's generic description).
fn rcodes_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "nullable": true,
        "items": {
            "description": "An rcode: its name (NXDOMAIN) or its number (3), or any.",
            "x-kubernetes-int-or-string": true
        }
    })
}

/// A mirror rule for pods of its own namespace.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "mirror.ebpf.io",
    version = "v1alpha1",
    kind = "MirrorRule",
    plural = "mirrorrules",
    shortname = "mrule",
    category = "mirror",
    namespaced,
    status = "RuleStatus",
    printcolumn = r#"{"name":"Rule","type":"string","jsonPath":".status.rule"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".spec.expiresAt"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MirrorRuleSpec {
    /// The rule.
    #[serde(flatten)]
    pub rule: RuleFields,
}

/// A mirror rule for pods of the namespaces it selects.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "mirror.ebpf.io",
    version = "v1alpha1",
    kind = "ClusterMirrorRule",
    plural = "clustermirrorrules",
    shortname = "cmrule",
    category = "mirror",
    status = "RuleStatus",
    printcolumn = r#"{"name":"Rule","type":"string","jsonPath":".status.rule"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".spec.expiresAt"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterMirrorRuleSpec {
    /// The rule.
    #[serde(flatten)]
    pub rule: RuleFields,
    /// The namespaces whose pods the rule covers, by their labels (every namespace has
    /// `kubernetes.io/metadata.name`). Absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// What the agents made of a rule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleStatus {
    /// The rule as the agents read it (`mirrorctl rules add` syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// `Valid`: whether the spec is a rule (when not, why, in words); `Expired`: whether its
    /// time is over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<RuleCondition>,
    /// One entry per node that has something to say of the rule (pods it selects there, hits,
    /// or a rule it could not install), written by that node's agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub nodes: Vec<NodeStatus>,
}

/// A condition of a rule, the same from every agent (it depends on the spec only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleCondition {
    /// `Valid`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// `Parsed`, or what is wrong: `InvalidRule`.
    pub reason: String,
    /// In words.
    pub message: String,
    /// The spec's generation this says something of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One node's view of a rule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// The node.
    pub node: String,
    /// `Active` (installed), or `Rejected` (a rule this node could not install: see
    /// `message`).
    pub state: String,
    /// Why, in words, when not `Active`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The rule's id on this node (`mirrorctl rules list`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_id: Option<u32>,
    /// Pods on this node it selects.
    pub pods: u32,
    /// Flows it triggered on this node.
    pub hits: u64,
    /// Its latest trigger on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_trigger: Option<LastTrigger>,
    /// The spec's generation this entry says something of.
    pub observed_generation: i64,
}

/// A trigger as the status shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastTrigger {
    /// When (RFC 3339).
    pub time: String,
    /// The pod (`namespace/name`) or interface it was seen at.
    pub pod: String,
    /// What triggered: `500`, `grpc 13 INTERNAL`, `dns NXDOMAIN`, `reset`, `noresponse`.
    pub trigger: String,
    /// The request behind it (`GET /path`; DNS: the question, `AAAA web.shop.svc.cluster.local`),
    /// when seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Both tuples of the flow (`client -> server`).
    pub flow: String,
    /// Its capture: the id on `node` (`kubectl exec` into that node's agent: `mirrorctl
    /// captures get ID -w FILE`), and its object storage key when uploads are on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<crate::views::CaptureRef>,
}

/// Both CustomResourceDefinitions as YAML documents (`deploy/crds.yaml`, `mirror-agent --crds`).
pub fn crds_yaml() -> String {
    use kube::CustomResourceExt;
    let mut out = String::from(
        "# Generated by `mirror-agent --crds`: the mirror rules' CustomResourceDefinitions.\n\
         # Edit mirror-agent/src/cluster/crd.rs and regenerate; a test compares the two.\n",
    );
    for crd in [MirrorRule::crd(), ClusterMirrorRule::crd()] {
        let mut doc = serde_yaml_ng::to_value(&crd).expect("a CRD serialises");
        drop_unknown_formats(&mut doc);
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&doc).expect("a CRD serialises"));
    }
    out
}

/// Removes the `format`s of integer schemas that the API server does not know (`uint64`,
/// `uint32`... from Rust's unsigned types): `kubectl apply` warns of each ("unrecognized
/// format"). The bounds are the fields' own; `int32` and `int64` stay.
fn drop_unknown_formats(v: &mut serde_yaml_ng::Value) {
    use serde_yaml_ng::Value;
    match v {
        Value::Mapping(m) => {
            let unknown = m
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| f.starts_with("uint") || f == "int8" || f == "int16");
            if unknown {
                m.shift_remove("format");
            }
            for (_, child) in m.iter_mut() {
                drop_unknown_formats(child);
            }
        }
        Value::Sequence(s) => s.iter_mut().for_each(drop_unknown_formats),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `format` in the schema is one the API server knows: `kubectl apply` prints no
    /// "unrecognized format" warning.
    #[test]
    fn the_schema_has_only_formats_the_api_server_knows() {
        let known = ["int32", "int64", "date-time", "double", "float", "byte"];
        for line in crds_yaml().lines() {
            if let Some(f) = line.trim().strip_prefix("format: ") {
                assert!(known.contains(&f), "format {f} is not one the API server knows");
            }
        }
    }

    #[test]
    fn deploy_holds_the_generated_crds() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds.yaml");
        let file = std::fs::read_to_string(path).unwrap_or_default();
        assert!(file == crds_yaml(), "deploy/crds.yaml differs from `mirror-agent --crds`: regenerate it");
    }

    /// The pod of `status.nodes[].lastTrigger` is written as the schema's description says:
    /// the agent's label of a pod is `namespace/name`, and the generated schema describes
    /// that form, so `kubectl get mirrorrule -o yaml` and its explanation agree.
    #[test]
    fn the_last_triggers_pod_is_written_as_its_schema_says() {
        let pod = crate::views::PodView {
            interface: "veth1".into(),
            ifindex: 7,
            name: "checkout-7d9f".into(),
            namespace: Some("shop".into()),
            uid: None,
            container: None,
            sandbox: None,
            labels: Default::default(),
            pid: None,
            netns: None,
            peer: None,
            addresses: vec![],
            source: "cri".into(),
        };
        let schema = serde_json::to_value(schemars::schema_for!(LastTrigger)).unwrap();
        let described = schema["properties"]["pod"]["description"].as_str().unwrap_or_default().to_string();
        assert!(described.contains("`namespace/name`"), "{described}");
        assert_eq!(pod.label(), "shop/checkout-7d9f");
        // Both forms are taken on input; the name alone too.
        for want in ["shop/checkout-7d9f", "checkout-7d9f/shop", "checkout-7d9f"] {
            assert!(pod.is_named(want), "{want}");
        }
        assert!(!pod.is_named("bank/checkout-7d9f"));
        assert!(crds_yaml().contains("description: The pod (`namespace/name`) or interface it was seen at."));
    }

    #[test]
    fn list_maps_are_keyed() {
        let yaml = crds_yaml();
        assert!(yaml.contains("x-kubernetes-list-map-keys"), "{yaml}");
        assert_eq!(yaml.matches("kind: CustomResourceDefinition").count(), 2);
    }
}
