//! The traffic a test makes: real HTTP servers and HTTP/2 and gRPC stacks, clients (curl, a
//! raw HTTP/1.x client, many connections at once), production load, SYN floods, the HTTP/2
//! scenario built of them, and DNS (resolvers: dnsmasq and CoreDNS, a scripted responder; clients:
//! dig, getaddrinfo and Go's resolver), an S3-compatible server; the cache of what is built for them
//! once per machine.

pub mod cache;
pub mod client;
pub mod coredns;
pub mod crowd;
pub mod dns;
pub mod flood;
pub mod go_resolver;
pub mod h2_scenario;
pub mod h2_stacks;
pub mod load;
pub mod raw;
pub mod s3;
pub mod servers;
