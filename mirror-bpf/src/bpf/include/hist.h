/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the latency histograms aggregated in the kernel: the bucket of an
 * interval (8 buckets per power of two of nanoseconds) and the per-CPU histogram update.
 * Shared by the classifier and the tracing programs.
 */
#ifndef MIRROR_HIST_H
#define MIRROR_HIST_H

#include "shared_maps.h"

/*
 * hist_bucket - the bucket of @ns: exact below 8, then 8 sub-buckets per power of two.
 * The highest set bit is found without branches (BPF has no instruction for it): each step
 * halves the width searched, (x + 2^w - 1) >> w being 1 exactly when x, below 2^w, is not 0.
 * On real traffic that cost about 20-28 ns less per answer than a branch per step, whose
 * outcome varies with every latency.
 */
static __always_inline __u32 hist_bucket(__u64 ns)
{
    if (ns < (1 << HIST_SUB_BITS))
        return ns;
    __u64 v = ns;
    __u32 msb = 0;
#pragma unroll
    for (__u32 w = 32; w >= 2; w /= 2) {
        __u64 s = (((v >> w) + ((1ULL << w) - 1)) >> w) * w;
        v >>= s;
        msb += s;
    }
    msb += v >> 1;
    __u32 b = (msb - HIST_SUB_BITS + 1) * (1 << HIST_SUB_BITS) +
              ((ns >> (msb - HIST_SUB_BITS)) & ((1 << HIST_SUB_BITS) - 1));
    return b < HIST_BUCKETS ? b : HIST_BUCKETS - 1;
}

/*
 * hist_slot - the latency_hists slot of the histogram (@ifindex, @kind, @class), given out on
 * its first sample. A global function: verified once (and its frame off the deepest chain).
 * @return the slot + 1, or 0 when every slot is taken.
 */
__noinline __u32 hist_slot(__u32 ifindex, __u32 kind, __u32 class)
{
    struct hist_key k = {.ifindex = ifindex, .kind = kind, .class = class};
    __u32 *at = bpf_map_lookup_elem(&hist_slots, &k);

    if (at)
        return *at + 1;
    __u32 zero = 0;
    __u32 *next = bpf_map_lookup_elem(&hist_next, &zero);
    if (!next)
        return 0;
    __u32 slot = __sync_fetch_and_add(next, 1);
    if (slot >= HIST_SLOTS)
        return 0;
    /* A slot never given out is zero on every CPU. Racing with another CPU, the first insert
     * wins (this slot stays unused). */
    bpf_map_update_elem(&hist_slots, &k, &slot, BPF_NOEXIST);
    at = bpf_map_lookup_elem(&hist_slots, &k);
    return at ? *at + 1 : 0;
}

/* hist_count - count one interval of @ns in the histogram of @slot + 1. @return 0, or -1. */
static __always_inline int hist_count(__u32 slot, __u64 ns)
{
    __u32 idx = slot - 1;
    struct latency_hist *h = slot ? bpf_map_lookup_elem(&latency_hists, &idx) : NULL;

    if (!h)
        return -1;
    __u32 b = hist_bucket(ns);
    if (b < HIST_BUCKETS)
        h->buckets[b]++;
    h->count++;
    h->sum_ns += ns;
    return 0;
}

/* hist_cache_index - where hist_cache_entry.slot keeps the histogram of (@kind, @class). */
static __always_inline __u32 hist_cache_index(__u8 kind, __u8 class)
{
    return kind == HIST_HTTP_RESPONSE ? class % 6 : 5 + kind;
}

/*
 * hist_add - count one interval of @ns in the histogram (@ifindex, @kind, @class), whose slot
 * this CPU's hist_cache remembers (hist_slot finds it the first time).
 * @return 0, or -1 when the histogram could not be created (the sample is lost).
 */
static __always_inline int hist_add(__u32 ifindex, __u8 kind, __u8 class, __u64 ns)
{
    __u32 at = ifindex & (HIST_CACHE_IFACES - 1), i = hist_cache_index(kind, class);
    struct hist_cache_entry *c = bpf_map_lookup_elem(&hist_cache, &at);
    __u32 slot = 0;

    /* Opaque to the compiler, so that the bound below stays for the verifier. */
    asm volatile("" : "+r"(i));
    if (i >= HIST_CACHE_KEYS)
        c = NULL;
    if (c) {
        if (c->ifindex != ifindex) {
            __builtin_memset(c, 0, sizeof(*c));
            c->ifindex = ifindex;
        }
        slot = c->slot[i];
    }
    if (!slot) {
        slot = hist_slot(ifindex, kind, class);
        if (c)
            c->slot[i] = slot;
    }
    return hist_count(slot, ns);
}

#endif /* MIRROR_HIST_H */
