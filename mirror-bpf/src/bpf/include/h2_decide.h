/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains what an HTTP/2 header block, once read (h2.h, hpack.h), makes of its
 * stream and flow. A request's block (:method, :path) opens its stream (h2_streams.h): its
 * time, "METHOD path" as its head, its :authority and its kept segment (replay.h). A response's
 * block (:status) is timed against it (request HEADERS to response HEADERS: the histogram of
 * the interface and class, as for HTTP/1.x) and matched against the rules like an HTTP/1.x
 * status; trailers with a grpc-status (a trailers-only answer too) are matched under their
 * pseudo-status (GRPC_STATUS_BASE + code). Across NAT the stream's request was seen under the
 * connection's other key. The stream is forgotten at its end (END_STREAM from the server, or
 * RST_STREAM).
 */
#ifndef MIRROR_H2_DECIDE_H
#define MIRROR_H2_DECIDE_H

#include "maps.h"
#include "rule.h"
#include "scope.h"
#include "timing.h"
#include "trigger.h"
#include "replay.h"
#include "h2_streams.h"

/* h2_stream_key_of - the key of @stream under @key, in @k. */
static __always_inline void h2_stream_key_of(struct h2_stream_key *k, const struct flow_key *key,
                                             __u32 stream)
{
    k->key = *key;
    k->stream = stream;
    k->_pad = 0;
}

/*
 * h2_stream_end - a DATA frame with END_STREAM or a RST_STREAM (@rst) of @stream in s->meta's
 * direction: the stream is over when the server ends it (or either side resets it). The answer
 * whose HEADERS came earlier in this segment (h2.open_stream) is freed where h2_decide found
 * it, unless its way was written since; any other stream is looked up, as h2_decide does: under
 * this key, or across NAT under the other (@skb, @t: the flow's shared entry).
 */
static __always_inline void h2_stream_end(struct __sk_buff *skb, struct http_scratch *s,
                                          struct flow_timing *t, __u32 stream, int rst)
{
    struct h2_scratch *h = &s->h2;
    struct pkt_meta *m = &s->meta;
    struct h2_stream_key *k = &h->key;
    __u32 way = 0, seq = 0, idx = 0;
    struct h2_stream_bucket *b = NULL;

    if (stream && stream == h->open_stream) {
        h->open_stream = 0;
        b = h2_bucket(h->open_bucket);
        if (b && h2_stream_close(b, h->open_way, h->open_seq))
            return;
    }
    h2_stream_key_of(k, &m->key, stream);
    int e = h2_stream_lookup(k, &b, &idx, &way, &seq);
    if (!e && nat_peer(skb, m, t, &s->peer, 0)) {
        h2_stream_key_of(k, &s->peer, stream);
        e = h2_stream_lookup(k, &b, &idx, &way, &seq);
    }
    if (e && b && (rst || b->way[way & (H2_STREAM_WAYS - 1)].st.dir != m->dir))
        h2_stream_close(b, way, seq);
}

/*
 * h2_rule - a response's @status (or a grpc-status's pseudo-status, @kind TRIGGER_GRPC) of the
 * stream of h2.key, its request copied into h2.stream (head_len 0: not found), s->trigger.took ns
 * after it: when a rule matches, mark the flow and report, the request replayed first
 * (mirror_trigger). A global function: verified once, run only when a rule covers the status.
 * @return 1 when it marked the flow.
 */
__noinline int h2_rule(struct __sk_buff *skb, struct http_scratch *s, struct flow_timing *t,
                       __u32 status, __u32 kind)
{
    if (!skb || !s)
        return 0;
    struct h2_scratch *h = &s->h2;
    struct h2_stream *st = &h->stream;
    int found = st->req.head_len != 0;
    struct trigger_info *ti = &s->trigger;
    /* No :authority (the HTTP/1.1 request of an h2c upgrade): its Host header, from its kept
     * segment (filter.h). */
    struct rule_action *ra =
        rule_lookup(s->meta.src_port, status, h->rule_scope, ti->took, found ? &st->req : NULL,
                    &h->key.key, st->authority.len ? &st->authority : NULL);

    if (!ra)
        return 0;
    ti->status = kind == TRIGGER_GRPC ? status - GRPC_STATUS_BASE : status;
    ti->hook = s->pos.hook;
    ti->kind = kind;
    ti->by = SIDE_SERVER;
    ti->proto = HTTP_PROTO_2;
    ti->stream = h->key.stream;
    ti->replay = st->req.replay;
    ti->replay_req = st->req.replay_req;
    ti->request = found ? REQUEST_KEPT : REQUEST_NOT_KEPT;
    ti->replay_key = h->key.key;
    __builtin_memcpy(&s->req, &st->req, sizeof(s->req));
    __builtin_memcpy(&s->host, &st->authority, sizeof(s->host));
    return mirror_trigger(skb, &s->meta, ra, t, ti);
}

/*
 * h2_covered - could a rule of @scope match @status (or pseudo-status) from server port @port?
 * Two array lookups: what a response of a status no rule names costs.
 */
static __always_inline int h2_covered(__u16 port, __u16 status, __u32 scope)
{
    struct rule_entry *scoped;
    struct rule_entry *global = rule_entries(port, status, scope, &scoped);

    return scoped ||
           (global && (global->any.rule_id || global->slow.rule_id || global->filtered[0]));
}

/*
 * h2_request - a request's header block on @stream (what it says in s->h2): its stream opens
 * (h2_streams.h), with its head "METHOD path", time, :authority and kept segment. A global
 * function: verified once, run per request.
 */
__noinline int h2_request(struct __sk_buff *skb, struct http_scratch *s, struct flow_timing *t,
                          __u32 stream)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !s || !t || !cnt)
        return 0;
    struct h2_scratch *h = &s->h2;
    struct h2_stream *ns = &h->stream;
    struct pkt_meta *m = &s->meta;
    cnt->v[STAT_H2_REQUESTS]++;
    __u32 ml = h->method_len & 0xf, pl = h->path_len;
    if (pl > H2_TEXT)
        pl = H2_TEXT;
    __builtin_memcpy(ns->req.head, h->method, sizeof(h->method));
    ns->req.head[ml] = ' ';
    __builtin_memcpy(&ns->req.head[ml + 1], h->path, H2_TEXT);
    ns->req.head_len = ml + 1 + pl;
    ns->req.ts_ns = m->now;
    ns->req.replay = replay_keep(skb, s, t, 0, 0);
    ns->req.replay_req = ns->req.replay ? s->pos.replay_req : 0;
    ns->dir = m->dir;
    t->req_dir = m->dir + 1;
    struct h2_stream_key *k = &h->key;
    h2_stream_key_of(k, &m->key, stream);
    h2_stream_open(k, ns);
    return 0;
}

/*
 * h2_decide - what the header block just read (s->h2) makes of its stream and the flow: a
 * request opens the stream; a response's :status is timed and matched, and a grpc-status too.
 * What a rule may match is left in h2.rule_status and h2.rule_grpc (0: nothing), the request in
 * h2.stream, for h2_rule. A global function: verified once, run per HEADERS block.
 * @fs: this CPU's flow entry (may be NULL). @t: the flow's shared entry.
 */
__noinline int h2_decide(struct __sk_buff *skb, struct http_scratch *s, struct flow_cache_slot *fs,
                         struct flow_timing *t)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !s || !t || !cnt)
        return 0;
    struct h2_scratch *h = &s->h2;
    struct pkt_meta *m = &s->meta;
    __u32 fields = h->fields, stream = h->frame_stream, flags = h->frame_flags;

    if (fields & (1 << H2_FIELD_METHOD | 1 << H2_FIELD_PATH))
        return h2_request(skb, s, t, stream);
    __u32 status = h->status, grpc = h->grpc_status;
    if (!(status >= 200 || grpc))
        return 0; /* 1xx interim answers, a client's trailers, nothing of ours */
    /* The stream's request: under this key, or across NAT under the other. */
    struct h2_stream_key *k = &h->key;
    h2_stream_key_of(k, &m->key, stream);
    __u32 way = 0, seq = 0, idx = 0;
    struct h2_stream_bucket *b = NULL;
    int e = h2_stream_lookup(k, &b, &idx, &way, &seq);
    if (!e && nat_peer(skb, m, t, &s->peer, 1)) {
        h2_stream_key_of(k, &s->peer, stream);
        e = h2_stream_lookup(k, &b, &idx, &way, &seq);
    }
    __u16 port = m->src_port;
    __u32 grpc_code = GRPC_STATUS_BASE + ((grpc - 1) & (GRPC_STATUS_CODES - 1));
    /* Seen at ingress, the answer comes from the pod behind the veth: its rules (scope.h). */
    __u32 scope = rule_scope(skb->ifindex, s->pos.hook, SIDE_SERVER);
    h->rule_scope = scope;
    int want = (status >= 200 && h2_covered(port, status, scope)) ||
               (grpc && h2_covered(port, grpc_code, scope));
    /* The request, for the rules' filters and the event: copied, then kept only if its way was
     * not written meanwhile (h2_streams.h). */
    struct h2_stream *rq = &h->stream;
    __u64 ts = 0;
    __u32 server = 0;
    if (e && b) {
        const struct h2_stream *st = &b->way[way & (H2_STREAM_WAYS - 1)].st;
        ts = st->req.ts_ns;
        server = st->dir != m->dir;
        if (want)
            __builtin_memcpy(rq, st, sizeof(*rq));
        if (!h2_stream_stable(b, way, seq)) {
            e = 0;
            ts = 0;
        }
    }
    /* Stream 1 after Upgrade: h2c answers the HTTP/1.1 request that asked for it. */
    int upgraded = !e && stream == 1 && t->req_head != t->req_tail;
    __u32 up_state = REQUEST_NONE;
    struct http_request *up = upgraded ? request_pending(t, &up_state) : NULL;
    if (!e && !upgraded)
        cnt->v[STAT_H2_STREAM_MISSED]++;
    if (up)
        ts = up->ts_ns;
    __u64 now = m->now;
    __u64 took = ts && now >= ts ? now - ts : 0;
    s->trigger.took = took;
    if (want && !e) {
        rq->req.head_len = 0;
        rq->req.replay = 0;
        rq->authority.len = 0;
        if (up)
            __builtin_memcpy(&rq->req, up, sizeof(rq->req));
    }
    if (upgraded)
        t->req_head++;
    /* The rules are matched next, by the frame loop (h2_rule): not from here, where their call
     * chain would add to this frame's stack. */
    h->rule_status = 0;
    h->rule_grpc = 0;
    if (status >= 200) {
        cnt->v[STAT_H2_RESPONSES]++;
        if (took) {
            if (fs) {
                fs->http_time_sum_ns += took;
                fs->http_timed++;
                if (took > fs->http_time_max_ns)
                    fs->http_time_max_ns = took;
            }
            if (timing_on(TIMING_HTTP) &&
                hist_add(skb->ifindex, HIST_HTTP_RESPONSE, status / 100, took))
                cnt->v[STAT_HIST_INSERT_FAILED]++;
        }
        if (want)
            h->rule_status = status;
    }
    if (grpc) {
        cnt->v[STAT_H2_TRAILERS]++;
        if (want)
            h->rule_grpc = grpc_code;
    }
    if (e && b && flags & H2_END_STREAM) {
        h2_stream_close(b, way, seq);
    } else if (e && b && server) {
        /* The server's answer, its body to come: where its END_STREAM frees it. */
        h->open_stream = stream;
        h->open_bucket = idx;
        h->open_way = way;
        h->open_seq = seq;
    }
    return 0;
}

#endif /* MIRROR_H2_DECIDE_H */
