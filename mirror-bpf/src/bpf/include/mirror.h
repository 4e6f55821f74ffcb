/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the mirroring decision: rule lookup by (port, status) and by status,
 * marking a flow on a trigger, the per-flow budget (packets, bytes, time), the node-wide
 * budget (budget.h), the copy to the mirror interface, and the trigger event. Nothing here can
 * drop the production packet.
 */
#ifndef MIRROR_MIRROR_H
#define MIRROR_MIRROR_H

#include "maps.h"
#include "parse.h"
#include "nat.h"
#include "budget.h"
#include "replay.h"

/* rule_pick - the rule of @e that matches a response that took @took ns (0: unknown). */
static __always_inline struct rule_action *rule_pick(struct rule_entry *e, __u64 took)
{
    if (!e)
        return NULL;
    if (e->any.rule_id)
        return &e->any;
    if (e->slow.rule_id && took && took >= e->slow.min_latency_ns)
        return &e->slow;
    return NULL;
}

/*
 * rule_lookup - the rule matching @status answered from server port @port in @took ns.
 * Port-scoped rules win over global ones. Cost: two array lookups, and a hash lookup only for
 * ports that have port-scoped rules.
 * @return the action, or NULL.
 */
static __always_inline struct rule_action *rule_lookup(__u16 port, __u16 status, __u64 took)
{
    __u32 word = port / 64;
    __u64 *bits = bpf_map_lookup_elem(&port_rule_bits, &word);

    if (bits && (*bits & (1ULL << (port % 64)))) {
        struct port_status_key k = {.port = port, .status = status};
        struct rule_action *ra = rule_pick(bpf_map_lookup_elem(&port_rules, &k), took);
        if (ra)
            return ra;
    }
    __u32 idx = status;
    return rule_pick(bpf_map_lookup_elem(&status_rules, &idx), took);
}

/*
 * mark_lookup - the mark of the flow, skipping the shared lookup while no trigger happened
 * since this CPU last looked (see mark_epoch).
 * @fs: this CPU's flow entry (NULL: always look up).
 */
static __always_inline struct mirror_mark *mark_lookup(struct flow_cache_slot *fs,
                                                       const struct flow_key *key)
{
    /* Read before the lookup: a trigger racing with it changes the epoch, so we look again. */
    __u32 epoch = mark_epoch;

    if (fs && fs->mark_seen == epoch)
        return NULL;
    struct mirror_mark *mk = bpf_map_lookup_elem(&mirror_marks, key);
    if (fs)
        fs->mark_seen = mk ? 0 : epoch;
    return mk;
}

/*
 * mark_admit - charge one packet of @len bytes to the mark's budget.
 * @return 1 when the packet is to be mirrored, 0 when the mark has ended.
 */
static __always_inline int mark_admit(struct mirror_mark *mk, __u32 len, __u64 now,
                                      struct counters *cnt)
{
    /* The other tuple of a translated connection: one budget, kept in the first mark. */
    if (mk->linked) {
        mk = bpf_map_lookup_elem(&mirror_marks, &mk->peer);
        if (!mk)
            return 0;
    }
    if (mk->ended)
        return 0;
    if (mk->deadline_ns && now > mk->deadline_ns)
        goto end;
    if (mk->max_bytes && mk->bytes >= mk->max_bytes)
        goto end;
    __u64 n = __sync_fetch_and_add(&mk->packets, 1);
    if (mk->max_packets && n >= mk->max_packets) {
        __sync_fetch_and_add(&mk->packets, -1);
        goto end;
    }
    __sync_fetch_and_add(&mk->bytes, len);
    return 1;
end:
    if (__sync_val_compare_and_swap(&mk->ended, 0, 1) == 0)
        cnt->v[STAT_MIRROR_ENDED]++;
    return 0;
}

/*
 * mirror_copy - copy the packet to the mirror interface.
 * With MIRROR_MIRRED the classic filter's act_mirred copies (on the program's match): we
 * only count.
 * @return 1 when a copy was made (or handed to mirred).
 */
static __always_inline int mirror_copy(struct __sk_buff *skb, enum mirror_method method,
                                       struct counters *cnt)
{
    __u32 len = skb->len;

    /* The node-wide budget: only here, where a copy is about to be made. */
    if (!budget_admit(len))
        return 0;
    if (method == MIRROR_CLONE) {
        __u32 zero = 0;
        struct settings *set = bpf_map_lookup_elem(&settings, &zero);

        if (!set || !set->mirror_ifindex) {
            cnt->v[STAT_MIRROR_NO_TARGET]++;
            return 0;
        }
        if (bpf_clone_redirect(skb, set->mirror_ifindex, mirror_clone_flags & BPF_F_INGRESS)) {
            cnt->v[STAT_MIRROR_ERRORS]++;
            return 0;
        }
    }
    cnt->v[STAT_MIRRORED_PACKETS]++;
    cnt->v[STAT_MIRRORED_BYTES] += len;
    return 1;
}

/* emit_trigger - one ring-buffer record for the trigger; counted when the buffer is full. */
static __always_inline void emit_trigger(struct __sk_buff *skb, const struct pkt_meta *m,
                                         const struct rule_action *ra,
                                         const struct trigger_info *ti,
                                         const struct http_request *req, const struct flow_key *peer,
                                         const struct replay_slot *r, struct counters *cnt)
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

#endif /* MIRROR_MIRROR_H */
