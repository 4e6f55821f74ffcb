/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains what a decision to mirror does (decide.h): mark the flow (and, across NAT,
 * the connection's other key, sharing one budget), count the rule's hit, send the request kept
 * before it to the mirror (replay.h) and report the trigger on the ring buffer. Run once per
 * trigger, off the common path (a global function).
 */
#ifndef MIRROR_TRIGGER_H
#define MIRROR_TRIGGER_H

#include "maps.h"
#include "parse.h"
#include "nat.h"
#include "replay.h"

/* emit_trigger - one ring-buffer record for the trigger; counted when the buffer is full. */
static __always_inline void emit_trigger(struct __sk_buff *skb, const struct pkt_meta *m,
                                         const struct rule_action *ra,
                                         const struct trigger_info *ti,
                                         const struct http_request *req,
                                         const struct flow_key *peer, const struct replay_slot *r,
                                         struct counters *cnt)
{
    struct trigger_event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);

    if (!ev) {
        cnt->v[STAT_RINGBUF_DROPS]++;
        return;
    }
    ev->key = m->key;
    if (peer)
        ev->nat = *peer;
    else
        __builtin_memset(&ev->nat, 0, sizeof(ev->nat));
    ev->ts_ns = bpf_ktime_get_ns();
    ev->rule_id = ra->rule_id;
    ev->ifindex = skb->ifindex;
    ev->status = ti->status;
    ev->hook = ti->hook;
    ev->dir = m->dir;
    ev->request_to_response_ns = ti->took;
    ev->request_head_len = 0;
    if (req->head_len) {
        ev->request_head_len = req->head_len;
        __builtin_memcpy(ev->request_head, req->head, HTTP_REQUEST_HEAD_LEN);
    } else {
        __builtin_memset(ev->request_head, 0, HTTP_REQUEST_HEAD_LEN);
    }
    ev->replay_ts_ns = 0;
    ev->replay_wire_len = 0;
    ev->replay_len = 0;
    if (r) {
        ev->replay_ts_ns = r->ts_ns;
        ev->replay_wire_len = r->wire_len;
        ev->replay_len = r->len;
        __builtin_memcpy(ev->replay, r->frame, REPLAY_FRAME_MAX);
    }
    bpf_ringbuf_submit(ev, 0);
}

/*
 * mirror_trigger - a response with @status matched @ra: mark the flow (and, across NAT, the
 * connection's other key, sharing the budget), count, report. The packet itself is copied by
 * the caller, like every packet of a marked flow. A global function: verified once.
 * @t: the flow's shared entry (may be NULL); the request answered, if any, is in the HTTP
 * stage's scratch area (see timing_response).
 * @return 1 when this call marked the flow, 0 when it was marked already (or could not be).
 */
__noinline int mirror_trigger(struct __sk_buff *skb, struct pkt_meta *m, struct rule_action *ra,
                              struct flow_timing *t, struct trigger_info *ti)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct http_scratch *s = bpf_map_lookup_elem(&http_scratch, &zero);

    if (!skb || !m || !ra || !ti || !cnt || !s)
        return 0;
    __u32 status = ti->status;
    __u64 now = m->now;
    struct flow_key *peer = &s->peer;
    int nat = nat_peer(skb, m, t, peer, 1);
    struct mirror_mark *init = &s->mark;
    __builtin_memset(init, 0, sizeof(*init));
    init->rule_id = ra->rule_id;
    init->slot = ra->slot;
    init->trigger_ns = now;
    init->deadline_ns = ra->max_duration_ns ? now + ra->max_duration_ns : 0;
    init->max_packets = ra->max_packets;
    init->max_bytes = ra->max_bytes;
    init->status = status;
    if (nat)
        init->peer = *peer;

    if (bpf_map_update_elem(&mirror_marks, &m->key, init, BPF_NOEXIST)) {
        /* Marked before (by another CPU, or an earlier response): nothing to do. */
        if (!bpf_map_lookup_elem(&mirror_marks, &m->key))
            cnt->v[STAT_MARK_INSERT_FAILED]++;
        return 0;
    }
    if (nat) {
        init->linked = 1;
        init->peer = m->key;
        if (bpf_map_update_elem(&mirror_marks, peer, init, BPF_NOEXIST) &&
            !bpf_map_lookup_elem(&mirror_marks, peer))
            cnt->v[STAT_MARK_INSERT_FAILED]++;
    }
    __sync_fetch_and_add(&mark_epoch, 2);
    __u32 slot = ra->slot;
    __u64 *hits = bpf_map_lookup_elem(&rule_hits, &slot);
    if (hits)
        (*hits)++;
    cnt->v[STAT_TRIGGERS]++;
    /* The request before the trigger goes to the mirror now, ahead of this response. */
    struct replay_slot *r = replay_trigger(skb, s, t, &m->key, cnt);
    emit_trigger(skb, m, ra, ti, &s->req, nat ? peer : NULL, r, cnt);
    return 1;
}

#endif /* MIRROR_TRIGGER_H */
