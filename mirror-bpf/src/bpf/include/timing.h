/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the timing of flows: HTTP request to response time and TCP handshake
 * time, kept per flow and aggregated in the kernel into per-interface latency histograms
 * (never one event per packet). The two ends of an interval may be seen on different CPUs,
 * and, across NAT, under the two keys of one connection: their timestamps meet in the shared
 * flow_timing map. The times are the packets' own (packet_time(), clock.h: their senders' TCP
 * departure stamps where they carry one).
 */
#ifndef MIRROR_TIMING_H
#define MIRROR_TIMING_H

#include "maps.h"
#include "parse.h"
#include "hist.h"
#include "nat.h"

/* timing_group_on - whether @set (may be NULL) switches the timing @group on (enum timing_group). */
static __always_inline int timing_group_on(const struct settings *set, __u32 group)
{
    return set && (set->timing & group);
}

/* timing_on - whether the timing @group is switched on. */
static __always_inline int timing_on(__u32 group)
{
    __u32 zero = 0;

    return timing_group_on(bpf_map_lookup_elem(&settings, &zero), group);
}

/*
 * timing_find - the shared entry of the flow of @key: the slot this CPU's flow entry @fs (may
 * be NULL) remembers, when the flow still owns it; else the slot flow_timing_index gives,
 * remembered in @fs.
 * @return the entry, or NULL when the flow has none.
 */
static __always_inline struct flow_timing *timing_find(struct flow_cache_slot *fs,
                                                       const struct flow_key *key)
{
    struct flow_timing *t;
    __u32 slot;

    if (fs && fs->timing_slot) {
        slot = fs->timing_slot - 1;
        t = bpf_map_lookup_elem(&flow_timing, &slot);
        if (t && flow_key_eq(&t->key, key))
            goto found;
    }
    __u32 *at = bpf_map_lookup_elem(&flow_timing_index, key);
    if (!at)
        return NULL;
    slot = *at;
    t = bpf_map_lookup_elem(&flow_timing, &slot);
    if (!t || !flow_key_eq(&t->key, key))
        return NULL;
    if (fs)
        fs->timing_slot = slot + 1;
found:
    return t;
}

/*
 * timing_used - a packet of the flow of @t met its entry again (not the one that gave it the
 * slot): the hand passes over it once (a second chance). A flow of one packet never has it.
 */
static __always_inline void timing_used(struct flow_timing *t)
{
    if (t && !t->ref)
        t->ref = 1;
}

/* How many slots the allocator passes over (used since its last pass) before it takes one. */
#define TIMING_SECOND_CHANCES 4

/*
 * timing_take - give the flow of @key a slot of its own: the next one the hand reaches that was
 * not used since the hand last passed (or the last of TIMING_SECOND_CHANCES looked at), its
 * former owner forgotten. A global function: verified once, run once per flow.
 * @return 1 when the flow has a slot (its own, or one another CPU gave it meanwhile).
 */
__noinline int timing_take(const struct flow_key *key)
{
    __u32 zero = 0;
    struct zero_values *init = bpf_map_lookup_elem(&zero_values, &zero);
    struct flow_timing *t = NULL;
    __u32 slot = 0;

    if (!key || !init || !flows_max)
        return 0;
    for (int i = 0; i < TIMING_SECOND_CHANCES; i++) {
        slot = __sync_fetch_and_add(&timing_next, 1) % flows_max;
        t = bpf_map_lookup_elem(&flow_timing, &slot);
        if (!t)
            return 0;
        if (!t->ref || i == TIMING_SECOND_CHANCES - 1)
            break;
        t->ref = 0;
    }
    if (!t)
        return 0;
    /* The former owner loses its entry: the index holds owners only. */
    __u32 *was = bpf_map_lookup_elem(&flow_timing_index, &t->key);
    if (was && *was == slot)
        bpf_map_delete_elem(&flow_timing_index, &t->key);
    /* All but the request queue, whose entries are read only once this owner queued them. */
    __builtin_memcpy(t, &init->timing, __builtin_offsetof(struct flow_timing, req));
    t->key = *key;
    if (!bpf_map_update_elem(&flow_timing_index, key, &slot, BPF_NOEXIST))
        return 1;
    /* The flow has an entry in the index already: another CPU took a slot for it meanwhile
     * (this one is left to the hand), or the index is stale. */
    __u32 *own = bpf_map_lookup_elem(&flow_timing_index, key);
    if (own) {
        __u32 other = *own;
        struct flow_timing *o = bpf_map_lookup_elem(&flow_timing, &other);
        if (o && flow_key_eq(&o->key, key)) {
            __builtin_memset(&t->key, 0, sizeof(t->key));
            t->ref = 0;
            return 1;
        }
    }
    return !bpf_map_update_elem(&flow_timing_index, key, &slot, BPF_ANY);
}

/* timing_get - the flow's shared entry (see timing_find), given a slot when @create. */
static __always_inline struct flow_timing *timing_get(struct flow_cache_slot *fs,
                                                      const struct flow_key *key, int create,
                                                      struct counters *cnt)
{
    struct flow_timing *t = timing_find(fs, key);

    if (t || !create)
        return t;
    if (timing_take(key))
        t = timing_find(fs, key);
    if (!t)
        cnt->v[STAT_TIMING_INSERT_FAILED]++;
    return t;
}

/* server_port - the port the requests of @t went to (the lower port when none was seen). */
static __always_inline __u16 server_port(const struct flow_timing *t)
{
    if (t->req_dir == FLOW_DIR_FORWARD + 1)
        return t->key.port_hi;
    if (t->req_dir == FLOW_DIR_REVERSE + 1)
        return t->key.port_lo;
    return t->key.port_lo < t->key.port_hi ? t->key.port_lo : t->key.port_hi;
}

/*
 * The request queue of a flow (t->req, HTTP/1.x): the n-th final response of a connection answers
 * its n-th request. Requests are numbered as they are queued (req_tail counts them), answers as
 * they come (req_head); entry n % HTTP_PIPELINE holds request n until request n + HTTP_PIPELINE
 * takes it. An answer is given its request only when that is certain: the entry still holds
 * request req_head (its number says so), and no loss of framing since may have hidden a message
 * (req_gap). Otherwise the answer names no request ("not kept"), never another one.
 *
 * After a loss (request_gap), a message may have been missed in the lost direction, so the count
 * of either side may be off by the messages missed: the requests from the gap on are uncertain.
 * The count is right again when an answer finds nothing pending (every request seen answered, and
 * any missed one too), or, on a connection that never had two requests pending at once, when a
 * request starts a segment with nothing pending: such a client sends a request after the answer
 * to the one before, at the start of a segment, where a direction that lost its framing still
 * finds every message. (A client that pipelines for the first time in the very segment whose
 * framing is lost is the case this cannot see.)
 */

/*
 * request_gap - the framing of direction @dir of @t was lost: which request the coming answers
 * answer is uncertain, from the next request on when the requests' side lost it (a request may
 * hide after those found), from the oldest pending one when the answers' side did (an answer
 * may). Unless uncertain from an earlier request already.
 */
static __always_inline void request_gap(struct flow_timing *t, __u32 dir)
{
    if (!t)
        return;
    __u32 from = (t->req_dir == dir + 1 ? t->req_tail : t->req_head) + 1;
    if (!t->req_gap || (__s32)(from - t->req_gap) < 0)
        t->req_gap = from;
}

/*
 * timing_request - an HTTP request starts (its first bytes in s->buf, @avail of them in the
 * segment): queue it behind the requests still awaiting answers (pipelining), with its first
 * bytes (for events, filters, and to know a HEAD), its kept segment (@replay, see replay_keep)
 * and, when HTTP timing is on, the time. When HTTP_PIPELINE are pending, it takes the entry of
 * the oldest, whose answer will name none. Inlined into http_message, its only caller.
 * @set: the settings (may be NULL), looked up once for the request's stages.
 */
static __always_inline int timing_request(struct flow_timing *t, struct http_scratch *s,
                                          __u32 avail, __u64 now, const struct settings *set,
                                          __u32 replay)
{
    if (!t || !s)
        return 0;
    __u32 n = t->req_tail, pending = n - t->req_head;
    t->req_dir = s->meta.dir + 1;
    if (pending >= HTTP_PIPELINE)
        t->deep = 1;
    if (pending)
        t->piped = 1;
    else if (t->req_gap && !t->piped && !s->pos.off)
        t->req_gap = 0; /* see the queue's comment above */
    struct http_request *r = &t->req[n % HTTP_PIPELINE];
    __builtin_memcpy(__builtin_assume_aligned(r->head, 8), __builtin_assume_aligned(s->buf, 8),
                     HTTP_REQUEST_HEAD_LEN);
    r->head_len = avail < HTTP_REQUEST_HEAD_LEN ? avail : HTTP_REQUEST_HEAD_LEN;
    r->ts_ns = timing_group_on(set, TIMING_HTTP) ? now : 0;
    r->replay = replay;
    r->replay_req = s->pos.replay_req; /* with replay 0, never looked at */
    r->number = n;
    t->req_tail = n + 1;
    return 0;
}

/*
 * request_certain - is entry @r of @t request number @n, and is it certainly the one the answer
 * to @n answers (see the queue's comment)?
 */
static __always_inline int request_certain(const struct flow_timing *t,
                                           const struct http_request *r, __u32 n)
{
    return r->number == n && t->req_tail - n <= HTTP_PIPELINE &&
           !(t->req_gap && n - (t->req_gap - 1) < (1U << 31));
}

/*
 * request_pop - the answer to the oldest request of @t awaiting one: that request's time,
 * length and first word (enough to know a HEAD) copied to @out; the rest of its head stays in
 * @t, read only for a trigger (request_head_copy).
 * @state: set to the enum trigger_request of the answer.
 * @return the request's entry in @t, NULL when none is pending or it is not kept.
 */
static __always_inline struct http_request *request_pop(struct flow_timing *t,
                                                        struct http_request *out, __u32 *state)
{
    __u32 n = t->req_head;

    *state = REQUEST_NONE;
    if (n == t->req_tail) {
        /* Every request seen is answered. After a loss, this answer's request was missed
         * (not kept); the count is right again from here. */
        if (t->req_gap)
            *state = REQUEST_NOT_KEPT;
        t->req_gap = 0;
        return NULL;
    }
    t->req_head = n + 1;
    struct http_request *r = &t->req[n % HTTP_PIPELINE];
    if (!request_certain(t, r, n)) {
        *state = REQUEST_NOT_KEPT;
        return NULL;
    }
    *state = REQUEST_KEPT;
    out->ts_ns = r->ts_ns;
    out->head_len = r->head_len;
    _Static_assert(HTTP_REQUEST_PREFIX == sizeof(__u64), "the prefix is one word");
    *(__u64 *)out->head = *(__u64 *)r->head;
    return r;
}

/*
 * request_pending - the oldest request of @t awaiting an answer, for a reset or a wait
 * (noresponse), without taking it from the queue.
 * @state: set to the enum trigger_request.
 * @return its entry, NULL when none is pending or it is not kept.
 */
static __always_inline struct http_request *request_pending(const struct flow_timing *t,
                                                            __u32 *state)
{
    __u32 n = t->req_head;

    *state = REQUEST_NONE;
    if (n == t->req_tail)
        return NULL;
    const struct http_request *r = &t->req[n % HTTP_PIPELINE];
    *state = request_certain(t, r, n) ? REQUEST_KEPT : REQUEST_NOT_KEPT;
    return *state == REQUEST_KEPT ? (struct http_request *)r : NULL;
}

/*
 * request_head_copy - the rest of the head of the request @src (see request_pop) into @out,
 * for a trigger's event. Its entry is reused only once HTTP_PIPELINE more requests of the flow
 * are queued: only if another CPU queued that many within this packet's run would the event
 * show a later request's head (never the time or the framing, taken at the pop).
 */
static __always_inline void request_head_copy(struct http_request *out,
                                              const struct http_request *src)
{
    if (src)
        __builtin_memcpy(__builtin_assume_aligned(out->head + HTTP_REQUEST_PREFIX, 8),
                         __builtin_assume_aligned(src->head + HTTP_REQUEST_PREFIX, 8),
                         HTTP_REQUEST_HEAD_LEN - HTTP_REQUEST_PREFIX);
}

/*
 * timing_response - a final status line of @m's flow: the request it answers is the oldest
 * pending one, under the flow's own key or, across NAT, under the connection's other key.
 * Its time is added to the flow (@fs, may be NULL) and to the histogram of this interface and
 * status class.
 * @t: the flow's shared entry.
 * The request answered is left in s->req (head_len 0 when none), its head's first word only;
 * @src is set to its entry, from which request_head_copy takes the rest for a trigger, and
 * @owner to the flow timing entry holding it (@t, or the other key's across NAT); @state to
 * what is known of it (enum trigger_request: NULL @src unless kept).
 * @return the response time in ns (0: no timed request was pending).
 * Inlined into http_message, its only caller.
 */
static __always_inline __u64 timing_response(struct __sk_buff *skb, struct http_scratch *s,
                                             struct flow_cache_slot *fs, struct flow_timing *t,
                                             __u32 status, struct http_request **src,
                                             struct flow_timing **owner, __u32 *state)
{
    *state = REQUEST_NONE;
    if (!skb || !s || !t)
        return 0;
    *owner = t;
    struct pkt_meta *m = &s->meta;
    struct http_request *req = &s->req;
    /* Only these say whether the rest is valid. */
    req->ts_ns = 0;
    req->head_len = 0;
    /* No request under this key: across NAT, they are under the other key, and a loss of this
     * key's framing is the answers' side's there. */
    __u32 lost = 0;
    if (t->req_dir) {
        *src = request_pop(t, req, state);
    } else {
        lost = t->req_gap;
        t->req_gap = 0;
    }
    if (*state == REQUEST_NONE) {
        /* Across NAT the request was seen under the other key (on the client's veth). */
        if (!nat_peer(skb, m, t, &s->peer, 1))
            return 0;
        struct flow_timing *pt = timing_find(NULL, &s->peer);
        if (!pt)
            return 0;
        if (lost && !pt->req_gap)
            pt->req_gap = pt->req_head + 1;
        *src = request_pop(pt, req, state);
        *owner = pt;
    }
    if (!*src)
        return 0;
    if (!req->ts_ns)
        return 0;
    __u64 now = m->now;
    if (req->ts_ns > now)
        return 0;
    __u64 took = now - req->ts_ns;
    if (fs) {
        fs->http_time_sum_ns += took;
        fs->http_timed++;
        if (took > fs->http_time_max_ns)
            fs->http_time_max_ns = took;
    }
    if (hist_add(skb->ifindex, HIST_HTTP_RESPONSE, status / 100, took)) {
        __u32 zero = 0;
        struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
        if (cnt)
            cnt->v[STAT_HIST_INSERT_FAILED]++;
    }
    return took;
}

/*
 * handshake_packet - could @m be part of a handshake: a SYN, or one of the first two ACKs of
 * its direction on this CPU (counting what the flow table holds: see past_handshake)? Most
 * packets are not: checked inline, before calling timing_handshake.
 */
static __always_inline int handshake_packet(const struct pkt_meta *m,
                                            const struct flow_cache_slot *fs)
{
    __u8 f = m->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK);

    __u32 dir = m->dir & 1;

    return (f & TCP_FLAG_SYN) ||
           (f == TCP_FLAG_ACK && fs && !(fs->past_handshake & (1 << dir)) && fs->packets[dir] <= 2);
}

/*
 * timing_handshake - SYN, SYN/ACK and the ACK that completes the handshake (see
 * handshake_packet). Across NAT the
 * SYN/ACK is seen under the other key than the SYN and the ACK: it is stamped on theirs.
 * A global function: verified once.
 */
__noinline int timing_handshake(struct __sk_buff *skb, struct pkt_meta *m,
                                struct flow_cache_slot *fs)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !m || !cnt)
        return 0;
    __u8 f = m->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK);
    if (!timing_on(TIMING_HANDSHAKE))
        return 0;
    if (f == TCP_FLAG_SYN) {
        struct flow_timing *t = timing_get(fs, &m->key, 1, cnt);
        if (t) {
            t->syn_ns = m->now;
            t->synack_ns = 0;
            t->syn_dir = m->dir;
        }
        return 0;
    }
    if (f == (TCP_FLAG_SYN | TCP_FLAG_ACK)) {
        struct flow_timing *t = timing_get(fs, &m->key, 0, cnt);
        timing_used(t);
        if (!t || !t->syn_ns) {
            /* The flow was created by this SYN/ACK, and conntrack asked then (classify). */
            struct flow_key peer __attribute__((aligned(8))); /* see flow_key_eq */
            if (!nat_peer(skb, m, t, &peer, 0))
                return 0;
            t = timing_find(NULL, &peer);
        }
        if (t && t->syn_ns)
            t->synack_ns = m->now;
        return 0;
    }
    struct flow_timing *t = timing_get(fs, &m->key, 0, cnt);
    if (!t || !fs || !t->synack_ns || !t->syn_ns || t->syn_dir != m->dir)
        return 0;
    __u64 now = m->now;
    if (now < t->syn_ns)
        return 0;
    __u64 took = now - t->syn_ns;
    t->syn_ns = 0; /* measured once */
    /* Once per connection: written to the flow's table entry directly. */
    struct flow_traffic *ft = bpf_map_lookup_elem(&flow_table, &m->key);
    if (ft)
        ft->handshake_us = took / 1000 ?: 1;
    if (hist_add(skb->ifindex, HIST_TCP_HANDSHAKE, 0, took))
        cnt->v[STAT_HIST_INSERT_FAILED]++;
    return 0;
}

#endif /* MIRROR_TIMING_H */
