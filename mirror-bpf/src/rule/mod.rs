//! Trigger rules, from their text to the classifier's rule maps, in one place:
//!
//! - [`syntax`]: what a rule says and how it is written (`status=5xx port=8080 ...`);
//! - [`grpc`]: gRPC's status codes, their names, and their pseudo-statuses in the maps;
//! - `scopes`: which interfaces share which scope of selected rules;
//! - `set`: the rule set compiled per scope into the entries of the rule maps (pure logic);
//! - `maps`: the rule set written to the classifier's maps, with the rules' hit counters;
//! - [`capacity`]: what those maps hold, and whether a set of rules fits them at once
//!   ([`capacity::fits`], the one check made before rules are written).
//!
//! Within the wing, gRPC's codes depend on nothing else of it, the syntax on them, the scopes
//! and the capacity on the syntax, the set on the syntax and the scopes, and the maps on all
//! of them; nothing here depends on the [`crate::datapath::Datapath`] that holds the maps.

pub mod capacity;
pub mod grpc;
pub(crate) mod maps;
pub(crate) mod scopes;
pub(crate) mod set;
pub mod syntax;

pub use grpc::GrpcCodes;
pub use maps::RuleInfo;
pub use scopes::Reach;
pub use syntax::{Limits, RequestFilter, Rule, RuleError, RuleId, StatusMatch, Trigger, TriggerKind};
