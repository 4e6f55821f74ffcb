//! `mirrorctl latency`: the latency histograms (`/v1/latency`) and their timing groups
//! (`/v1/latency/groups`).

use std::collections::BTreeMap;

use clap::Subcommand;
use hyper::Method;

use super::{hist, print_json, table};
use crate::api::client::Client;
use crate::views::{GroupView, HistogramView, SetGroup};

#[derive(Subcommand)]
pub enum LatencyCommand {
    /// Switch a timing group on (http, handshake, dns).
    Enable {
        /// The group.
        group: String,
    },
    /// Switch a timing group off.
    Disable {
        /// The group.
        group: String,
    },
    /// The timing groups and whether they are on.
    Groups,
}

/// Prints the histograms, or with a command the timing groups (after switching one).
pub async fn run(
    c: &Client<'_>,
    json: bool,
    command: Option<LatencyCommand>,
    by_interface: bool,
) -> anyhow::Result<()> {
    let Some(cmd) = command else {
        let hists: Vec<HistogramView> = c.call(Method::GET, "/v1/latency", None).await?;
        if json {
            return print_json(&hists);
        }
        print_latency(&hists, by_interface);
        return Ok(());
    };
    let enabled = matches!(cmd, LatencyCommand::Enable { .. });
    let groups: Vec<GroupView> = match cmd {
        LatencyCommand::Groups => c.call(Method::GET, "/v1/latency/groups", None).await?,
        LatencyCommand::Enable { group } | LatencyCommand::Disable { group } => {
            let body = serde_json::to_string(&SetGroup { enabled })?;
            c.call(Method::PUT, &format!("/v1/latency/groups/{group}"), Some(body)).await?
        }
    };
    if json {
        return print_json(&groups);
    }
    let rows: Vec<Vec<String>> =
        groups.iter().map(|g| vec![g.group.clone(), if g.enabled { "on" } else { "off" }.into()]).collect();
    print!("{}", table::render(&["GROUP", "STATE"], &rows));
    Ok(())
}

/// One histogram per kind and status class (and interface, with `by_interface`), with its
/// count and quantiles.
fn print_latency(hists: &[HistogramView], by_interface: bool) {
    if hists.is_empty() {
        println!("no latency measured yet");
        return;
    }
    let mut groups: BTreeMap<(String, Option<u8>, String), Vec<&HistogramView>> = Default::default();
    for h in hists {
        let iface = if by_interface { format!("{} ", h.interface) } else { String::new() };
        groups.entry((h.kind.clone(), h.class, iface)).or_default().push(h);
    }
    for ((kind, class, iface), hs) in groups {
        let Some(h) = hist::merge(&hs) else { continue };
        let what = match class {
            Some(c) => format!("{kind} {c}xx"),
            None => kind,
        };
        println!(
            "{iface}{what}: {} measured, p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
            h.count,
            hist::quantile(&h, 0.5),
            hist::quantile(&h, 0.9),
            hist::quantile(&h, 0.99)
        );
        print!("{}", hist::render(&h));
        println!();
    }
}
