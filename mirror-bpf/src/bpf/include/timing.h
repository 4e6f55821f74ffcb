/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the timing of flows: HTTP request to response time and TCP handshake
 * time, kept per flow and aggregated in the kernel into per-interface latency histograms
 * (never one event per packet). The two ends of an interval may be seen on different CPUs,
 * so their timestamps meet in the shared flow_timing map; the clock is read only on the
 * packets that start or end an interval.
 */
#ifndef MIRROR_TIMING_H
#define MIRROR_TIMING_H

#include "maps.h"
#include "parse.h"
#include "hist.h"

#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10

/* timing_on - whether the timing @group is switched on (see enum timing_group). */
static __always_inline int timing_on(__u32 group)
{
    __u32 zero = 0;
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);

    return set && (set->timing & group);
}

/* timing_get - the flow's shared timing entry, created when @create. */
static __always_inline struct flow_timing *timing_get(const struct flow_key *key, int create,
                                                      struct counters *cnt)
{
    struct flow_timing *t = bpf_map_lookup_elem(&flow_timing, key);

    if (t || !create)
        return t;
    struct flow_timing init = {};
    bpf_map_update_elem(&flow_timing, key, &init, BPF_NOEXIST);
    t = bpf_map_lookup_elem(&flow_timing, key);
    if (!t)
        cnt->v[STAT_TIMING_INSERT_FAILED]++;
    return t;
}

/*
 * timing_request - an HTTP request starts: remember when, and its first bytes for events.
 * Written in place after the first request, so keep-alive flows never reinsert.
 */
static __always_inline void timing_request(struct __sk_buff *skb, const struct pkt_meta *m,
                                           struct counters *cnt)
{
    cnt->v[STAT_HTTP_REQUESTS]++;
    if (!timing_on(TIMING_HTTP))
        return;
    struct flow_timing *t = timing_get(&m->key, 1, cnt);
    if (!t)
        return;
    __u32 n = m->payload_len;
    if (n > HTTP_REQUEST_HEAD_LEN)
        n = HTTP_REQUEST_HEAD_LEN;
    /* payload_len >= HTTP_STATUS_LINE_MIN here; the check keeps the verifier's bound. */
    if (n < 1 || bpf_skb_load_bytes(skb, m->payload_off, t->head, n))
        n = 0;
    t->head_len = n;
    t->request_ns = bpf_ktime_get_ns();
}

/*
 * timing_response - a status line: the time since the flow's pending request, if any, is
 * added to the flow and to the histogram of this interface and status class. The clock is
 * read only when a request is pending.
 * @now: set to the precise clock when it was read.
 * @return the response time (0: no request was pending); @t is set to the timing entry.
 */
static __always_inline __u64 timing_response(struct __sk_buff *skb, const struct pkt_meta *m,
                                             struct flow_traffic *fs, __u16 status, __u64 *now,
                                             struct flow_timing **t, struct counters *cnt)
{
    *t = timing_get(&m->key, 0, cnt);
    if (!*t)
        return 0;
    __u64 req = (*t)->request_ns;
    if (!req)
        return 0;
    *now = bpf_ktime_get_ns();
    if (req > *now)
        return 0;
    /* Answered: a later status line of the same flow needs a new request. */
    (*t)->request_ns = 0;
    __u64 took = *now - req;
    if (fs) {
        fs->http_time_sum_ns += took;
        fs->http_timed++;
        if (took > fs->http_time_max_ns)
            fs->http_time_max_ns = took;
    }
    if (hist_add(skb->ifindex, HIST_HTTP_RESPONSE, status / 100, took))
        cnt->v[STAT_HIST_INSERT_FAILED]++;
    return took;
}

/*
 * timing_handshake - SYN, SYN/ACK and the ACK that completes the handshake. Only SYNs and
 * the first two packets of a direction on this CPU look at the shared entry.
 */
static __always_inline void timing_handshake(struct __sk_buff *skb, const struct pkt_meta *m,
                                             struct flow_traffic *fs, struct counters *cnt)
{
    __u8 f = m->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK);

    /* Most packets leave here: neither a SYN nor one of the first ACKs of their direction. */
    if (!(f & TCP_FLAG_SYN) && (f != TCP_FLAG_ACK || !fs || fs->dir[m->dir & 1].packets > 2))
        return;
    if (!timing_on(TIMING_HANDSHAKE))
        return;
    if (f == TCP_FLAG_SYN) {
        struct flow_timing *t = timing_get(&m->key, 1, cnt);
        if (t) {
            t->syn_ns = bpf_ktime_get_ns();
            t->synack_ns = 0;
            t->syn_dir = m->dir;
        }
        return;
    }
    if (f == (TCP_FLAG_SYN | TCP_FLAG_ACK)) {
        struct flow_timing *t = timing_get(&m->key, 0, cnt);
        if (t && t->syn_ns)
            t->synack_ns = bpf_ktime_get_ns();
        return;
    }
    struct flow_timing *t = timing_get(&m->key, 0, cnt);
    if (!t || !fs || !t->synack_ns || !t->syn_ns || t->syn_dir != m->dir)
        return;
    __u64 now = bpf_ktime_get_ns();
    if (now < t->syn_ns)
        return;
    __u64 took = now - t->syn_ns;
    t->syn_ns = 0; /* measured once */
    fs->handshake_us = took / 1000 ?: 1;
    if (hist_add(skb->ifindex, HIST_TCP_HANDSHAKE, 0, took))
        cnt->v[STAT_HIST_INSERT_FAILED]++;
}

#endif /* MIRROR_TIMING_H */
