//! DNS messages for tests: a header and one question (RFC 1035 4.1), as a resolver's client
//! sends it or a resolver answers it (no answer records: the classifier reads the question).

/// Response code NXDOMAIN.
pub const NXDOMAIN: u8 = 3;
/// Response code SERVFAIL.
pub const SERVFAIL: u8 = 2;
/// Type A.
pub const A: u16 = 1;
/// Type AAAA.
pub const AAAA: u16 = 28;

/// A query for `name` (dotted, no final dot; "" is the root) of type `qtype`, with `id`.
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    message(id, 0x0100, name, qtype)
}

/// The response with `rcode` to the query `query(id, name, qtype)`.
pub fn response(id: u16, name: &str, qtype: u16, rcode: u8) -> Vec<u8> {
    message(id, 0x8180 | u16::from(rcode & 0xF), name, qtype)
}

/// A message with `flags` and one question.
pub fn message(id: u16, flags: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut m = Vec::with_capacity(32 + name.len());
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&flags.to_be_bytes());
    m.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    m.extend_from_slice(&wire_name(name));
    m.extend_from_slice(&qtype.to_be_bytes());
    m.extend_from_slice(&1u16.to_be_bytes());
    m
}

/// `name` in wire form: each label after its length, then the root's zero.
pub fn wire_name(name: &str) -> Vec<u8> {
    let mut w = Vec::new();
    for label in name.split('.').filter(|l| !l.is_empty()) {
        w.push(label.len() as u8);
        w.extend_from_slice(label.as_bytes());
    }
    w.push(0);
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_a_header_and_one_question() {
        let q = query(0x1234, "www.Example.com", AAAA);
        assert_eq!(&q[..12], &[0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&q[12..29], b"\x03www\x07Example\x03com\x00");
        assert_eq!(&q[29..], &[0, 28, 0, 1]);
        assert_eq!(response(1, "", A, NXDOMAIN)[2..4], [0x81, 0x83]);
    }
}
