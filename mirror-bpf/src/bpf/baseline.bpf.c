// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The baselines every per-packet cost is compared with: an empty tc program, and the floor of
 * this design, a flow monitor that does nothing but parse the packet and count it in a per-CPU
 * LRU flow table (the packet's time, one lookup): what any classifier built on that table pays.
 */
#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "include/compat.h"
#include "include/types.h"
#include "include/parse.h"
#include "include/clock.h"
#include "include/flow_dir.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tc")
int tc_empty(struct __sk_buff *skb)
{
    return -1; /* TC_ACT_UNSPEC */
}

/* The same, on TCX links: the real-traffic baseline beside the classifier on the same hooks. */
SEC("tcx/ingress")
int tcx_empty_ingress(struct __sk_buff *skb)
{
    return -1; /* TCX_NEXT */
}

SEC("tcx/egress")
int tcx_empty_egress(struct __sk_buff *skb)
{
    return -1; /* TCX_NEXT */
}

/* The floor's flow table: the classifier's key, one direction's counters per CPU. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct flow_key);
    __type(value, struct flow_dir_stats);
} floor_flows SEC(".maps");

/* floor_count - parse @skb and count it in floor_flows. */
static __always_inline void floor_count(struct __sk_buff *skb)
{
    struct pkt_meta m = {};

    if (parse_packet(skb, &m) != PARSE_TCP)
        return;
    __u64 now = packet_time(skb);
    struct flow_dir_stats *d = bpf_map_lookup_elem(&floor_flows, &m.key);
    if (!d) {
        struct flow_dir_stats z = {};
        bpf_map_update_elem(&floor_flows, &m.key, &z, BPF_NOEXIST);
        d = bpf_map_lookup_elem(&floor_flows, &m.key);
        if (!d)
            return;
    }
    /* Counted as the classifier counts (flow_dir.h). */
    flow_dir_add(d, skb->len, m.tcp_flags, now);
}

SEC("tcx/ingress")
int tcx_floor_ingress(struct __sk_buff *skb)
{
    floor_count(skb);
    return -1; /* TCX_NEXT */
}

/* At egress only what no ingress of the node saw (a lower bound of the classifier's check). */
SEC("tcx/egress")
int tcx_floor_egress(struct __sk_buff *skb)
{
    if (!skb->ingress_ifindex)
        floor_count(skb);
    return -1; /* TCX_NEXT */
}
