/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the mirroring decision: rule lookup by (port, status) and by status,
 * marking a flow on a trigger, the per-flow budget (packets, bytes, time), the copy to the
 * mirror interface, and the trigger event. Nothing here can drop the production packet.
 */
#ifndef MIRROR_MIRROR_H
#define MIRROR_MIRROR_H

#include "maps.h"
#include "parse.h"
#include "timing.h"

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
static __always_inline struct mirror_mark *mark_lookup(struct flow_traffic *fs,
                                                       const struct flow_key *key)
{
    /* Read before the lookup: a trigger racing with it changes the epoch, so we look again. */
    __u32 epoch = mark_epoch;

    if (fs && !fs->marked && fs->mark_epoch == epoch)
        return NULL;
    struct mirror_mark *mk = bpf_map_lookup_elem(&mirror_marks, key);
    if (fs) {
        fs->mark_epoch = epoch;
        fs->marked = mk != NULL;
    }
    return mk;
}

/*
 * mark_admit - charge one packet of @len bytes to the mark's budget.
 * @return 1 when the packet is to be mirrored, 0 when the mark has ended.
 */
static __always_inline int mark_admit(struct mirror_mark *mk, __u32 len, __u64 now,
                                      struct counters *cnt)
{
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
 * With MIRROR_MIRRED the classic filter's act_mirred copies: we only count.
 * @return 1 when a copy was made (or handed to mirred).
 */
static __always_inline int mirror_copy(struct __sk_buff *skb, enum mirror_method method,
                                       struct counters *cnt)
{
    __u32 len = skb->len;

    if (method == MIRROR_CLONE) {
        __u32 zero = 0;
        struct settings *set = bpf_map_lookup_elem(&settings, &zero);

        if (!set || !set->mirror_ifindex) {
            cnt->v[STAT_MIRROR_NO_TARGET]++;
            return 0;
        }
        if (bpf_clone_redirect(skb, set->mirror_ifindex, 0)) {
            cnt->v[STAT_MIRROR_ERRORS]++;
            return 0;
        }
    } else {
        __u32 zero = 0;
        __u32 *verdict = bpf_map_lookup_elem(&mirred_verdict, &zero);

        if (verdict)
            *verdict = 1;
    }
    cnt->v[STAT_MIRRORED_PACKETS]++;
    cnt->v[STAT_MIRRORED_BYTES] += len;
    return 1;
}

/* The HTTP exchange that triggered: its status, response time and request. */
struct trigger_ctx {
    __u16 status;
    __u64 took;             /* request to status line, 0 if no request was seen */
    struct flow_timing *t;  /* the flow's timing entry (request head), may be NULL */
};

/* emit_trigger - one ring-buffer record for the trigger; counted when the buffer is full. */
static __always_inline void emit_trigger(struct __sk_buff *skb, const struct pkt_meta *m,
                                         const struct rule_action *ra,
                                         const struct trigger_ctx *tc, enum hook_kind hook,
                                         __u64 now, struct counters *cnt)
{
    struct trigger_event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);

    if (!ev) {
        cnt->v[STAT_RINGBUF_DROPS]++;
        return;
    }
    ev->key = m->key;
    ev->ts_ns = now;
    ev->rule_id = ra->rule_id;
    ev->ifindex = skb->ifindex;
    ev->status = tc->status;
    ev->hook = hook;
    ev->dir = m->dir;
    ev->request_to_response_ns = tc->took;
    ev->request_head_len = 0;

    struct flow_timing *t = tc->t;
    if (tc->took && t) {
        ev->request_head_len = t->head_len;
        __builtin_memcpy(ev->request_head, t->head, HTTP_REQUEST_HEAD_LEN);
    } else {
        __builtin_memset(ev->request_head, 0, HTTP_REQUEST_HEAD_LEN);
    }
    bpf_ringbuf_submit(ev, 0);
}

/*
 * mirror_trigger - a response matched @ra: mark the flow, count, report, mirror this packet.
 * @now: the coarse clock of mark limits; @precise: the clock of the request timestamps.
 * @return 1 when the packet is to be mirrored.
 */
static __always_inline int mirror_trigger(struct __sk_buff *skb, const struct pkt_meta *m,
                                          const struct rule_action *ra,
                                          const struct trigger_ctx *tc, enum hook_kind hook,
                                          __u64 now, __u64 precise, struct counters *cnt)
{
    struct mirror_mark init = {
        .rule_id = ra->rule_id,
        .slot = ra->slot,
        .trigger_ns = now,
        .deadline_ns = ra->max_duration_ns ? now + ra->max_duration_ns : 0,
        .max_packets = ra->max_packets,
        .max_bytes = ra->max_bytes,
        .status = tc->status,
    };

    if (bpf_map_update_elem(&mirror_marks, &m->key, &init, BPF_NOEXIST)) {
        /* Another CPU marked it first: follow its mark. */
        struct mirror_mark *mk = bpf_map_lookup_elem(&mirror_marks, &m->key);
        if (!mk) {
            cnt->v[STAT_MARK_INSERT_FAILED]++;
            return 1;
        }
        return mark_admit(mk, skb->len, now, cnt);
    }

    __sync_fetch_and_add(&mark_epoch, 1);
    __u32 slot = ra->slot;
    __u64 *hits = bpf_map_lookup_elem(&rule_hits, &slot);
    if (hits)
        (*hits)++;
    cnt->v[STAT_TRIGGERS]++;
    emit_trigger(skb, m, ra, tc, hook, precise, cnt);

    struct mirror_mark *mk = bpf_map_lookup_elem(&mirror_marks, &m->key);
    return mk ? mark_admit(mk, skb->len, now, cnt) : 1;
}

#endif /* MIRROR_MIRROR_H */
