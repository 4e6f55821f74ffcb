/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the flow table update (per CPU, no atomics) and the bookkeeping of
 * HTTP requests per flow, read later by the response for its request-to-response time.
 */
#ifndef MIRROR_FLOW_H
#define MIRROR_FLOW_H

#include "maps.h"
#include "parse.h"

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

/*
 * flow_account - count the packet in this CPU's slot of flow_table, creating the flow.
 * @now: a coarse clock is enough for first/last seen.
 * @cnt: this CPU's counters.
 * @return this CPU's entry of the flow, or NULL when it could not be created.
 */
static __always_inline struct flow_traffic *flow_account(const struct pkt_meta *m, __u32 len,
                                                         __u64 now, struct counters *cnt)
{
    struct flow_traffic *fs = bpf_map_lookup_elem(&flow_table, &m->key);

    if (!fs) {
        struct flow_traffic init = {};

        long err = bpf_map_update_elem(&flow_table, &m->key, &init, BPF_NOEXIST);

        /* -EEXIST: another CPU created it meanwhile; our own slot is there, zeroed. */
        if (!err)
            cnt->v[STAT_FLOWS_CREATED]++;
        else if (err != -EEXIST)
            cnt->v[STAT_FLOW_INSERT_FAILED]++;
        fs = bpf_map_lookup_elem(&flow_table, &m->key);
        if (!fs)
            return NULL;
    }
    flow_dir_add(&fs->dir[m->dir & 1], len, m->tcp_flags, now);
    return fs;
}

/*
 * http_note_request - remember when the latest request of the flow was seen, and its start.
 * Written in place after the first request so that keep-alive flows never reinsert.
 */
static __always_inline void http_note_request(struct __sk_buff *skb, const struct pkt_meta *m,
                                              __u64 now, struct counters *cnt)
{
    struct http_request *rq = bpf_map_lookup_elem(&http_requests, &m->key);

    cnt->v[STAT_HTTP_REQUESTS]++;
    if (!rq) {
        struct http_request init = {};

        bpf_map_update_elem(&http_requests, &m->key, &init, BPF_NOEXIST);
        rq = bpf_map_lookup_elem(&http_requests, &m->key);
        if (!rq) {
            cnt->v[STAT_REQUEST_INSERT_FAILED]++;
            return;
        }
    }
    __u32 n = m->payload_len;
    if (n > HTTP_REQUEST_HEAD_LEN)
        n = HTTP_REQUEST_HEAD_LEN;
    /* payload_len >= HTTP_STATUS_LINE_MIN here; the check keeps the verifier's bound. */
    if (n < 1 || bpf_skb_load_bytes(skb, m->payload_off, rq->head, n))
        n = 0;
    rq->head_len = n;
    rq->ts_ns = now;
}

#endif /* MIRROR_FLOW_H */
