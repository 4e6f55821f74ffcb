//! Where a test runs: network namespaces joined by veth pairs and a mirror sink, the testbed
//! that loads and attaches the classifier in them, kube-proxy's Service NAT in the node and the
//! tc state of an interface.

pub mod kubeproxy;
pub mod netns;
pub mod tc;
pub mod testbed;
