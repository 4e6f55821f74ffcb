/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the accounting of a packet in its flow: in this CPU's flow cache slot
 * (flow_cache.h), which stands in for the flow's per-CPU flow_table entry while the flow holds
 * it. The entry is read when a flow takes a slot and written when it leaves it, or every
 * FLOW_CACHE_WRITEBACK packets of a direction (which also keeps it recent in the LRU): a packet
 * of a cached flow makes no hash lookup.
 */
#ifndef MIRROR_FLOW_H
#define MIRROR_FLOW_H

#include "maps.h"
#include "parse.h"
#include "flow_cache.h"

/*
 * flow_cache_flush - write what @c counted since its last write-back into this CPU's
 * flow_table entry of its flow (recreated when the LRU evicted it), with the flow's HTTP and
 * mark state. A global function: verified once, run on a slot's eviction and every
 * FLOW_CACHE_WRITEBACK packets.
 * @return 1 when written (the counts are kept in the slot otherwise, for the next try).
 */
__noinline int flow_cache_flush(struct flow_cache_slot *c)
{
    __u32 zero = 0;

    if (!c || !c->key.family)
        return 0;
    struct flow_traffic *ft = bpf_map_lookup_elem(&flow_table, &c->key);
    if (!ft) {
        struct zero_values *init = bpf_map_lookup_elem(&zero_values, &zero);
        if (!init)
            return 0;
        bpf_map_update_elem(&flow_table, &c->key, &init->traffic, BPF_NOEXIST);
        ft = bpf_map_lookup_elem(&flow_table, &c->key);
        if (!ft)
            return 0;
    }
#pragma unroll
    for (int i = 0; i < FLOW_DIRS; i++) {
        struct flow_dir_stats *d = &ft->dir[i];
        struct flow_cache_dir *cd = &c->dir[i];
        d->packets += c->packets[i];
        d->bytes += cd->bytes;
        if (!d->first_seen_ns)
            d->first_seen_ns = cd->first_seen_ns;
        if (cd->last_seen_ns > d->last_seen_ns)
            d->last_seen_ns = cd->last_seen_ns;
        d->tcp_flags |= c->tcp_flags[i];
        d->http_kind = c->http_kind[i];
        d->http_misses = c->http_misses[i];
        if (d->packets > 2)
            c->past_handshake |= 1 << i;
        c->packets[i] = 0;
        cd->bytes = 0;
    }
    ft->mark_seen = c->mark_seen;
    ft->timing_slot = c->timing_slot;
    ft->http_timed += c->http_timed;
    ft->http_time_sum_ns += c->http_time_sum_ns;
    if (c->http_time_max_ns > ft->http_time_max_ns)
        ft->http_time_max_ns = c->http_time_max_ns;
    c->http_timed = 0;
    c->http_time_sum_ns = 0;
    return 1;
}

/*
 * flow_cache_fill - the flow of @key takes the slot @c: the flow there is written back, then
 * this CPU's flow_table entry of @key (created when there is none) gives the state the slot
 * starts from. A global function: verified once, run on a miss only.
 * @return 1 when this call created the flow (on any CPU).
 */
__noinline int flow_cache_fill(struct flow_cache_slot *c, const struct flow_key *key)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct zero_values *init = bpf_map_lookup_elem(&zero_values, &zero);

    if (!c || !key || !cnt || !init)
        return 0;
    flow_cache_flush(c);
    int created = 0;
    struct flow_traffic *ft = bpf_map_lookup_elem(&flow_table, key);
    if (!ft) {
        long err = bpf_map_update_elem(&flow_table, key, &init->traffic, BPF_NOEXIST);

        /* -EEXIST: another CPU created it meanwhile; our own slot is there, zeroed. */
        if (!err) {
            cnt->v[STAT_FLOWS_CREATED]++;
            created = 1;
        } else if (err != -EEXIST) {
            /* Counted in the slot all the same: its write-back tries again. */
            cnt->v[STAT_FLOW_INSERT_FAILED]++;
        }
        ft = bpf_map_lookup_elem(&flow_table, key);
    }
    flow_cache_take(c, key);
    if (ft) {
        c->mark_seen = ft->mark_seen;
        c->timing_slot = ft->timing_slot;
#pragma unroll
        for (int i = 0; i < FLOW_DIRS; i++) {
            c->http_kind[i] = ft->dir[i].http_kind;
            c->http_misses[i] = ft->dir[i].http_misses;
            if (ft->dir[i].packets > 2)
                c->past_handshake |= 1 << i;
        }
    }
    return created;
}

/*
 * flow_account - count the packet of @m in this CPU's cache slot of its flow, which it takes
 * on a miss (flow_cache_fill); the slot's index is kept in m->slot for the later stages.
 * @created: set when this packet created the flow (on any CPU).
 * @return the flow's slot, or NULL (never, unless the cache is smaller than the CPUs).
 */
static __always_inline struct flow_cache_slot *flow_account(struct pkt_meta *m, __u32 len,
                                                            __u64 now, int *created)
{
    __u32 idx = m->slot = flow_cache_index(&m->key);
    struct flow_cache_slot *c = bpf_map_lookup_elem(&flow_cache, &idx);

    if (!c)
        return NULL;
    if (!flow_key_eq(&c->key, &m->key))
        *created = flow_cache_fill(c, &m->key);
    if (flow_cache_count(c, m->dir, len, m->tcp_flags, now))
        flow_cache_flush(c);
    return c;
}

#endif /* MIRROR_FLOW_H */
