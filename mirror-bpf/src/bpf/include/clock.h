/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the time of a packet. TCP puts on every segment it sends its departure
 * time (skb->tstamp, CLOCK_MONOTONIC, "earliest departure time"), and the stamp survives the
 * veth into the node's namespace: a pod's segment arrives at our hooks carrying the time its
 * stack sent it, a few microseconds before we see it. Reading it costs a load; reading the
 * clock costs about 55 ns on real traffic (a seqlock and the TSC, measured on the floor
 * program). Packets without such a stamp (no TCP stack behind them, a receive timestamp,
 * test_run) read the clock. Reading tstamp_type is what makes the kernel hand the stamp to a
 * program at ingress rather than 0.
 */
#ifndef MIRROR_CLOCK_H
#define MIRROR_CLOCK_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* packet_time - @skb's departure time from its sender's TCP stack, else the clock (ns). */
static __always_inline __u64 packet_time(struct __sk_buff *skb)
{
    if (skb->tstamp_type == BPF_SKB_CLOCK_MONOTONIC) {
        __u64 t = skb->tstamp;
        if (t)
            return t;
    }
    return bpf_ktime_get_ns();
}

#endif /* MIRROR_CLOCK_H */
