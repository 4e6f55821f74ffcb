// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The baselines every per-packet cost is compared with, a ladder of what a classifier must do
 * at least: an empty tc program; the parser alone; the floor of a flow monitor, the parse and
 * a count in a per-CPU LRU flow table (the packet's time, one lookup); and the same floor with
 * the classifier's flow cache in front of the table (flow_cache.h: the table touched on a miss
 * only).
 */
#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "include/compat.h"
#include "include/types.h"
#include "include/scratch.h"
#include "include/parse.h"
#include "include/clock.h"
#include "include/flow_dir.h"
#include "include/flow_cache.h"

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

/* floor_lru - @m's entry of floor_flows, created when missing. */
static __always_inline struct flow_dir_stats *floor_lru(const struct pkt_meta *m)
{
    struct flow_dir_stats *d = bpf_map_lookup_elem(&floor_flows, &m->key);

    if (!d) {
        struct flow_dir_stats z = {};
        bpf_map_update_elem(&floor_flows, &m->key, &z, BPF_NOEXIST);
        d = bpf_map_lookup_elem(&floor_flows, &m->key);
    }
    return d;
}

/* floor_count - parse @skb and count it in floor_flows. */
static __always_inline void floor_count(struct __sk_buff *skb)
{
    struct pkt_meta m = {};

    if (parse_packet(skb, &m) != PARSE_TCP)
        return;
    __u64 now = packet_time(skb);
    struct flow_dir_stats *d = floor_lru(&m);
    /* Counted as the classifier counts (flow_dir.h). */
    if (d)
        flow_dir_add(d, skb->len, m.tcp_flags, now);
}

/*
 * cached_count - parse @skb and count it in this CPU's flow_cache slot of its flow, as the
 * classifier does (flow_cache.h); a miss takes the slot and touches floor_flows (the classifier
 * also writes the evicted flow back: misses are rare under the benchmark's loads).
 */
static __always_inline void cached_count(struct __sk_buff *skb)
{
    struct pkt_meta m = {};

    if (parse_packet(skb, &m) != PARSE_TCP)
        return;
    __u64 now = packet_time(skb);
    struct flow_cache_slot *c = flow_cache_slot_of(&m.key);
    if (!c)
        return;
    if (!flow_key_eq(&c->key, &m.key)) {
        if (!floor_lru(&m))
            return;
        flow_cache_take(c, &m.key);
    }
    flow_cache_count(c, m.dir, skb->len, m.tcp_flags, now);
}

/* keep - what the parser wrote to @m counts as read: the compiler may not drop the parse
 * (inlined, its results unused otherwise). */
static __always_inline void keep(struct pkt_meta *m)
{
    asm volatile("" : : "r"(m) : "memory");
}

/* The parser alone. */
SEC("tcx/ingress")
int tcx_parse_ingress(struct __sk_buff *skb)
{
    struct pkt_meta m = {};

    parse_packet(skb, &m);
    keep(&m);
    return -1; /* TCX_NEXT */
}

SEC("tcx/egress")
int tcx_parse_egress(struct __sk_buff *skb)
{
    struct pkt_meta m = {};

    if (!skb->ingress_ifindex) {
        parse_packet(skb, &m);
        keep(&m);
    }
    return -1; /* TCX_NEXT */
}

SEC("tcx/ingress")
int tcx_cached_ingress(struct __sk_buff *skb)
{
    cached_count(skb);
    return -1; /* TCX_NEXT */
}

SEC("tcx/egress")
int tcx_cached_egress(struct __sk_buff *skb)
{
    if (!skb->ingress_ifindex)
        cached_count(skb);
    return -1; /* TCX_NEXT */
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

/*
 * What one step costs on this CPU, its mitigations included (the data-path benchmark times
 * each program under test_run against the one without the step): UNIT_STEPS calls of a BPF
 * function and their returns (against the same work inlined), UNIT_STEPS reads of 16 packet
 * bytes with bpf_skb_load_bytes (from the linear area: TCP payload in page fragments costs
 * more), and one tail call (into tc_empty, through unit_tail_to).
 */
#define UNIT_STEPS 8

static __always_inline int unit_work(struct __sk_buff *skb, int x)
{
    return x * 3 + skb->len;
}

__noinline int unit_step(struct __sk_buff *skb, int x)
{
    return skb ? unit_work(skb, x) : 0;
}

SEC("tc")
int tc_unit_inline(struct __sk_buff *skb)
{
    int a = 0;

#pragma unroll
    for (int i = 0; i < UNIT_STEPS; i++) {
        a = unit_work(skb, a + i);
        asm volatile("" : "+r"(a)); /* a step each, as the calls are */
    }
    return a == 1 ? 0 : -1;
}

SEC("tc")
int tc_unit_calls(struct __sk_buff *skb)
{
    int a = 0;

#pragma unroll
    for (int i = 0; i < UNIT_STEPS; i++)
        a = unit_step(skb, a + i);
    return a == 1 ? 0 : -1;
}

SEC("tc")
int tc_unit_reads(struct __sk_buff *skb)
{
    __u8 buf[16];
    int a = 0;

#pragma unroll
    for (int i = 0; i < UNIT_STEPS; i++)
        a += bpf_skb_load_bytes(skb, i, buf, sizeof(buf)) + buf[i];
    return a == 1 ? 0 : -1;
}

struct {
    __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} unit_tail_to SEC(".maps");

SEC("tc")
int tc_unit_tail(struct __sk_buff *skb)
{
    bpf_tail_call_static(skb, &unit_tail_to, 0);
    return -1;
}
