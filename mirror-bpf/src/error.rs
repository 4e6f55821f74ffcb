//! Errors of the data-path API.

use std::io;

/// What can go wrong while loading, attaching or driving the data path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A libbpf call failed.
    // The cause is part of the message (not a `source`), so that it is printed once.
    #[error("{what}: {cause}")]
    Bpf {
        /// The operation that failed.
        what: String,
        /// libbpf's error.
        cause: libbpf_rs::Error,
    },
    /// A netlink or system call failed.
    #[error("{what}: {cause}")]
    Io {
        /// The operation that failed.
        what: String,
        /// The OS error.
        cause: io::Error,
    },
    /// A rule could not be parsed.
    #[error(transparent)]
    Rule(#[from] crate::rule::syntax::RuleError),
    /// No rule has this id.
    #[error("no rule with id {0}")]
    NoSuchRule(u32),
    /// A rule reaches every interface: it is not selected per interface.
    #[error("rule {0} applies everywhere: only selected rules are selected per interface")]
    NotSelected(u32),
    /// Every rule slot is taken.
    #[error("too many rules: at most {0}")]
    TooManyRules(usize),
    /// A rule does not fit the rule maps for another reason (said in words).
    #[error("{0}")]
    RuleDoesNotFit(String),
    /// A rule needs a protocol program the data path did not load (`protocols:`).
    #[error("{0}")]
    ProtocolNotLoaded(String),
    /// The kernel lacks what the requested mode needs.
    #[error("{0}")]
    Unsupported(String),
}

/// Result of the data-path API.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds the failed operation's name to a libbpf error.
pub(crate) trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for libbpf_rs::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|cause| Error::Bpf { what: what(), cause })
    }
}

impl<T> Context<T> for io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|cause| Error::Io { what: what(), cause })
    }
}
