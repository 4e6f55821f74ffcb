/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the third kind of trigger: a request whose response has not begun within
 * a noresponse rule's time. No packet may ever come to tell, so a timer decides. A flow whose
 * request is queued sets its flow_timing slot's bit in pending_flows (one load per request when
 * the bit is set already); one BPF timer, the tick, runs every NORESPONSE_TICK_NS while some
 * rule is a noresponse rule (started by user space when such a rule is added, stopping itself
 * when none is left) and looks at the flows whose bits are set, at most
 * NORESPONSE_TICK_FLOWS per tick (a pass over many pending flows spans several ticks, and a tick
 * whose events would overflow the ring buffer stops there and goes on 1 ms later): a flow
 * with nothing pending loses its bit; one whose oldest pending request waited long enough for a
 * rule (filters included) is marked, without a packet, its event sent. The event carries the
 * request's kept segment, and the agent replays it to the mirror when it reads the event (a
 * replay is made from a packet here, and a timer has none): at the mark, not with the next
 * packet of the flow, which may come seconds later or never (measured: on the mirror 0.13 to
 * 3.6 ms after the mark, the mark itself up to a tick after the rule's time). Only when the
 * event could not be sent (the ring buffer full) does the mark carry the segment instead,
 * replayed with the first packet of the flow after it (replay.h replay_due).
 *
 * One timer, not one per flow: a timer's kernel memory is allocated when it is first set up,
 * from where BPF may not wait for memory, and on this kernel a few hundred such allocations
 * succeed, not tens of thousands (the benchmark measures what each way costs).
 *
 * The request's time is the HTTP stage's (packet_time: its sender's departure stamp, else the
 * clock at the hook), against the monotonic clock the timer runs on.
 */
#ifndef MIRROR_NORESPONSE_H
#define MIRROR_NORESPONSE_H

#include "maps.h"
#include "rule.h"
#include "scope.h"
#include "timing.h"
#include "trigger.h"

#define NORESPONSE_CLOCK 1                   /* CLOCK_MONOTONIC */
#define NORESPONSE_TICK_NS (10 * 1000000ULL) /* 10 ms */
#define NORESPONSE_TICK_FLOWS 4096
#define NORESPONSE_WAIT_NS (1000000ULL) /* 1 ms: the tick waiting for room in the ring buffer */
#define NORESPONSE_EBUSY 16

/*
 * noresponse_report - the request of the flow @key described in s->trigger and s->req (seen
 * going @dir on @ifindex) waited long enough for @ra: mark the flow (and the other key of a
 * translated connection) and report, the kept request in the event for the agent to replay;
 * without an event, the mark's own replay_due replays it with the next packet. For HTTP
 * requests and DNS queries alike.
 */
static __always_inline void noresponse_report(struct http_scratch *s, struct counters *cnt,
                                              const struct flow_key *key, __u32 dir, __u32 ifindex,
                                              const struct rule_action *ra, __u64 now)
{
    struct trigger_info *ti = &s->trigger;
    struct flow_nat *n = bpf_map_lookup_elem(&flow_nat, key);
    if (n)
        s->peer = n->peer;
    struct replay_slot *r = replay_slot_of(ti->replay, key, ti->replay_req);
    const struct flow_key *peer = n ? &s->peer : NULL;
    int taken = trigger_claim(key, peer, now);
    if (taken == CLAIM_HELD)
        return; /* a status or reset trigger is marking the flow: its request is replayed */
    int marked = mark_flow(key, peer, ra, ti, now, &s->mark, cnt);
    trigger_release(key, peer, taken);
    if (!marked)
        return;
    int sent = emit_trigger(key, dir, ifindex, ra, ti, &s->req, NULL, n ? &s->peer : NULL, r, cnt);
    if (sent || !r)
        return;
    /* No event, so no replay by the agent: the next packet of the flow (either key) makes it. */
    struct mirror_mark *mk = bpf_map_lookup_elem(&mirror_marks, key);
    if (mk) {
        mk->replay_req = ti->replay_req;
        mk->replay_due = ti->replay;
    }
    mk = n ? bpf_map_lookup_elem(&mirror_marks, &s->peer) : NULL;
    if (mk) {
        mk->replay_req = ti->replay_req;
        mk->replay_due = ti->replay;
    }
}

/*
 * noresponse_mark - the oldest request @req of @t waited @waited ns, matching @ra: reported
 * (noresponse_report).
 */
static __always_inline void noresponse_mark(struct flow_timing *t, const struct http_request *req,
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
    ti->proto = HTTP_PROTO_1;
    ti->stream = 0;
    ti->request = REQUEST_KEPT;
    ti->replay = req->replay;
    ti->replay_req = req->replay_req;
    ti->replay_key = t->key;
    s->req.ts_ns = req->ts_ns;
    s->req.head_len = req->head_len;
    __builtin_memcpy(s->req.head, req->head, HTTP_REQUEST_HEAD_LEN);
    __u32 dir = t->req_dir ? t->req_dir - 1 : FLOW_DIR_FORWARD;
    noresponse_report(s, cnt, &t->key, dir, t->req_ifindex, ra, now);
}

/*
 * noresponse_check - the flow of flow_timing slot @slot, whose pending bit is set: its oldest
 * pending request marks it when it waited long enough for a rule.
 * A global function: verified once.
 * @return 1 when the bit is to be cleared (nothing pending, or the flow marked now or before).
 */
__noinline int noresponse_check(__u32 slot, __u64 now)
{
    struct flow_timing *t = bpf_map_lookup_elem(&flow_timing, &slot);

    if (!t || t->req_head == t->req_tail)
        return 1;
    if (bpf_map_lookup_elem(&mirror_marks, &t->key))
        return 1; /* marked: its requests need no timer */
    /* The oldest pending request, when certainly that one (timing.h): a request pushed out of
     * the queue, or one whose answer a loss of framing may have hidden, is never named. */
    __u32 state;
    struct http_request *req = request_pending(t, &state);
    if (!req)
        return 0;
    __u64 ts = req->ts_ns;
    if (!ts || ts > now)
        return !ts; /* not timed (latency.http off) */
    __u64 waited = now - ts;
    /* The scope of the interface of the latest request, when it went into the pod there (its
     * server); a request between two pods of the node, seen at its client's, finds scope 0
     * (scope.h). */
    __u32 scope = rule_scope(t->req_ifindex, t->req_hook, SIDE_CLIENT);
    struct rule_action *ra =
        rule_lookup(server_port(t), TRIGGER_NORESPONSE, scope, waited, req, &t->key, NULL);
    if (!ra)
        return 0;
    noresponse_mark(t, req, ra, waited, now);
    return 1;
}

/* Where a tick stands in the bitmap: the word it goes on from, the flows it may still look at,
 * whether it stopped for room in the ring buffer. */
struct tick_walk {
    __u64 now;
    __u32 word;
    __u32 budget;
    __u32 full;
};

/* ring_room - is there room for a few more events? (A tick that marks thousands of flows at
 * once waits for the reader rather than lose their events.) */
static __always_inline int ring_room(void)
{
    __u64 size = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);
    __u64 used = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);

    return size > used && size - used >= 4 * sizeof(struct trigger_event);
}

/* tick_word - one word of pending_flows (a bpf_loop step of the tick). */
static long tick_word(__u32 i, struct tick_walk *w)
{
    __u32 idx = w->word;
    __u64 *bits = bpf_map_lookup_elem(&pending_flows, &idx);

    if (!bits)
        return 1; /* past the last word */
    __u64 v = *bits;
    if (!v) {
        w->word++;
        return 0;
    }
#pragma nounroll
    for (__u32 n = 0; n < 64; n++) {
        __u64 bit = 1ULL << n;
        if (!(v & bit))
            continue;
        if (!w->budget)
            return 1; /* this word again at the next tick */
        if (!ring_room()) {
            w->full = 1;
            return 1;
        }
        w->budget--;
        __u32 slot = idx * 64 + n;
        if (noresponse_check(slot, w->now)) {
            __sync_fetch_and_and(bits, ~bit);
            /* A request queued meanwhile (its sender saw the bit still set): set it again. */
            struct flow_timing *t = bpf_map_lookup_elem(&flow_timing, &slot);
            if (t && t->req_head != t->req_tail && !bpf_map_lookup_elem(&mirror_marks, &t->key))
                __sync_fetch_and_or(bits, bit);
        }
    }
    w->word++;
    return w->budget ? 0 : 1;
}

/*
 * noresponse_arm - a request of @t's flow was queued: set its slot's pending bit (when not set
 * already), for the tick to look at. Inlined into http_message, its only caller.
 * @fs: this CPU's flow entry (may be NULL), which knows the flow's slot.
 */
static __always_inline void noresponse_arm(struct flow_cache_slot *fs, const struct flow_key *key)
{
    __u32 slot;

    if (fs && fs->timing_slot) {
        slot = fs->timing_slot - 1;
    } else {
        __u32 *at = bpf_map_lookup_elem(&flow_timing_index, key);
        if (!at)
            return;
        slot = *at;
    }
    __u32 word = slot / 64;
    __u64 *bits = bpf_map_lookup_elem(&pending_flows, &word), bit = 1ULL << (slot % 64);
    if (bits && !(*bits & bit))
        __sync_fetch_and_or(bits, bit);
}

#endif /* MIRROR_NORESPONSE_H */
