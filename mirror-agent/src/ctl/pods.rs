//! `mirrorctl pods`: the pods behind the attached veths (`/v1/pods`).

use std::collections::BTreeMap;

use hyper::Method;

use super::{print_json, table};
use crate::api::client::Client;
use crate::views::PodView;

/// Prints the pods.
pub async fn run(c: &Client<'_>, json: bool) -> anyhow::Result<()> {
    let pods: Vec<PodView> = c.call(Method::GET, "/v1/pods", None).await?;
    if json {
        return print_json(&pods);
    }
    let header = ["INTERFACE", "POD", "NAMESPACE", "ADDRESSES", "FROM", "NETNS", "PID", "LABELS"];
    print!("{}", table::render(&header, &rows(&pods)));
    Ok(())
}

fn rows(pods: &[PodView]) -> Vec<Vec<String>> {
    pods.iter()
        .map(|p| {
            vec![
                p.interface.clone(),
                p.name.clone(),
                p.namespace.clone().unwrap_or_else(|| "-".into()),
                p.addresses.join(","),
                p.source.clone(),
                p.netns.clone().unwrap_or_else(|| "-".into()),
                p.pid.map_or("-".into(), |p| p.to_string()),
                labels_text(&p.labels),
            ]
        })
        .collect()
}

/// `k=v,k=v`, or `-`.
pub fn labels_text(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}
