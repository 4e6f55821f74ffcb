/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the latency histograms aggregated in the kernel: the bucket of an
 * interval (8 buckets per power of two of nanoseconds) and the per-CPU histogram update.
 * Shared by the classifier and the tracing programs.
 */
#ifndef MIRROR_HIST_H
#define MIRROR_HIST_H

#include "shared_maps.h"

/* hist_bucket - the bucket of @ns: exact below 8, then 8 sub-buckets per power of two. */
static __always_inline __u32 hist_bucket(__u64 ns)
{
    if (ns < (1 << HIST_SUB_BITS))
        return ns;
    __u64 v = ns;
    __u32 msb = 0;
    if (v >> 32) {
        v >>= 32;
        msb += 32;
    }
    if (v >> 16) {
        v >>= 16;
        msb += 16;
    }
    if (v >> 8) {
        v >>= 8;
        msb += 8;
    }
    if (v >> 4) {
        v >>= 4;
        msb += 4;
    }
    if (v >> 2) {
        v >>= 2;
        msb += 2;
    }
    if (v >> 1)
        msb += 1;
    __u32 b = (msb - HIST_SUB_BITS + 1) * (1 << HIST_SUB_BITS) +
              ((ns >> (msb - HIST_SUB_BITS)) & ((1 << HIST_SUB_BITS) - 1));
    return b < HIST_BUCKETS ? b : HIST_BUCKETS - 1;
}

/*
 * hist_add - count one interval of @ns in the histogram (@ifindex, @kind, @class).
 * @return 0, or -1 when the histogram could not be created (the sample is lost).
 */
static __always_inline int hist_add(__u32 ifindex, __u8 kind, __u8 class, __u64 ns)
{
    struct hist_key k = {.ifindex = ifindex, .kind = kind, .class = class};
    struct latency_hist *h = bpf_map_lookup_elem(&latency_hists, &k);

    if (!h) {
        __u32 zero = 0;
        struct latency_hist *init = bpf_map_lookup_elem(&hist_zero, &zero);
        if (!init)
            return -1;
        bpf_map_update_elem(&latency_hists, &k, init, BPF_NOEXIST);
        h = bpf_map_lookup_elem(&latency_hists, &k);
        if (!h)
            return -1;
    }
    __u32 b = hist_bucket(ns);
    if (b < HIST_BUCKETS)
        h->buckets[b]++;
    h->count++;
    h->sum_ns += ns;
    return 0;
}

#endif /* MIRROR_HIST_H */
