/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the counting of one packet in one direction of a flow: what the flow
 * table keeps per packet (flow.h), and what the floor program keeps (baseline.bpf.c).
 */
#ifndef MIRROR_FLOW_DIR_H
#define MIRROR_FLOW_DIR_H

#include "types.h"

/* flow_dir_add - count one packet of @len bytes in @d. */
static __always_inline void flow_dir_add(struct flow_dir_stats *d, __u32 len, __u8 flags, __u64 now)
{
    if (!d->first_seen_ns)
        d->first_seen_ns = now;
    d->packets++;
    d->bytes += len;
    d->last_seen_ns = now;
    d->tcp_flags |= flags;
}

#endif /* MIRROR_FLOW_DIR_H */
