//! The views: what the agent shows of itself, as the API's JSON bodies, shared by the agent
//! and mirrorctl. The ground floor of the crate: it imports nothing of the agent, so every
//! module may use it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// POST /v1/rules body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRule {
    /// Rule text, as `mirrorctl rules add` takes it.
    pub rule: String,
}

/// A rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleView {
    /// Its id.
    pub id: u32,
    /// Canonical text.
    pub rule: String,
    /// What triggers it: `status`, `reset`, `noresponse`, `grpc-status` or `dns`.
    #[serde(default = "status_kind")]
    pub kind: String,
    /// Flows it triggered.
    pub hits: u64,
    /// Where it comes from: a cluster resource (`MirrorRule NAMESPACE/NAME`,
    /// `ClusterMirrorRule NAME`); none: added on this node (configuration, mirrorctl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// One direction of a flow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirView {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The other tuple of a connection translated by the node's conntrack (a Service).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatView {
    /// Lower endpoint of the server's tuple (after DNAT/SNAT).
    pub lo: String,
    /// Higher endpoint.
    pub hi: String,
}

/// A flow: one per connection, also across NAT.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowView {
    /// Lower endpoint (`addr:port`); across NAT, of the client's tuple (before DNAT).
    pub lo: String,
    /// Higher endpoint.
    pub hi: String,
    /// The server's tuple when conntrack translated the connection; traffic and marks of both
    /// tuples are counted here.
    #[serde(default)]
    pub nat: Option<NatView>,
    /// From `lo` to `hi`.
    pub forward: DirView,
    /// From `hi` to `lo`.
    pub reverse: DirView,
    /// Marked for mirroring by this rule.
    pub rule_id: Option<u32>,
    /// Status that triggered; for `grpc-status`, the gRPC code; for `dns`, the rcode (0 for the
    /// other kinds).
    pub status: Option<u16>,
    /// What triggered: `status`, `reset`, `noresponse`, `grpc-status`, `dns` or `drop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// Packets mirrored.
    pub mirrored_packets: u64,
    /// Mirroring ended (limit reached).
    pub mirror_ended: bool,
    /// Milliseconds since the last packet.
    pub idle_ms: u64,
    /// HTTP responses timed (request to status line).
    #[serde(default)]
    pub http_timed: u64,
    /// Their mean time, milliseconds.
    #[serde(default)]
    pub http_time_mean_ms: Option<f64>,
    /// Their longest time, milliseconds.
    #[serde(default)]
    pub http_time_max_ms: Option<f64>,
    /// SYN to the completing ACK, milliseconds.
    #[serde(default)]
    pub handshake_ms: Option<f64>,
    /// The pods among its endpoints (both tuples across NAT), with the host-side veth each is
    /// seen on.
    #[serde(default)]
    pub pods: Vec<FlowPod>,
}

/// An endpoint of a flow that is a pod's address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowPod {
    /// The endpoint, `addr:port`.
    pub endpoint: String,
    /// The pod, `namespace/name` (or the name alone when its namespace is not known).
    pub pod: String,
    /// Its host-side veth.
    pub interface: String,
    /// Its labels among `pods.labels` (from the container runtime).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A pod behind an attached veth (GET /v1/pods).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodView {
    /// The host-side veth.
    pub interface: String,
    /// Its index.
    pub ifindex: u32,
    /// The pod's name (the interface's when nothing better is known; see `source`).
    pub name: String,
    /// Its Kubernetes namespace, when known.
    pub namespace: Option<String>,
    /// Its UID (from the container runtime, else the cgroup path).
    pub uid: Option<String>,
    /// A container's id (from the cgroup path).
    pub container: Option<String>,
    /// Its sandbox's id (from the container runtime).
    #[serde(default)]
    pub sandbox: Option<String>,
    /// Its labels among `pods.labels` (from the container runtime).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A process in the pod's network namespace.
    pub pid: Option<u32>,
    /// The network namespace: its name under /run/netns, or /proc/PID/ns/net.
    pub netns: Option<String>,
    /// The pod-side interface.
    pub peer: Option<String>,
    /// Its addresses.
    pub addresses: Vec<String>,
    /// Where the name came from: cri, env, hostname, hostname-env, cgroup, netns, interface.
    pub source: String,
}

impl PodView {
    /// `namespace/name`, as Kubernetes and its tools write a pod in one string (client-go's
    /// cache keys, Hubble's flows), or the name alone when the namespace is not known.
    pub fn label(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// Whether `want` names this pod: `namespace/name`, the name alone, or `namespace/name`
    /// (the form this tool wrote before), unambiguous since a pod's name and namespace hold
    /// no '/'.
    pub fn is_named(&self, want: &str) -> bool {
        let swapped = self.namespace.as_ref().map(|ns| format!("{}/{ns}", self.name));
        self.name == want || self.label() == want || swapped.as_deref() == Some(want)
    }
}

/// A latency histogram (GET /v1/latency).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistogramView {
    /// Interface name ("" when not attached any more).
    pub interface: String,
    /// Interface index.
    pub ifindex: u32,
    /// http_response | tcp_handshake | dns_response | stack_rx_to_tc | ... (the stack group's).
    pub kind: String,
    /// HTTP status class (1-5), for http_response.
    pub class: Option<u8>,
    /// Intervals counted.
    pub count: u64,
    /// Sum of the intervals, seconds.
    pub sum_seconds: f64,
    /// Median, milliseconds.
    pub p50_ms: f64,
    /// 90th percentile, milliseconds.
    pub p90_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Non-empty buckets: [lower ns, upper ns, count].
    pub buckets: Vec<[u64; 3]>,
}

/// An attached interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceView {
    /// Link name.
    pub name: String,
    /// Link index.
    pub ifindex: u32,
    /// tcx | tc.
    pub mode: String,
    /// clone | mirred.
    pub method: String,
    /// Hooks attached.
    pub directions: Vec<String>,
}

/// The mirror sink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorView {
    /// Configured name.
    pub interface: String,
    /// Its index, when present.
    pub ifindex: Option<u32>,
    /// Whether the agent created it.
    pub created: bool,
    /// The interface copies are handed to: the sink, or the peer of a veth sink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies_to: Option<String>,
    /// "egress" (transmitted by `copies_to`) or "ingress" (received by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// The sink's link kind ("dummy", "veth", "vxlan", ...), when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Attach latency (link event received to classifier attached), milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyView {
    /// Attachments measured.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
}

/// GET /v1/status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    /// Agent version.
    pub version: String,
    /// Configured attach mode.
    pub attach_mode: String,
    /// The kernel has TCX (detected at start).
    pub tcx_available: bool,
    /// Pinned state of an earlier agent was adopted at start.
    pub adopted: bool,
    /// Attached interfaces.
    pub interfaces: Vec<InterfaceView>,
    /// The mirror sink.
    pub mirror: MirrorView,
    /// Classifier counters.
    pub counters: BTreeMap<String, u64>,
    /// Attach latency.
    pub attach_latency: LatencyView,
    /// How the tracing programs run (fexit or tp_btf), or why they cannot.
    #[serde(default)]
    pub tracing: String,
    /// Share of each CPU in the network stack over the last second (cpu group on).
    #[serde(default)]
    pub net_cpu: Vec<CpuShareView>,
    /// The pods behind the attached veths.
    #[serde(default)]
    pub pods: Vec<PodView>,
    /// The protocols the data path follows (`protocols:`), e.g. "http1, http2".
    #[serde(default)]
    pub protocols: String,
    /// The data path's programs and what loading each cost.
    #[serde(default)]
    pub programs: Vec<ProgramView>,
    /// DNS responses seen, by rcode (its name, `NXDOMAIN`, or its number for 12-15): those
    /// seen at least once.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dns_rcodes: BTreeMap<String, u64>,
    /// The pods' packets the kernel dropped, by reason (`netfilter_drop`; `subsystem` for a
    /// subsystem's reasons): those seen at least once.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub drops: BTreeMap<String, u64>,
    /// The same by pod (a drop counts at the pod it was going to, else the one it came from):
    /// for each pod and reason seen; a pod's counts leave with its interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_drops: Vec<PodDropView>,
    /// The kernel memory of the data path's maps on this node (none from an older agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryView>,
}

/// The pods' packets the kernel dropped for one reason, at one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodDropView {
    /// The pod (`namespace/name`); empty when the drop's flow was a pod's but no pod was found
    /// for it (its interface gone since, or its packet met nowhere near one).
    pub pod: String,
    /// Its host-side veth (empty with no pod).
    pub interface: String,
    /// The kernel's reason (`netfilter_drop`).
    pub reason: String,
    /// Packets dropped.
    pub packets: u64,
}

/// The kernel memory of the data path's maps, as the kernel accounts it (bpftool's
/// `memlock`): on this node, map by map, and what the configuration gives on other CPU counts
/// (per-CPU maps grow with the CPUs). `mirror-agent --check` prints the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryView {
    /// Possible CPUs of this node: per-CPU maps hold a value for each.
    pub cpus: u32,
    /// All the maps.
    pub total_bytes: u64,
    /// Each map, largest first.
    pub maps: Vec<MapMemoryView>,
    /// What the maps may take here, and what sets it (the host's memory, or a cgroup's
    /// limit); none when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<MemoryLimitView>,
    /// `flows.max` as configured: `auto` or a number.
    pub flows_max: String,
    /// What the configuration gives on other CPU counts.
    pub other_cpus: Vec<CpuMemoryView>,
}

/// One map's kernel memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapMemoryView {
    /// Its name in the classifier.
    pub name: String,
    /// Its entries (for the event ring: its bytes).
    pub entries: u32,
    /// Its kernel memory.
    pub bytes: u64,
    /// The setting that sizes it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sized_by: Option<String>,
}

/// The memory the maps may take on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLimitView {
    /// Bytes.
    pub bytes: u64,
    /// What sets it, in words.
    pub what: String,
}

/// The maps on a node of `cpus` CPUs with this configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuMemoryView {
    /// Possible CPUs.
    pub cpus: u32,
    /// Flows of the flow table there (`flows.max`, `auto` resolved for those CPUs).
    pub flows: u32,
    /// All the maps.
    pub total_bytes: u64,
}

/// One program of the data path, and what the verifier made of it at load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramView {
    /// Its name (`tcx_ingress_mirror`, `proto_http1`, ...).
    pub name: String,
    /// Instructions the verifier processed (its limit: 1,000,000).
    pub verified_insns: u32,
    /// The verifier's time on it, ms (when the kernel said).
    pub verify_ms: Option<f64>,
}

/// One CPU's time in the network stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuShareView {
    /// CPU number.
    pub cpu: u32,
    /// Share of the last second in send/receive system calls.
    pub syscall: f64,
    /// Share in NET_RX softirqs.
    pub softirq_rx: f64,
    /// Share in NET_TX softirqs.
    pub softirq_tx: f64,
    /// Since the group was switched on, seconds.
    pub syscall_seconds_total: f64,
    /// Likewise.
    pub softirq_rx_seconds_total: f64,
    /// Likewise.
    pub softirq_tx_seconds_total: f64,
}

/// An error reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
}

/// A timing group and whether it is on (GET /v1/latency/groups, PUT /v1/latency/groups/{group}).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupView {
    /// http | handshake | dns.
    pub group: String,
    /// Whether it measures.
    pub enabled: bool,
}

/// PUT /v1/latency/groups/{group} body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetGroup {
    /// Switch on or off.
    pub enabled: bool,
}

/// One side's view of a connection: the client-to-server direction's endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TupleView {
    /// The client (`addr:port`).
    pub client: String,
    /// The server (`addr:port`): on the client's side of a Service, its virtual address.
    pub server: String,
    /// The Community ID (v1, seed 0) of this tuple, as Zeek and Suricata log it.
    pub community_id: String,
}

/// A trigger: a response matched a rule and its flow is mirrored from there on
/// (GET /v1/events, and the lines of `events.output`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EventView {
    /// Its number, from 1, in the order the agent read them.
    pub seq: u64,
    /// When the response was seen (RFC 3339, UTC, milliseconds).
    pub time: String,
    /// The interface it was seen on (a pod's host-side veth).
    pub interface: String,
    /// Its ifindex.
    pub ifindex: u32,
    /// The pod behind that interface (`namespace/name`), when known.
    #[serde(default)]
    pub pod: Option<String>,
    /// Its labels among `pods.labels` (from the container runtime).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// ingress | egress of that interface.
    pub hook: String,
    /// The connection as the client sent it (before DNAT).
    pub client_side: TupleView,
    /// The connection as the server received it (after DNAT and SNAT); the same as
    /// `client_side` when not translated.
    pub server_side: TupleView,
    /// Whether the node's conntrack translated the connection (the two sides differ).
    pub nat: bool,
    /// The rule that matched.
    pub rule_id: u32,
    /// Its text ("" when deleted since).
    pub rule: String,
    /// What triggered: `status`, `reset`, `noresponse`, `grpc-status` or `dns`.
    #[serde(default = "status_kind")]
    pub kind: String,
    /// Who sent the packet that triggered: `client` or `server` (a reset: who reset; none for
    /// `noresponse`, which no packet triggers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The response's status; for `grpc-status`, the gRPC status code; for `dns`, the rcode (0
    /// for the other kinds).
    pub status: u16,
    /// For `grpc-status`: the code's canonical name (`INTERNAL`), for the codes gRPC names
    /// (0-16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_name: Option<String>,
    /// The request's protocol, `http1`, `http2` or `dns`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// HTTP/2: the request's stream id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<u32>,
    /// HTTP/2: the request's `:authority`, lower case, without a port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// The request's method, when it was seen.
    pub method: Option<String>,
    /// The request's target (its first 64 bytes; HTTP/2: its `:path`), when it was seen.
    pub target: Option<String>,
    /// DNS: the response's rcode (as `status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rcode: Option<u16>,
    /// DNS: the rcode's name (`NXDOMAIN`), for the rcodes DNS names (0-11).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rcode_name: Option<String>,
    /// DNS: the question's name, lower case, without the final dot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qname: Option<String>,
    /// DNS: the question's type (`28`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qtype: Option<u16>,
    /// DNS: the question type's name (`AAAA`), for the types a `qtype=` filter names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qtype_name: Option<String>,
    /// DNS: the message's id (the query's and its response's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u16>,
    /// Request (first segment) to status line, for `grpc-status` request to trailers, for
    /// `dns` query to response, milliseconds, when the request was seen.
    pub response_ms: Option<f64>,
    /// For `reset` and `noresponse`: from the request (the one pending, else the latest) to the
    /// reset, or the time it waited unanswered, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_request_ms: Option<f64>,
    /// Why no request is named (`method`, `target` and `request` absent): `not kept` (it was
    /// pending, but pushed out of the flow's queue by later ones, or uncertain after a loss of
    /// the stream's framing) or `none pending` (no request seen before the answer; DNS: the
    /// query was not seen, the question is the response's). Absent when the request is named:
    /// an event never names another request than the one behind it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_missing: Option<String>,
    /// The segment that carried the request behind the trigger, as the classifier kept it (it
    /// may hold other requests sent with it in one segment: the event names the one answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestView>,
    /// `drop`: the packet the kernel dropped, why and where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop: Option<DropView>,
    /// The capture of this trigger's flow kept on the node (`mirrorctl captures get ID`), when
    /// the recorder is on and could open one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CaptureRef>,
}

/// A packet the kernel dropped, behind a `drop` trigger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DropView {
    /// The kernel's reason (`netfilter_drop`: `SKB_DROP_REASON_NETFILTER_DROP`, lower case).
    pub reason: String,
    /// Where in the kernel (kfree_skb's caller), as `/proc/kallsyms` names it
    /// (`nf_hook_slow+0x8c`), else its address.
    pub location: String,
    /// Bytes of it copied (headers and the first bytes of the payload), of `wire_bytes`.
    pub bytes: usize,
    /// Its length (from its network header, with an Ethernet header's 14 bytes).
    pub wire_bytes: u32,
    /// Its copy was written to the sink (Ethernet source 02:64:72:6f:70:73), this many
    /// milliseconds after the drop; absent when not written (no sink, or it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_ms: Option<f64>,
}

/// Where a trigger's capture is: its id on the node, and its object storage key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CaptureRef {
    /// Its id on the node (`mirrorctl captures get ID`).
    pub id: u64,
    /// The node whose agent keeps it.
    pub node: String,
    /// The key it is (or is to be) stored under in object storage, when uploads are on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A capture kept by the recorder (GET /v1/captures).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CaptureView {
    /// Its id on the node.
    pub id: u64,
    /// When its trigger happened (RFC 3339, UTC, milliseconds).
    pub time: String,
    /// The pod (`namespace/name`) or interface of the trigger.
    pub pod: String,
    /// The rule's id and text.
    pub rule_id: u32,
    /// The rule's text.
    pub rule: String,
    /// What triggered: `500`, `grpc 13 INTERNAL`, `reset`...
    pub trigger: String,
    /// The request behind it, when seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The flow, `client -> server`.
    pub flow: String,
    /// Packets written.
    pub packets: u64,
    /// The file's size.
    pub bytes: u64,
    /// `open` (its flow is still mirrored), `complete` (closed when its flow's mirror ended),
    /// or `cut` (see `cut`).
    pub state: String,
    /// Why it was cut: the budget, a write error, the agent stopping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<String>,
    /// How its flow's mirror ended, once closed: `limit` (the rule's packets, bytes or
    /// duration), `connection closed`, `flow gone`, `idle`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// The object storage key, when uploads are on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Whether it is stored there (its pcapng then deleted from the node).
    #[serde(default)]
    pub uploaded: bool,
    /// Attempts to upload it that failed so far, and the last one's error.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub upload_failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_error: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The request behind a trigger: the start of the segment that carried it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RequestView {
    /// Its bytes as text (invalid UTF-8 replaced), at most 512 bytes of it; absent for a DNS
    /// query, whose message is binary (`qname`, `qtype` and `id` name it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    /// How many bytes of the request were kept.
    pub bytes: usize,
    /// The segment was longer than what was kept.
    pub cut: bool,
    /// How long before the response it passed, milliseconds.
    pub before_ms: f64,
    /// The sink received it ahead of the response (Ethernet source 02:72:65:70:6c:79).
    pub replayed: bool,
}

/// GET /v1/events query.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventQuery {
    /// Events numbered after this one (0: from the oldest kept).
    #[serde(default)]
    pub after: u64,
    /// At most this many (the newest), default 100.
    pub limit: Option<usize>,
    /// When there are none yet, wait this many seconds (at most 30) for the next.
    #[serde(default)]
    pub wait: u64,
}

fn status_kind() -> String {
    "status".into()
}
