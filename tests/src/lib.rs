//! Harness of the end-to-end tests: a node network namespace routing between pod namespaces
//! over veth pairs, real HTTP servers and clients in them, packet captures on a pod and on the
//! mirror sink, the oracle that says which captured packets the mirror must carry, and
//! mirror-agent with mirrorctl run as an operator runs them; kube-proxy's Service NAT in the
//! node and the oracle of a mirror across it; a node of containerd and the CNI bridge plugin
//! whose pods are made through the CRI, as a kubelet makes them; a Kubernetes control plane
//! (etcd and kube-apiserver, no kubelet) in a namespace of its own, for the agent's API clients.
//!
//! Everything runs in namespaces created here (198.18.0.0/15 and 2001:2::/48 only) and is
//! removed on drop, panics included.

pub mod agent;
pub mod capture;
pub mod client;
pub mod containerd;
pub mod control_plane;
pub mod crowd;
pub mod flood;
pub mod footprint;
pub mod h2_oracle;
pub mod h2_scenario;
pub mod h2_stacks;
pub mod http_stream;
pub mod kube;
pub mod kubelet;
pub mod kubeproxy;
pub mod load;
pub mod mirror_watch;
pub mod nat_oracle;
pub mod netns;
pub mod oracle;
pub mod pcap;
pub mod podman;
pub mod proc;
pub mod raw;
pub mod scenario;
pub mod servers;
pub mod tc;
pub mod testbed;
pub mod tshark;
