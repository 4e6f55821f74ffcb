/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains what a decision to mirror does (decide.h, noresponse.h): mark the flow
 * (and, across NAT, the connection's other key, sharing one budget), count the rule's hit,
 * send the request behind it to the mirror (replay.h) and report the trigger on the ring
 * buffer. Run once per trigger, off the common path.
 */
#ifndef MIRROR_TRIGGER_H
#define MIRROR_TRIGGER_H

#include "maps.h"
#include "parse.h"
#include "nat.h"
#include "replay.h"

/*
 * emit_trigger - one ring-buffer record for the trigger of the flow @key, by a packet of
 * direction @dir seen on @ifindex; counted when the buffer is full.
 * @return 1 when the record was sent, 0 when the buffer was full.
 */
static __always_inline int emit_trigger(const struct flow_key *key, __u32 dir, __u32 ifindex,
                                        const struct rule_action *ra, const struct trigger_info *ti,
                                        const struct http_request *req,
                                        const struct host_text *authority,
                                        const struct flow_key *peer, const struct replay_slot *r,
                                        struct counters *cnt)
{
    struct trigger_event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);

    if (!ev) {
        cnt->v[STAT_RINGBUF_DROPS]++;
        return 0;
    }
    ev->key = *key;
    if (peer)
        ev->nat = *peer;
    else
        __builtin_memset(&ev->nat, 0, sizeof(ev->nat));
    ev->ts_ns = bpf_ktime_get_ns();
    ev->rule_id = ra->rule_id;
    ev->ifindex = ifindex;
    ev->status = ti->status;
    ev->hook = ti->hook;
    ev->dir = dir;
    ev->kind = ti->kind;
    ev->by = ti->by;
    ev->proto = ti->proto;
    ev->request = ti->request;
    ev->dns_type = ti->proto == PROTO_DNS ? ti->dns_type : 0;
    ev->dns_id = ti->proto == PROTO_DNS ? ti->dns_id : 0;
    ev->stream = ti->stream;
    ev->authority_len = 0;
    if (authority && ti->proto == HTTP_PROTO_2) {
        ev->authority_len = authority->len < H2_TEXT ? authority->len : H2_TEXT;
        __builtin_memcpy(ev->authority, authority->text, H2_TEXT);
    } else {
        __builtin_memset(ev->authority, 0, H2_TEXT);
    }
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
        /* Taken over while it was copied (the request's answer came, and a later request of
         * the flow was kept in its slot: noresponse.h): not this request's segment. */
        if (!replay_intact(r, ti->replay_req)) {
            ev->replay_len = 0;
            cnt->v[STAT_REPLAY_MISSED]++;
        }
    }
    bpf_ringbuf_submit(ev, 0);
    return 1;
}

/*
 * mark_flow - mark the flow of @key (and @peer, the other key of a translated connection, when
 * not NULL: one budget, kept in @key's mark) for @ra at @now, the trigger described by @ti;
 * count the rule's hit and the trigger.
 * @return 1 when this call marked the flow, 0 when it was marked already (or could not be).
 */
static __always_inline int mark_flow(const struct flow_key *key, const struct flow_key *peer,
                                     const struct rule_action *ra, const struct trigger_info *ti,
                                     __u64 now, struct mirror_mark *init, struct counters *cnt)
{
    __builtin_memset(init, 0, sizeof(*init));
    init->rule_id = ra->rule_id;
    init->slot = ra->slot;
    init->trigger_ns = now;
    init->deadline_ns = ra->max_duration_ns ? now + ra->max_duration_ns : 0;
    init->max_packets = ra->max_packets;
    init->max_bytes = ra->max_bytes;
    init->status = ti->status;
    init->kind = ti->kind;
    if (peer)
        init->peer = *peer;

    if (bpf_map_update_elem(&mirror_marks, key, init, BPF_NOEXIST)) {
        /* Marked before (by another CPU, or an earlier trigger): nothing to do. */
        if (!bpf_map_lookup_elem(&mirror_marks, key))
            cnt->v[STAT_MARK_INSERT_FAILED]++;
        return 0;
    }
    if (peer) {
        init->linked = 1;
        init->peer = *key;
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
    if (ti->kind == TRIGGER_RESET)
        cnt->v[STAT_RESET_TRIGGERS]++;
    else if (ti->kind == TRIGGER_NORESPONSE)
        cnt->v[STAT_NORESPONSE_TRIGGERS]++;
    else if (ti->kind == TRIGGER_GRPC)
        cnt->v[STAT_GRPC_TRIGGERS]++;
    else if (ti->kind == TRIGGER_DNS)
        cnt->v[STAT_DNS_TRIGGERS]++;
    else if (ti->kind == TRIGGER_DROP)
        cnt->v[STAT_DROP_TRIGGERS]++;
    return 1;
}

/* trigger_claim's answers. */
#define CLAIM_HELD -1 /* another run holds the connection's claim: it replays and marks */
#define CLAIM_NONE 0  /* the claims table is full: go on unclaimed */
#define CLAIM_TAKEN 1 /* held until trigger_release */

/* claim_key - the key a connection is claimed under: the lesser of @key and @peer (NULL
 * when not translated), so that a trigger seen under either key finds one claim. */
static __always_inline const struct flow_key *claim_key(const struct flow_key *key,
                                                        const struct flow_key *peer)
{
    if (!peer)
        return key;
    const __u32 *a = (const __u32 *)key, *b = (const __u32 *)peer;
#pragma unroll
    for (int i = 0; i < sizeof(*key) / sizeof(__u32); i++)
        if (a[i] != b[i])
            return a[i] < b[i] ? key : peer;
    return key;
}

/*
 * trigger_claim - claim the connection of @key (@peer: its other key, or NULL) for one trigger
 * at @now, then look at its mark again: a trigger that lost the race to another CPU finds
 * either the claim held or, once the holder let it go, the flow marked. Only the holder
 * replays and marks, so the replay on the mirror is always the marking trigger's request.
 * @return CLAIM_HELD (held, or marked meanwhile: nothing to do), CLAIM_NONE or CLAIM_TAKEN.
 */
static __always_inline int trigger_claim(const struct flow_key *key, const struct flow_key *peer,
                                         __u64 now)
{
    const struct flow_key *ck = claim_key(key, peer);
    int taken = CLAIM_TAKEN;
    long err = bpf_map_update_elem(&trigger_claims, ck, &now, BPF_NOEXIST);

    if (err == -EEXIST)
        return CLAIM_HELD;
    if (err)
        taken = CLAIM_NONE;
    if (bpf_map_lookup_elem(&mirror_marks, key)) {
        if (taken == CLAIM_TAKEN)
            bpf_map_delete_elem(&trigger_claims, ck);
        return CLAIM_HELD;
    }
    return taken;
}

/* trigger_release - let go of a claim trigger_claim answered @taken for. */
static __always_inline void trigger_release(const struct flow_key *key, const struct flow_key *peer,
                                            int taken)
{
    if (taken == CLAIM_TAKEN)
        bpf_map_delete_elem(&trigger_claims, claim_key(key, peer));
}

/*
 * mirror_trigger - a packet of @m's flow (@skb) matched @ra: replay the request behind it
 * ahead of the packet, mark the flow (and, across NAT, the connection's other key), report. The
 * packet itself is copied by the caller, like every packet of a marked flow. A global
 * function: verified once.
 * @t: the flow's shared entry (may be NULL); the request behind the trigger, if any, is in
 * the HTTP stage's scratch area (s->req, and ti->replay for its segment).
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
    struct flow_key *peer = &s->peer;
    int nat = nat_peer(skb, m, t, peer, 1);
    if (bpf_map_lookup_elem(&mirror_marks, &m->key))
        return 0; /* marked before: nothing to do */
    const struct flow_key *other = nat ? peer : NULL;
    int taken = trigger_claim(&m->key, other, m->now);
    if (taken == CLAIM_HELD)
        return 0; /* another CPU triggers this connection: it replays and marks */
    /* The request before the trigger goes to the mirror first, the mark after: a packet copied
     * because of the mark, on any CPU, is handled after the replay has left. */
    struct replay_slot *r = replay_trigger(skb, s, ti, cnt);
    int marked = mark_flow(&m->key, other, ra, ti, m->now, &s->mark, cnt);
    trigger_release(&m->key, other, taken);
    if (!marked)
        return 0;
    emit_trigger(&m->key, m->dir, skb->ifindex, ra, ti, &s->req, &s->host, other, r, cnt);
    return 1;
}

#endif /* MIRROR_TRIGGER_H */
