//! Trigger rules, from their text to the classifier's rule maps, in one place:
//!
//! - [`syntax`]: what a rule says and how it is written (`status=5xx port=8080 ...`);
//! - `parse`: a rule's text read, token by token, then the tokens checked together;
//! - [`filter`]: the filters on what is behind a trigger (`method=`, `path=`, `host=`, and the
//!   DNS question's `qname=`, `qtype=`);
//! - [`grpc`]: gRPC's status codes, their names, and their pseudo-statuses in the maps;
//! - [`dns`]: DNS rcodes and question types, their names, the rcodes' pseudo-statuses in the
//!   maps, and the question filters' values;
//! - `scopes`: which interfaces share which scope of selected rules;
//! - `set`: the rule set compiled per scope into the entries of the rule maps (pure logic);
//! - `maps`: the rule set written to the classifier's maps, with the rules' hit counters;
//! - [`capacity`]: what those maps hold, and whether a set of rules fits them at once
//!   ([`capacity::fits`], the one check made before rules are written).
//!
//! Within the wing, gRPC's codes and the filters depend on nothing else of it, DNS's codes on
//! them, the syntax on those, its parser on all of these, the scopes and the capacity on the syntax, the set on the syntax
//! and the scopes, and the maps on all of them; nothing here depends on the
//! [`crate::datapath::Datapath`] that holds the maps.

pub mod capacity;
pub mod dns;
pub mod drop;
pub mod filter;
pub mod grpc;
pub(crate) mod maps;
mod parse;
pub(crate) mod scopes;
pub(crate) mod set;
pub mod syntax;

pub use dns::DnsRcodes;
pub use drop::DropReasons;
pub use filter::RequestFilter;
pub use grpc::GrpcCodes;
pub use maps::RuleInfo;
pub use scopes::Reach;
pub use syntax::{Limits, Rule, RuleError, RuleId, StatusMatch, Trigger, TriggerKind};
