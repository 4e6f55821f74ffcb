/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the node-wide budget of copies (mirror.budget): a token bucket per CPU,
 * refilled at that CPU's share of the node's packets/s and bytes/s, holding at most a tenth of
 * a second of them (and never less than one packet of 64 KiB, so that a GSO copy can pass).
 * It is consulted only when a copy is about to be made; copies beyond it are counted, not made.
 */
#ifndef MIRROR_BUDGET_H
#define MIRROR_BUDGET_H

#include "maps.h"

#define BUDGET_NS_PER_SEC 1000000000ULL
/* The buckets hold a tenth of a second of the rate: a burst of at most 100 ms. */
#define BUDGET_BURST_NS (BUDGET_NS_PER_SEC / 10)
/* ...and at least one copy of the largest GSO packet. */
#define BUDGET_MIN_BYTES 65536ULL

/* budget_refill - @tokens plus @rate per second over @elapsed ns, capped at @cap. */
static __always_inline __u64 budget_refill(__u64 tokens, __u64 rate, __u64 elapsed, __u64 cap)
{
    __u64 t = tokens + rate * elapsed;

    return t > cap ? cap : t;
}

/*
 * budget_admit - charge one copy of @len bytes to this CPU's share of the node's budget.
 * @return 1 when the copy may be made, 0 when the budget is spent (counted in budget_state).
 */
static __always_inline int budget_admit(__u32 len)
{
    __u32 zero = 0;
    struct budget_config *c = bpf_map_lookup_elem(&budget_config, &zero);

    if (!c || (!c->packets_per_sec && !c->bytes_per_sec))
        return 1;
    struct budget_state *b = bpf_map_lookup_elem(&budget_state, &zero);
    if (!b)
        return 1;
    __u64 now = bpf_ktime_get_ns();
    __u64 elapsed = b->last_ns ? now - b->last_ns : BUDGET_BURST_NS;
    if (elapsed > BUDGET_BURST_NS)
        elapsed = BUDGET_BURST_NS;
    b->last_ns = now;

    __u64 pcap = c->packets_per_sec * BUDGET_BURST_NS;
    if (pcap < BUDGET_NS_PER_SEC)
        pcap = BUDGET_NS_PER_SEC;
    __u64 bcap = c->bytes_per_sec * BUDGET_BURST_NS;
    if (bcap < BUDGET_MIN_BYTES * BUDGET_NS_PER_SEC)
        bcap = BUDGET_MIN_BYTES * BUDGET_NS_PER_SEC;
    __u64 pt = budget_refill(b->packet_tokens, c->packets_per_sec, elapsed, pcap);
    __u64 bt = budget_refill(b->byte_tokens, c->bytes_per_sec, elapsed, bcap);
    __u64 pcost = c->packets_per_sec ? BUDGET_NS_PER_SEC : 0;
    __u64 bcost = c->bytes_per_sec ? (__u64)len * BUDGET_NS_PER_SEC : 0;

    if (pt < pcost || bt < bcost) {
        b->packet_tokens = pt;
        b->byte_tokens = bt;
        b->refused_packets++;
        b->refused_bytes += len;
        return 0;
    }
    b->packet_tokens = pt - pcost;
    b->byte_tokens = bt - bcost;
    return 1;
}

#endif /* MIRROR_BUDGET_H */
