//! Addresses and ports shared by fixtures (198.18.0.0/15 and 2001:2::/48: benchmarking ranges).

use std::net::{Ipv4Addr, Ipv6Addr};

/// Client pod, IPv4.
pub const V4_CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// Server pod, IPv4.
pub const V4_SERVER: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
/// Client pod, IPv6.
pub const V6_CLIENT: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 2);
/// Server pod, IPv6.
pub const V6_SERVER: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 2);
/// Server port.
pub const PORT_HTTP: u16 = 80;
/// Another server port, for port-scoped rules.
pub const PORT_ALT: u16 = 8080;
/// Client (ephemeral) port.
pub const PORT_CLIENT: u16 = 40000;

/// `GET /bar` request payload.
pub const REQ_GET_BAR: &[u8] = b"GET /bar HTTP/1.1\r\nHost: server\r\n\r\n";
/// 200 response payload.
pub const RESP_200: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
/// 500 response payload.
pub const RESP_500: &[u8] = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n";
/// 503 response payload (HTTP/1.0).
pub const RESP_503_V10: &[u8] = b"HTTP/1.0 503 Service Unavailable\r\n\r\n";
