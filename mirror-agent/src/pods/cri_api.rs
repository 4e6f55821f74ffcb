//! The part of the Kubernetes CRI v1 API (`runtime.v1.RuntimeService`, `api.proto` of
//! k8s.io/cri-api) that names pods: `Version`, `ListPodSandbox` and `PodSandboxStatus`, their
//! messages written out with the same field numbers and types as the official file. Fields
//! left out are skipped on decoding, as protobuf does with any field it does not know.
//!
//! Written out rather than generated, so that the build needs no `protoc`. The same messages
//! serve a test's fake runtime.

use std::collections::HashMap;

/// The service's gRPC name.
pub const SERVICE: &str = "runtime.v1.RuntimeService";
/// `rpc Version(VersionRequest) returns (VersionResponse)`.
pub const VERSION: &str = "/runtime.v1.RuntimeService/Version";
/// `rpc ListPodSandbox(ListPodSandboxRequest) returns (ListPodSandboxResponse)`.
pub const LIST_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
/// `rpc PodSandboxStatus(PodSandboxStatusRequest) returns (PodSandboxStatusResponse)`.
pub const POD_SANDBOX_STATUS: &str = "/runtime.v1.RuntimeService/PodSandboxStatus";

/// `enum PodSandboxState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PodSandboxState {
    /// `SANDBOX_READY`.
    SandboxReady = 0,
    /// `SANDBOX_NOTREADY`.
    SandboxNotready = 1,
}

/// `enum NamespaceMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NamespaceMode {
    /// `POD`: the pod's own namespace.
    Pod = 0,
    /// `CONTAINER`.
    Container = 1,
    /// `NODE`: the node's namespace (`hostNetwork`).
    Node = 2,
    /// `TARGET`.
    Target = 3,
}

/// `message VersionRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    /// The kubelet's API version.
    #[prost(string, tag = "1")]
    pub version: String,
}

/// `message VersionResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    /// Version of the kubelet runtime API.
    #[prost(string, tag = "1")]
    pub version: String,
    /// `containerd`, `cri-o`, ...
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    /// Its version.
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    /// The CRI version it speaks.
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

/// `message PodSandboxStateValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStateValue {
    /// The state.
    #[prost(enumeration = "PodSandboxState", tag = "1")]
    pub state: i32,
}

/// `message PodSandboxFilter`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxFilter {
    /// A sandbox's id.
    #[prost(string, tag = "1")]
    pub id: String,
    /// Its state.
    #[prost(message, optional, tag = "2")]
    pub state: Option<PodSandboxStateValue>,
    /// Labels it must carry.
    #[prost(map = "string, string", tag = "3")]
    pub label_selector: HashMap<String, String>,
}

/// `message ListPodSandboxRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {
    /// Which sandboxes.
    #[prost(message, optional, tag = "1")]
    pub filter: Option<PodSandboxFilter>,
}

/// `message PodSandboxMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    /// The pod's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The pod's UID.
    #[prost(string, tag = "2")]
    pub uid: String,
    /// The pod's Kubernetes namespace.
    #[prost(string, tag = "3")]
    pub namespace: String,
    /// How many sandboxes the pod had before this one.
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

/// `message PodSandbox`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    /// The sandbox's id.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The pod it is for.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    /// Its state.
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    /// Created, nanoseconds since the epoch.
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    /// The pod's labels.
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
    /// The pod's annotations.
    #[prost(map = "string, string", tag = "6")]
    pub annotations: HashMap<String, String>,
}

/// `message ListPodSandboxResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    /// The sandboxes.
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

/// `message PodSandboxStatusRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusRequest {
    /// The sandbox's id.
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    /// Also the runtime's own `info` (its pause process, its network namespace's path).
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

/// `message PodIP`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodIp {
    /// An address.
    #[prost(string, tag = "1")]
    pub ip: String,
}

/// `message PodSandboxNetworkStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxNetworkStatus {
    /// The pod's address.
    #[prost(string, tag = "1")]
    pub ip: String,
    /// Its other addresses (the other family's).
    #[prost(message, repeated, tag = "2")]
    pub additional_ips: Vec<PodIp>,
}

/// `message NamespaceOption`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceOption {
    /// Whose network namespace the pod has.
    #[prost(enumeration = "NamespaceMode", tag = "1")]
    pub network: i32,
}

/// `message Namespace`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Namespace {
    /// The pod's namespaces.
    #[prost(message, optional, tag = "2")]
    pub options: Option<NamespaceOption>,
}

/// `message LinuxPodSandboxStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxStatus {
    /// The pod's namespaces.
    #[prost(message, optional, tag = "1")]
    pub namespaces: Option<Namespace>,
}

/// `message PodSandboxStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    /// The sandbox's id.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The pod it is for.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    /// Its state.
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    /// Created, nanoseconds since the epoch.
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    /// The pod's addresses.
    #[prost(message, optional, tag = "5")]
    pub network: Option<PodSandboxNetworkStatus>,
    /// Its namespaces.
    #[prost(message, optional, tag = "6")]
    pub linux: Option<LinuxPodSandboxStatus>,
    /// The pod's labels.
    #[prost(map = "string, string", tag = "7")]
    pub labels: HashMap<String, String>,
}

/// `message PodSandboxStatusResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    /// The sandbox.
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
    /// With `verbose`: what the runtime adds, in JSON; containerd and CRI-O put it under
    /// `info` (the pause process's `pid`, `runtimeSpec.linux.namespaces`).
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Bytes as the official generated code encodes them (field numbers and wire types).
    #[test]
    fn wire_format_matches_the_official_field_numbers() {
        let req = PodSandboxStatusRequest { pod_sandbox_id: "ab".into(), verbose: true };
        // field 1, length-delimited "ab"; field 2, varint 1.
        assert_eq!(req.encode_to_vec(), [0x0a, 2, b'a', b'b', 0x10, 1]);
        let filter = ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                state: Some(PodSandboxStateValue { state: PodSandboxState::SandboxNotready as i32 }),
                ..Default::default()
            }),
        };
        // filter (1) { state (2) { state (1) = 1 } }
        assert_eq!(filter.encode_to_vec(), [0x0a, 4, 0x12, 2, 0x08, 1]);
        // A field this subset leaves out (containers_statuses, 3) is skipped.
        let mut raw = PodSandboxStatusResponse { status: None, info: HashMap::new() }.encode_to_vec();
        raw.extend([0x1a, 0]);
        raw.extend(
            PodSandboxStatusResponse { status: None, info: [("info".into(), "{}".into())].into() }
                .encode_to_vec(),
        );
        let back = PodSandboxStatusResponse::decode(raw.as_slice()).unwrap();
        assert_eq!(back.info.get("info").map(String::as_str), Some("{}"));
    }
}
