//! gRPC status codes: their names, the set a `grpc-status=` rule names, and where they sit
//! among the rule maps' pseudo-statuses (code `c` is `GRPC_STATUS_BASE + c`, below the HTTP
//! statuses), as the classifier matches them from HTTP/2 trailers.

use std::fmt;

use crate::shared::types;

/// The first pseudo-status of gRPC codes in the rule maps: code `c` is `GRPC_STATUS_BASE + c`.
pub const GRPC_STATUS_BASE: u16 = types::mirror_limits::GRPC_STATUS_BASE.0 as u16;
/// gRPC status codes a rule may name: 0 to `GRPC_STATUS_CODES - 1`.
pub const GRPC_STATUS_CODES: u8 = types::mirror_limits::GRPC_STATUS_CODES.0 as u8;
const _: () = assert!(GRPC_STATUS_CODES as u32 == u64::BITS, "GrpcCodes holds one bit per code");

/// The canonical names of the gRPC status codes 0 to 16, by code.
pub const GRPC_STATUS_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The canonical name of gRPC status `code` (`13`: `INTERNAL`), for the codes gRPC names.
pub fn grpc_status_name(code: u16) -> Option<&'static str> {
    GRPC_STATUS_NAMES.get(usize::from(code)).copied()
}

/// gRPC status codes a rule matches, one bit per code (bit `c`: code `c`, 0 to 63).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GrpcCodes(pub u64);

impl GrpcCodes {
    /// Whether it holds `code`.
    pub fn contains(self, code: u8) -> bool {
        code < GRPC_STATUS_CODES && self.0 & 1 << code != 0
    }

    /// The codes it holds, lowest first.
    pub fn iter(self) -> impl Iterator<Item = u8> {
        (0..GRPC_STATUS_CODES).filter(move |c| self.contains(*c))
    }

    /// Whether it holds no code.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl FromIterator<u8> for GrpcCodes {
    /// The set of these codes (those of 64 and above are left out).
    fn from_iter<I: IntoIterator<Item = u8>>(codes: I) -> Self {
        let bits = codes.into_iter().filter(|c| *c < GRPC_STATUS_CODES).fold(0, |acc, c| acc | 1 << c);
        GrpcCodes(bits)
    }
}

/// Its codes, lowest first, by name where gRPC names them: `INTERNAL,UNAVAILABLE,42`.
impl fmt::Display for GrpcCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match grpc_status_name(c.into()) {
                Some(name) => f.write_str(name)?,
                None => write!(f, "{c}")?,
            }
        }
        Ok(())
    }
}

/// `13`, `internal,UNAVAILABLE`: gRPC status codes (0-63), or the names gRPC gives 0-16 in any
/// case; a code given twice counts once.
pub(crate) fn parse_grpc_codes(v: &str) -> Result<GrpcCodes, String> {
    v.split(',').map(parse_grpc_code).collect()
}

fn parse_grpc_code(s: &str) -> Result<u8, String> {
    let max = GRPC_STATUS_CODES - 1;
    if s.is_empty() {
        return Err("an empty code in the list".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<u8>()
            .ok()
            .filter(|c| *c <= max)
            .ok_or_else(|| format!("grpc-status {s} is outside 0-{max}"));
    }
    let upper = s.to_ascii_uppercase();
    GRPC_STATUS_NAMES.iter().position(|n| *n == upper).map(|c| c as u8).ok_or_else(|| {
        format!("'{s}' is not a gRPC status: a code 0-{max} or a name ({})", GRPC_STATUS_NAMES.join(", "))
    })
}
