//! The Kubernetes CRI v1 API (`runtime.v1`), its messages generated at build time from the
//! published `api.proto` of k8s.io/cri-api (pinned, with its licence, in `proto/cri-api/`;
//! `build.rs` compiles it with protox and prost-build, so the build needs no `protoc`). Pods are
//! named with three calls of `runtime.v1.RuntimeService`: `Version`, `ListPodSandbox` and
//! `PodSandboxStatus`, whose paths are below. The same messages serve a test's fake runtime.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/runtime.v1.rs"));
}

pub use generated::*;

/// The service's gRPC name.
pub const SERVICE: &str = "runtime.v1.RuntimeService";
/// `rpc Version(VersionRequest) returns (VersionResponse)`.
pub const VERSION: &str = "/runtime.v1.RuntimeService/Version";
/// `rpc ListPodSandbox(ListPodSandboxRequest) returns (ListPodSandboxResponse)`.
pub const LIST_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
/// `rpc PodSandboxStatus(PodSandboxStatusRequest) returns (PodSandboxStatusResponse)`.
pub const POD_SANDBOX_STATUS: &str = "/runtime.v1.RuntimeService/PodSandboxStatus";

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// The paths above are the service's, as the published file declares them.
    #[test]
    fn the_paths_are_the_published_services() {
        let proto = include_str!("../../proto/cri-api/api.proto");
        assert!(proto.contains("package runtime.v1;") && proto.contains("service RuntimeService {"));
        for path in [VERSION, LIST_POD_SANDBOX, POD_SANDBOX_STATUS] {
            let (service, method) = path.trim_start_matches('/').split_once('/').expect("a path");
            assert_eq!(service, SERVICE);
            assert!(
                proto.contains(&format!("rpc {method}({method}Request)")),
                "{method} is not in api.proto"
            );
        }
    }

    /// A status as containerd sends it decodes into the generated messages: the fields the
    /// agent reads, with their numbers from the published file.
    #[test]
    fn a_status_round_trips_with_the_fields_the_agent_reads() {
        let sent = PodSandboxStatusResponse {
            status: Some(PodSandboxStatus {
                id: "sb".into(),
                metadata: Some(PodSandboxMetadata {
                    name: "web-0".into(),
                    uid: "u".into(),
                    namespace: "shop".into(),
                    attempt: 0,
                }),
                state: PodSandboxState::SandboxReady as i32,
                network: Some(PodSandboxNetworkStatus {
                    ip: "198.18.96.2".into(),
                    additional_ips: vec![PodIp { ip: "2001:2:0:96::2".into() }],
                }),
                linux: Some(LinuxPodSandboxStatus {
                    namespaces: Some(Namespace {
                        options: Some(NamespaceOption {
                            network: NamespaceMode::Node as i32,
                            ..Default::default()
                        }),
                    }),
                }),
                labels: [("app".to_string(), "web".to_string())].into(),
                ..Default::default()
            }),
            info: [("info".to_string(), r#"{"pid":42}"#.to_string())].into(),
            ..Default::default()
        };
        let bytes = sent.encode_to_vec();
        assert_eq!(PodSandboxStatusResponse::decode(bytes.as_slice()).expect("decoding"), sent);
        // status = 1, info = 2; in the status, network = 5, linux = 6, labels = 7.
        let status = sent.status.as_ref().expect("a status").encode_to_vec();
        assert_eq!(bytes[0], 1 << 3 | 2, "status is field 1");
        assert!(status.windows(2).any(|w| w[0] == (5 << 3 | 2)), "network is field 5");
    }
}
