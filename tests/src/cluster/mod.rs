//! The Kubernetes parts a node and a cluster are made of: containerd with the CNI plugins,
//! a control plane (etcd and kube-apiserver), pods set up as a kubelet sets them up, the
//! manifests under `deploy/` and the agent's image run with podman.

pub mod apps;
pub mod containerd;
pub mod control_plane;
pub mod coredns;
pub mod kube;
pub mod kube_proxy;
pub mod kubelet;
pub mod podman;
pub mod single_node;
