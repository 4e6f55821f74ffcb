/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the flow table update: per CPU, no atomics, summed in user space.
 */
#ifndef MIRROR_FLOW_H
#define MIRROR_FLOW_H

#include "maps.h"
#include "parse.h"
#include "flow_dir.h"

/*
 * flow_account - count the packet in this CPU's slot of flow_table, creating the flow.
 * @now: the packet's time.
 * @cnt: this CPU's counters.
 * @created: set when this packet created the flow (on any CPU).
 * @return this CPU's entry of the flow, or NULL when it could not be created.
 */
static __always_inline struct flow_traffic *flow_account(const struct pkt_meta *m, __u32 len,
                                                         __u64 now, struct counters *cnt,
                                                         int *created)
{
    struct flow_traffic *fs = bpf_map_lookup_elem(&flow_table, &m->key);

    if (!fs) {
        __u32 zero = 0;
        struct zero_values *init = bpf_map_lookup_elem(&zero_values, &zero);
        if (!init)
            return NULL;
        long err = bpf_map_update_elem(&flow_table, &m->key, &init->traffic, BPF_NOEXIST);

        /* -EEXIST: another CPU created it meanwhile; our own slot is there, zeroed. */
        if (!err) {
            cnt->v[STAT_FLOWS_CREATED]++;
            *created = 1;
        }
        else if (err != -EEXIST)
            cnt->v[STAT_FLOW_INSERT_FAILED]++;
        fs = bpf_map_lookup_elem(&flow_table, &m->key);
        if (!fs)
            return NULL;
    }
    flow_dir_add(&fs->dir[m->dir & 1], len, m->tcp_flags, now);
    return fs;
}

#endif /* MIRROR_FLOW_H */
