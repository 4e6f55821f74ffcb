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
//!
//! By concern: [`topology`] (namespaces, veths, the testbed, kube-proxy's NAT, tc state),
//! [`workload`] (servers, clients and load), [`oracles`] (what the mirror must carry),
//! [`capture`] (what was seen: captures, their readers, the agent's footprint) and [`cluster`]
//! (containerd, the control plane, kubelet-made pods, podman). At the root, the vocabulary all
//! of them share: [`agent`] (the system under test as an operator runs it), [`proc`] (child
//! processes and bounded waits) and [`scenario`] (the scenarios several tests share).

pub mod agent;
pub mod capture;
pub mod cluster;
pub mod oracles;
pub mod proc;
pub mod scenario;
pub mod topology;
pub mod workload;
