//! CoreDNS as the cluster's DNS: its ConfigMap, RBAC, a Deployment of the workloads' image
//! ([`crate::cluster::apps::APPS_IMAGE`]) in `kube-system`, and the Service `kube-dns` at
//! [`DNS_IP`], which the kubelet gives the pods as their resolver.

use std::net::Ipv4Addr;

use crate::cluster::apps::APPS_IMAGE;

/// The cluster DNS Service's address (in [`crate::cluster::control_plane::SERVICE_RANGE`]).
pub const DNS_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 250, 138);
/// CoreDNS's ConfigMap, RBAC, Deployment and Service.
pub fn manifests() -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: coredns, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects: [{{kind: ServiceAccount, name: coredns, namespace: kube-system}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: coredns, namespace: kube-system}}
data:
  Corefile: |
    .:53 {{
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }}
        cache 30
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: coredns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{k8s-app: kube-dns}}}}
  template:
    metadata: {{labels: {{k8s-app: kube-dns}}}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
        - name: coredns
          image: {APPS_IMAGE}
          imagePullPolicy: Never
          command: [/usr/local/bin/coredns, -conf, /etc/coredns/Corefile]
          volumeMounts: [{{name: config, mountPath: /etc/coredns, readOnly: true}}]
          readinessProbe: {{httpGet: {{path: /ready, port: 8181}}, periodSeconds: 2}}
      volumes: [{{name: config, configMap: {{name: coredns}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: kube-dns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  clusterIP: {DNS_IP}
  selector: {{k8s-app: kube-dns}}
  ports:
    - {{name: dns, port: 53, protocol: UDP}}
    - {{name: dns-tcp, port: 53, protocol: TCP}}
"#
    )
}
