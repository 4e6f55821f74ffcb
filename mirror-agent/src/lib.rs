//! The node agent (`mirror-agent`) and its CLI (`mirrorctl`). Binaries stay thin; the
//! modules here do the work.

pub mod agent;
pub mod api;
pub mod bpffs;
pub mod capacity;
pub mod capture;
pub mod cluster;
pub mod community_id;
pub mod config;
pub mod ctl;
pub mod duration;
pub mod engine;
pub mod event_log;
pub mod groups;
pub mod handover;
pub mod health;
pub mod kallsyms;
pub mod links;
pub mod memory;
pub mod metrics;
pub mod pods;
pub mod recorder;
pub mod requirements;
pub mod rules;
pub mod server;
pub mod sink;
pub mod startup;
pub mod state;
pub mod views;
