/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the third kind of trigger: a request whose response has not begun within
 * a noresponse rule's time. No packet may ever come to tell, so a timer decides: one BPF timer
 * per flow with requests pending (pending_timers, beside the flow's flow_timing slot), armed
 * when the flow's first request is queued and running while any is. When it fires it looks at
 * the oldest request pending: waited long enough for a rule, the flow is marked then (the mark
 * carries the request's kept segment, replayed with the first packet after the mark: replay.h
 * replay_due); else the timer is set again for the next time a rule could match that request
 * (a request answered meanwhile is simply no longer the oldest). A flow costs one timer start
 * per rule time while it has requests pending, never one per request; a request costs one
 * load of the timer's state while the timer runs.
 *
 * The time is the request's as the HTTP stage took it (packet_time: its sender's departure
 * stamp, else the clock at the hook), against the monotonic clock the timer runs on.
 */
#ifndef MIRROR_NORESPONSE_H
#define MIRROR_NORESPONSE_H

#include "maps.h"
#include "rule.h"
#include "trigger.h"

#define NORESPONSE_CLOCK 1 /* CLOCK_MONOTONIC */

/* entry_next - the lowest noresponse time of @e above @waited (0: none). */
static __always_inline __u64 entry_next(const struct rule_entry *e, __u64 waited)
{
    __u64 best = 0;

    if (!e)
        return 0;
    if (e->slow.rule_id && e->slow.min_latency_ns > waited)
        best = e->slow.min_latency_ns;
    for (int i = 0; i < RULE_FILTERED_MAX; i++) {
        __u32 slot = e->filtered[i];
        if (!slot)
            break;
        struct rule_filter *f = bpf_map_lookup_elem(&rule_filters, &slot);
        if (!f)
            continue;
        __u64 d = f->action.min_latency_ns;
        if (d > waited && (!best || d < best))
            best = d;
    }
    return best;
}

/*
 * noresponse_next - the next time after @waited ns at which a noresponse rule of server port
 * @port could match (0: none will). A global function: verified once.
 */
__noinline __u64 noresponse_next(__u16 port, __u64 waited)
{
    struct rule_entry *scoped;
    struct rule_entry *global = rule_entries(port, TRIGGER_NORESPONSE, &scoped);
    __u64 a = entry_next(scoped, waited), b = entry_next(global, waited);

    return a && (!b || a < b) ? a : b;
}

/*
 * noresponse_mark - the oldest request @req of @t waited @waited ns, matching @ra: mark the
 * flow (and the other key of a translated connection), its request to be replayed with the
 * next packet, and report.
 */
static __always_inline void noresponse_mark(struct flow_timing *t, struct pending_timer *pt,
                                            const struct http_request *req,
                                            const struct rule_action *ra, __u64 waited, __u64 now)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct http_scratch *s = bpf_map_lookup_elem(&http_scratch, &zero);

    if (!cnt || !s)
        return;
    /* The softirq this runs in never interrupts a classifier run on this CPU (tc runs with
     * bottom halves off), so the scratch area is free. */
    struct trigger_info *ti = &s->trigger;
    ti->took = waited;
    ti->status = 0;
    ti->hook = 0;
    ti->kind = TRIGGER_NORESPONSE;
    ti->by = SIDE_UNKNOWN;
    ti->replay = req->replay;
    ti->replay_key = t->key;
    struct flow_nat *n = bpf_map_lookup_elem(&flow_nat, &t->key);
    if (n)
        s->peer = n->peer;
    struct replay_slot *r = replay_slot_of(req->replay, &t->key);
    if (!mark_flow(&t->key, n ? &s->peer : NULL, ra, ti, now, r ? req->replay : 0, &s->mark, cnt))
        return;
    s->req.ts_ns = req->ts_ns;
    s->req.head_len = req->head_len;
    __builtin_memcpy(s->req.head, req->head, HTTP_REQUEST_HEAD_LEN);
    __u32 dir = t->req_dir ? t->req_dir - 1 : FLOW_DIR_FORWARD;
    emit_trigger(&t->key, dir, pt->ifindex, ra, ti, &s->req, n ? &s->peer : NULL, r, cnt);
}

/*
 * noresponse_fire - the timer of flow_timing slot *@key: mark its flow if its oldest request
 * pending waited long enough for a rule, else set the timer for the next time one could.
 */
static int noresponse_fire(void *map, __u32 *key, struct pending_timer *pt)
{
    __u32 zero = 0, slot = *key;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct flow_timing *t = bpf_map_lookup_elem(&flow_timing, &slot);

    if (cnt)
        cnt->v[STAT_NORESPONSE_FIRED]++;
    /* The slot went to another flow: this timer is done. */
    if (!t || !flow_key_eq(&t->key, &pt->key)) {
        pt->armed = 0;
        return 0;
    }
    if (t->req_head == t->req_tail) {
        /* Nothing pending: stop, unless a request came while stopping (its sender saw the
         * timer running and left it to us). */
        pt->armed = 0;
        if (t->req_head == t->req_tail || __sync_val_compare_and_swap(&pt->armed, 0, 1))
            return 0;
    }
    struct http_request *req = &t->req[t->req_head % HTTP_PIPELINE];
    __u64 now = bpf_ktime_get_ns(), ts = req->ts_ns;
    if (!ts) {
        pt->armed = 0; /* not timed (latency.http off) */
        return 0;
    }
    __u64 waited = now > ts ? now - ts : 0;
    struct rule_action *ra = rule_lookup(pt->port, TRIGGER_NORESPONSE, waited, req, &t->key);
    if (ra) {
        noresponse_mark(t, pt, req, ra, waited, now);
        pt->armed = 0; /* the flow is marked: its requests need no timer */
        return 0;
    }
    __u64 next = noresponse_next(pt->port, waited);
    if (!next) {
        pt->armed = 0;
        return 0;
    }
    bpf_timer_start(&pt->timer, next - waited, 0);
    return 0;
}

/*
 * noresponse_start - start the timer of flow_timing slot @slot for @m's flow (its request just
 * queued), unless it runs already. A global function: verified once, run when a flow's requests
 * become pending while no timer runs for it.
 */
__noinline int noresponse_start(__u32 slot, struct pkt_meta *m, __u32 ifindex)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct pending_timer *pt = bpf_map_lookup_elem(&pending_timers, &slot);

    if (!m || !cnt || !pt)
        return 0;
    if (!pt->ready) {
        /* -EBUSY when another CPU initialised it meanwhile: fine either way. */
        bpf_timer_init(&pt->timer, &pending_timers, NORESPONSE_CLOCK);
        bpf_timer_set_callback(&pt->timer, noresponse_fire);
        pt->ready = 1;
    }
    int mine = flow_key_eq(&pt->key, &m->key);
    if (__sync_val_compare_and_swap(&pt->armed, 0, 1) && mine)
        return 0;
    /* Running for the slot's former owner, or not at all: ours now. */
    pt->key = m->key;
    pt->ifindex = ifindex;
    pt->port = m->dst_port;
    __u64 wait = noresponse_next(m->dst_port, 0);
    if (!wait) {
        pt->armed = 0;
        return 0;
    }
    bpf_timer_start(&pt->timer, wait, 0);
    cnt->v[STAT_NORESPONSE_ARMED]++;
    return 0;
}

/*
 * noresponse_arm - a request of @m's flow was queued in @t: make sure the flow's timer runs.
 * One load while it does. Inlined into http_message, its only caller.
 * @fs: this CPU's flow entry (may be NULL), which knows the flow's slot.
 */
static __always_inline void noresponse_arm(struct flow_cache_slot *fs, struct flow_timing *t,
                                           struct pkt_meta *m, __u32 ifindex)
{
    __u32 slot;

    if (fs && fs->timing_slot) {
        slot = fs->timing_slot - 1;
    } else {
        __u32 *at = bpf_map_lookup_elem(&flow_timing_index, &m->key);
        if (!at)
            return;
        slot = *at;
    }
    struct pending_timer *pt = bpf_map_lookup_elem(&pending_timers, &slot);
    if (pt && pt->armed && flow_key_eq(&pt->key, &m->key))
        return;
    noresponse_start(slot, m, ifindex);
}

#endif /* MIRROR_NORESPONSE_H */
