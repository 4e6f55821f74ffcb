//! A rule's filters on what is behind its trigger: an HTTP request's method, target and host
//! (`method=`, `path=`, `host=`), or a DNS query's question (`qname=`, `qtype=`, parsed in
//! [`super::dns`]). The classifier holds each filtered rule's filter in `rule_filters`
//! (`struct rule_filter`) and evaluates it only when the rest of a trigger's condition holds.

use crate::shared::types;

/// Request methods a filter names, with their bit in `enum http_method`.
const METHODS: [(&str, types::http_method); 9] = [
    ("GET", types::http_method::HTTP_METHOD_GET),
    ("HEAD", types::http_method::HTTP_METHOD_HEAD),
    ("POST", types::http_method::HTTP_METHOD_POST),
    ("PUT", types::http_method::HTTP_METHOD_PUT),
    ("DELETE", types::http_method::HTTP_METHOD_DELETE),
    ("PATCH", types::http_method::HTTP_METHOD_PATCH),
    ("OPTIONS", types::http_method::HTTP_METHOD_OPTIONS),
    ("CONNECT", types::http_method::HTTP_METHOD_CONNECT),
    ("TRACE", types::http_method::HTTP_METHOD_TRACE),
];

/// The longest `path=` prefix, `host=` name and `qname=` suffix.
pub const FILTER_TEXT_MAX: usize = types::mirror_limits::RULE_FILTER_TEXT.0 as usize;

/// Which requests (or DNS queries) a rule applies to; an empty part matches any.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RequestFilter {
    /// Bits of `enum http_method` (0: any method).
    pub methods: u32,
    /// A prefix of the request target, query string included.
    pub path: Option<String>,
    /// The Host header's name (without a port), lower case.
    pub host: Option<String>,
    /// DNS: a suffix of the question's name, lower case, without a final dot: `example.com`
    /// (that name and the names under it) or `.example.com` (the names under it only).
    pub qname: Option<String>,
    /// DNS: the names NOT under `qname` pass (`qname=!SUFFIX`).
    pub qname_not: bool,
    /// DNS: the question's type (0: any).
    pub qtype: u16,
}

impl RequestFilter {
    /// Whether it filters anything.
    pub fn is_empty(&self) -> bool {
        !self.is_http() && !self.is_dns()
    }

    /// Whether it filters HTTP requests (`method=`, `path=`, `host=`).
    pub fn is_http(&self) -> bool {
        self.methods != 0 || self.path.is_some() || self.host.is_some()
    }

    /// Whether it filters DNS questions (`qname=`, `qtype=`).
    pub fn is_dns(&self) -> bool {
        self.qname.is_some() || self.qtype != 0
    }

    /// The method names it lets through, in a fixed order.
    pub fn method_names(&self) -> Vec<&'static str> {
        METHODS.iter().filter(|(_, bit)| self.methods & bit.0 != 0).map(|(n, _)| *n).collect()
    }
}

/// `POST`, `GET,PUT`: known methods, upper or lower case.
pub(crate) fn parse_methods(v: &str) -> Result<u32, String> {
    let mut bits = 0;
    for name in v.split(',') {
        let upper = name.to_ascii_uppercase();
        let bit = METHODS.iter().find(|(n, _)| *n == upper).map(|(_, b)| b.0).ok_or_else(|| {
            let known: Vec<&str> = METHODS.iter().map(|(n, _)| *n).collect();
            format!("'{name}' is not a method ({})", known.join(", "))
        })?;
        bits |= bit;
    }
    Ok(bits)
}

/// A prefix of request targets: from `/`, at most FILTER_TEXT_MAX bytes of visible ASCII.
pub(crate) fn parse_path(v: &str) -> Result<String, String> {
    if !v.starts_with('/') {
        return Err(format!("path '{v}' must start with /"));
    }
    if v.len() > FILTER_TEXT_MAX {
        return Err(format!("path is {} bytes, more than the {FILTER_TEXT_MAX} a filter holds", v.len()));
    }
    if let Some(c) = v.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!("path has {c:?}, not a character of a request target"));
    }
    Ok(v.to_string())
}

/// A host name or address as the Host header gives it (without a port), lower case.
pub(crate) fn parse_host(v: &str) -> Result<String, String> {
    if v.len() > FILTER_TEXT_MAX {
        return Err(format!("host is {} bytes, more than the {FILTER_TEXT_MAX} a filter holds", v.len()));
    }
    if let Some(c) =
        v.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']')))
    {
        let hint = if c == ':' { " (give the name without its port)" } else { "" };
        return Err(format!("host has {c:?}, not a character of a host name{hint}"));
    }
    Ok(v.to_ascii_lowercase())
}
