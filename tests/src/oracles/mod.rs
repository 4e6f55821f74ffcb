//! What the mirror must carry, read from a reference capture: HTTP/1.x and HTTP/2 conversations
//! parsed as an endpoint parses them, DNS exchanges, the flows rules trigger on, across NAT too.

pub mod dns_oracle;
pub mod h2_oracle;
pub mod http_stream;
pub mod nat_oracle;
pub mod oracle;
