//! The markdown report of the mirror-path benchmark.

use std::fmt::Write;

use super::perf::{Breakdown, STAGES};
use super::sinks::SinkKind;
use super::{testrun, traffic};
use crate::host::Host;
use crate::stats::Summary;

fn fmt_ns(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let n = x.round() as i64;
    if n.abs() >= 1000 {
        format!("{}{},{:03}", if n < 0 { "-" } else { "" }, n.abs() / 1000, n.abs() % 1000)
    } else {
        n.to_string()
    }
}

fn fmt_summary(s: &Summary) -> String {
    format!("{} ({} to {})", fmt_ns(s.median), fmt_ns(s.min), fmt_ns(s.max))
}

fn missing_text(missing: &[(SinkKind, String)]) -> String {
    if missing.is_empty() {
        return "none".into();
    }
    missing.iter().map(|(k, e)| format!("{k:?} (`{}`: {e})", k.dev())).collect::<Vec<_>>().join("; ")
}

/// One row per (variant, first column, breakdown): the stages that appear anywhere, in
/// [`STAGES`] order, then "other".
fn stage_table(s: &mut String, first: &str, rows: &[(&str, String, &Breakdown)]) {
    let names: Vec<&str> = STAGES.iter().map(|(n, _)| *n).chain(["other"]).collect();
    let used: Vec<&str> =
        names.into_iter().filter(|n| rows.iter().any(|(_, _, b)| b.get(n) >= 5.0)).collect();
    let _ = write!(s, "| variant | {first} | copy, by perf |");
    for n in &used {
        let _ = write!(s, " {n} |");
    }
    let _ = write!(s, "\n|---|--:|--:|");
    s.push_str(&"--:|".repeat(used.len()));
    s.push('\n');
    for (name, col, b) in rows {
        let _ = write!(s, "| {name} | {col} | {} |", fmt_ns(b.get("copy, all of it")));
        for n in &used {
            let v = b.get(n);
            let _ = write!(s, " {} |", if v >= 0.5 { fmt_ns(v) } else { "-".into() });
        }
        s.push('\n');
    }
    s.push('\n');
}

const STAGE_NOTE: &str = "A perf sample is the copy's when `bpf_clone_redirect` or `tcf_mirred_act` is on \
its call chain (under test_run also the receive softirq, `net_rx_action`: nothing else is \
received there), and it goes to the deepest stage on its chain: clone (`skb_clone`), unclone \
the original (`pskb_expand_head`: the helper makes the original's head private again, for \
direct packet access, so every copied packet's headers are reallocated and copied), transmit \
(`__dev_queue_xmit`), taps (`dev_queue_xmit_nit`), veth: to its peer (`veth_xmit`), to the \
receive path (`__dev_forward_skb2`), enqueue to the backlog (`netif_rx`, \
`enqueue_to_backlog`), receive: backlog, taps, tc (`process_backlog`, \
`__netif_receive_skb_core`), receive: IP (`ip_rcv`, which drops a frame addressed to another \
host's MAC), free (`kfree_skb` and friends), act_mirred (`tcf_mirred_act`).";

pub fn render(
    host: &Host,
    command: &str,
    tr: Option<&testrun::Results>,
    tf: Option<&traffic::Results>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Mirror path: the cost of one copied packet\n");
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(s, "| CPU | {} ({} logical CPUs) |", host.cpu, host.cores);
    let _ = writeln!(s, "| kernel | {} |", host.kernel);
    let _ = writeln!(s, "| date | {} |", host.date);
    let _ = writeln!(s, "| command | `{command}` |");
    let missing = tr.map(|t| &t.missing).or(tf.map(|t| &t.missing));
    if let Some(m) = missing {
        let _ = writeln!(s, "| sink kinds this kernel lacks | {} |", missing_text(m));
    }
    s.push('\n');

    if let Some(t) = tr {
        let _ = writeln!(s, "## BPF_PROG_TEST_RUN\n");
        let _ = writeln!(
            s,
            "A marked flow's ACK (54 bytes) through `tc_ingress_mirror`, {} packets per test_run, {} \
             runs, each variant once per run in the same order, on CPU {}. \"per copy\" is the median \
             over runs of the variant's ns minus the no-copy ns of the same run. The whole copy \
             happens in the measured call: the clone, its transmit and the sink's receive path (its \
             softirq runs when bottom halves are enabled again). act_mirred is a tc action, which \
             test_run does not run: it is measured on traffic only.\n",
            t.plan.repeat, t.plan.runs, t.cpu
        );
        let _ = writeln!(
            s,
            "| variant | ns/packet (min to max) | per copy | empty program | link counters, per copy |"
        );
        let _ = writeln!(s, "|---|--:|--:|--:|---|");
        for r in &t.rows {
            let _ = writeln!(
                s,
                "| {} | {} ({} to {}) | {} | {} | {} |",
                r.variant.what,
                fmt_ns(r.ns),
                fmt_ns(r.min),
                fmt_ns(r.max),
                if r.variant.dev().is_some() { fmt_ns(r.copy_ns) } else { "-".into() },
                fmt_ns(r.empty_ns),
                r.delivered
            );
        }
        s.push('\n');
        let rows: Vec<(&str, String, &Breakdown)> = t
            .rows
            .iter()
            .filter(|r| r.variant.dev().is_some())
            .filter_map(|r| r.profile.as_ref().map(|p| (r.variant.key, fmt_ns(r.copy_ns), p)))
            .collect();
        if !rows.is_empty() {
            let _ = writeln!(
                s,
                "Where a copy's time goes (perf, {} s of samples per variant; the samples under \
                 `bpf_test_run` stand for the ns/packet above), ns per packet. {STAGE_NOTE}\n",
                t.plan.perf_secs
            );
            stage_table(&mut s, "per copy", &rows);
        }
    }

    if let Some(t) = tf {
        let _ = writeln!(s, "## Real traffic\n");
        let _ = writeln!(
            s,
            "wrk (1 thread, 4 keep-alive connections) against nginx (`/foo`, 200) from one pod to \
             another through the node namespace, client and server on CPU {cpu}; the classifier \
             attached to both pod veths (TCX for clone, tc for act_mirred) with the rule \
             `status=200 packets=0 bytes=0 duration=0`, so every connection is copied from its \
             first response on, both directions. {} rounds of {} s, every variant once per round \
             (each round starting one later), BPF run-time accounting on throughout. Load CPU is \
             the run time of wrk, nginx and ksoftirqd/{cpu} (schedstat, and the reaped wrk's \
             rusage): it includes the softirqs run in their context (this kernel has no separate \
             IRQ time accounting), not other work on the CPU. Per copy: the median over rounds \
             (min to max) of (variant − no copy, same round) per request, divided by the copies \
             per request; CPU for all of the load, BPF for the classifier's programs (kernel \
             accounting), which hold the clone, its transmit and, for ingress, the enqueue, but \
             not the sink's receive path nor the freeing of the copy, which run later in the same \
             softirq. Offloads of the server's veth: {}\n",
            t.plan.rounds,
            t.plan.secs,
            t.offloads.trim(),
            cpu = t.cpu,
        );
        let _ = writeln!(
            s,
            "| variant | requests/s | copies/request | refused by the sink | delivered again to the pods, per copy | backlog drops | load CPU µs/request | per copy: CPU ns | per copy: BPF ns |"
        );
        let _ = writeln!(s, "|---|--:|--:|--:|--:|--:|--:|--:|--:|");
        for r in &t.rows {
            let has = r.variant.dev().is_some();
            let _ = writeln!(
                s,
                "| {} | {:.0} | {:.2} | {} | {} | {} | {:.2} | {} | {} |",
                r.variant.what,
                r.requests_per_s,
                r.copies_per_request,
                if r.copy_errors > 0.0 { format!("{:.0}%", 100.0 * r.copy_errors) } else { "-".into() },
                if has { format!("{:.2}", r.extra_per_copy.max(0.0)) } else { "-".into() },
                r.backlog_drops,
                r.cpu_ns_per_request / 1000.0,
                if has { fmt_summary(&r.copy_cpu_ns) } else { "-".into() },
                if has { fmt_summary(&r.copy_bpf_ns) } else { "-".into() },
            );
        }
        s.push('\n');
        let rows: Vec<(&str, String, &Breakdown)> = t
            .rows
            .iter()
            .filter_map(|r| r.profile.as_ref().map(|(b, _)| (r.variant.key, fmt_ns(r.copy_cpu_ns.median), b)))
            .collect();
        if !rows.is_empty() {
            let _ = writeln!(
                s,
                "Where a copy's time goes (perf over one more run of {} s per variant on CPU {}, the \
                 load's samples standing for its CPU time), ns per copy. Only the helper's or the \
                 action's part can be told from the rest here (the sink's receive path runs in the \
                 softirq that also receives the pods' packets): \"copy, by perf\" is that part, the \
                 difference to the total is the sink's receive path, the freeing of the copy, and \
                 what the copy costs the original (caches). {STAGE_NOTE}\n",
                t.plan.perf_secs, t.cpu
            );
            stage_table(&mut s, "per copy (total)", &rows);
        }
        let _ = writeln!(
            s,
            "Load CPU µs per request in each round (the spread behind the per-copy figures; a \
             round's variants run back to back):\n"
        );
        let _ =
            writeln!(s, "| variant |{}", (1..=t.plan.rounds).map(|i| format!(" {i} |")).collect::<String>());
        let _ = writeln!(s, "|---|{}", "--:|".repeat(t.plan.rounds));
        for r in &t.rows {
            let _ = writeln!(
                s,
                "| {} |{}",
                r.variant.key,
                r.runs
                    .iter()
                    .map(|run| format!(" {:.2} |", run.per_request(run.cpu_ns) / 1000.0))
                    .collect::<String>()
            );
        }
        s.push('\n');
        let caps: Vec<&traffic::Row> = t.rows.iter().filter(|r| r.capture.is_some()).collect();
        if !caps.is_empty() {
            let _ = writeln!(
                s,
                "What a capture on the sink sees: tcpdump `-Q in` and `-Q out` at once (immediate \
                 mode, 16 MiB buffers) on the interface named, during {} s of load with 2 \
                 connections; TCP checksums as tshark judges them.\n",
                t.plan.capture_secs
            );
            let _ = writeln!(
                s,
                "| variant | capture on | copies made | seen as received | seen as sent | capture drops | backlog drops | TCP checksums | largest frame |"
            );
            let _ = writeln!(s, "|---|---|--:|--:|--:|--:|--:|---|--:|");
            for r in caps {
                let c = r.capture.as_ref().expect("filtered");
                if let Some(e) = &c.error {
                    let _ = writeln!(
                        s,
                        "| {} | {} | cannot capture: {} | | | | | | |",
                        r.variant.key,
                        c.dev,
                        e.replace('\n', " ")
                    );
                    continue;
                }
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    r.variant.key,
                    c.dev,
                    c.mirrored,
                    c.seen_in,
                    c.seen_out,
                    c.dropped,
                    c.backlog_drops,
                    c.tcp_checksums,
                    c.max_len
                );
            }
            if let Some(d) = &t.down_peer {
                let _ = writeln!(s, "\nCapturing on the down peer of a veth sink: {}", d.replace('\n', " "));
            }
            s.push('\n');
        }
    }
    s
}
