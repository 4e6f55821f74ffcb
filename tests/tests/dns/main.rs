//! DNS failures as triggers, against real resolvers and real clients: dnsmasq and CoreDNS (built
//! from its Go module), each in turn in the server pod (a zone that answers, names that do not
//! exist, a forward to an upstream that answers SERVFAIL or REFUSED; see
//! `mirror_e2e::workload::dns` and `mirror_e2e::workload::coredns`), asked by dig (one lookup
//! per 5-tuple, its status recorded per lookup; over UDP, and over TCP with `+tcp`, a connection
//! per lookup), by glibc's getaddrinfo (A and AAAA at once on one socket) and by Go's resolver
//! (A and AAAA at once, a socket each, the sockets recorded by the client), pod to resolver and
//! through a kube-dns-like ClusterIP (UDP and TCP port 53, DNAT by iptables or nftables rules in
//! the manner of kube-proxy; IPv4, and IPv6).
//!
//! The truth is the clients' own record: dig's status of each lookup, getaddrinfo's result, and
//! the client's capture for the sockets getaddrinfo chose; Go's result and the sockets it
//! recorded. A rule `dns=RCODES` marks a client's
//! flow (its UDP socket, or its TCP connection) at the first response of it the rule covers;
//! each such flow has exactly one trigger event naming that exchange's question (id, name, type)
//! and response code, and the mirror carries, exactly once each, every datagram or segment of
//! the flow from that response on, and each query of the flow sent before the mark and answered
//! at or after it, replayed as the client sent it ahead of its answer: the query of the
//! triggering response (ahead of every copy of the flow carrying data) and, on getaddrinfo's
//! socket, the other question's when glibc sent it before the first answer (sent after it, it
//! is copied with the flow, and a replay would put it on the mirror twice). No answer reaches
//! the mirror without its query; nothing of the other lookups. The classifier's counters agree with the capture: queries, responses,
//! responses per rcode, answers timed (and how long), triggers, replays, copies.
//!
//! Where the classifier sees an exchange: the query at the client's veth (ingress: sent to the
//! resolver pod or to the ClusterIP), the response at the resolver's (ingress: from the pod,
//! before conntrack undoes the DNAT); through the ClusterIP it finds the query across NAT. Over
//! TCP it reads the message at the start of a segment and takes a response only when it answers
//! a query it kept.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mirror_bpf::testing::{in_ci, require_root};
use mirror_bpf::types::stat_idx;
use mirror_bpf::{HistKind, TriggerEvent, TriggerKind};
use mirror_e2e::capture::pcap::Datagram;
use mirror_e2e::oracles::dns_oracle::{self, DnsExpected, Exchange, Flow, SearchLookup};
use mirror_e2e::oracles::oracle::Row;
use mirror_e2e::topology::kubeproxy::{Flavour, KubeProxy, Service, DNS_PORT};
use mirror_e2e::topology::testbed::{Events, Recording, Testbed};
use mirror_e2e::workload::dns::{
    self, Looked, Lookup, QType, Rcode, ResolvConf, Resolved, Resolver, ResolverKind, Responder, Transport,
    Zone, GOOD_A, GOOD_AAAA, GOOD_ZONE,
};
use mirror_e2e::workload::go_resolver::{self, GoResolved};

/// The client pod, then the resolver's.
const PODS: [&str; 2] = ["client", "server"];

/// The rule of the failures.
const FAILURES: &str = "dns=nxdomain,servfail";

/// What the client's capture keeps: DNS, both transports.
const CAPTURE: &str = "port 53";

/// glibc's "name unknown" (`EAI_NONAME`) and "try again" (`EAI_AGAIN`).
const EAI_NONAME: i32 = -2;
const EAI_AGAIN: i32 = -3;

/// The columns of a [`Row`]: lookups answered NOERROR, NXDOMAIN, SERVFAIL, anything else (or
/// nothing). `relevant`, shown after them, is the lookups whose failure the rule covers.
const ANSWERS: [Rcode; 3] = [Rcode::NOERROR, Rcode::NXDOMAIN, Rcode::SERVFAIL];
const OTHER: usize = 3;
type Table = Row<4>;

mod failures;
mod noresponse;
mod score;
mod search_path;
mod world;

use score::*;
use world::*;
