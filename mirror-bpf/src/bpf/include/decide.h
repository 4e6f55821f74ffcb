/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the decisions a packet makes: what a message of a flow's stream, once
 * parsed (http.h) and timed (timing.h), or a reset, makes of its flow. A final response whose
 * status, server port, response time and request match a rule (rule.h) marks the flow
 * (trigger.h); so does a TCP RST of an established HTTP connection that matches a reset rule.
 * The third kind, a request unanswered too long, is decided by a timer, not by a packet
 * (noresponse.h). Each kind is decided here, on what the stages before it found, never inside a
 * protocol's parser.
 */
#ifndef MIRROR_DECIDE_H
#define MIRROR_DECIDE_H

#include "maps.h"
#include "rule.h"
#include "scope.h"
#include "timing.h"
#include "trigger.h"

/*
 * decide_response - a final response with @status of s->meta's flow, @took ns after the
 * request it answers (0: unknown; the request in s->req, its entry @src in the flow timing
 * entry @owner: the flow's own @t, or across NAT the other key's; @state, enum
 * trigger_request, says whether it is known): when a rule matches, mark the flow and report (mirror_trigger).
 * Only the request answered is named and replayed, or none. Seen at ingress, the response comes
 * from the pod behind the veth: the rules it selects apply (scope.h).
 * @return 1 when this response marked the flow.
 */
static __always_inline int decide_response(struct __sk_buff *skb, struct http_scratch *s,
                                           struct flow_timing *t, __u16 status, __u64 took,
                                           const struct http_request *src,
                                           const struct flow_timing *owner, __u32 state)
{
    struct pkt_meta *m = &s->meta;
    const struct flow_key *kept = owner ? &owner->key : &m->key;
    __u32 scope = rule_scope(skb->ifindex, s->pos.hook, SIDE_SERVER);
    struct rule_action *ra = rule_lookup(m->src_port, status, scope, took, src, kept, NULL);

    if (!ra)
        return 0;
    struct trigger_info *ti = &s->trigger;
    ti->took = took;
    ti->status = status;
    ti->hook = s->pos.hook;
    ti->kind = TRIGGER_STATUS;
    ti->by = SIDE_SERVER;
    ti->proto = HTTP_PROTO_1;
    ti->stream = 0;
    ti->request = src ? REQUEST_KEPT : state;
    ti->replay = 0;
    ti->replay_req = 0;
    if (src) {
        ti->replay = src->replay;
        ti->replay_req = src->replay_req;
        ti->replay_key = *kept;
    }
    request_head_copy(&s->req, src);
    return mirror_trigger(skb, m, ra, t, ti);
}

/*
 * reset_side - who sent @m (a RST): the requests' side or the other. Under the flow's own key
 * (@owner is the flow's), from the requests' direction; across NAT (the requests were seen
 * under the other key), from the connection's tuples.
 */
static __always_inline __u32 reset_side(const struct pkt_meta *m, const struct flow_timing *owner)
{
    if (flow_key_eq(&owner->key, &m->key))
        return owner->req_dir == m->dir + 1 ? SIDE_CLIENT : SIDE_SERVER;
    struct flow_nat *n = bpf_map_lookup_elem(&flow_nat, &m->key);
    if (!n)
        return SIDE_UNKNOWN;
    int fwd = m->dir == FLOW_DIR_FORWARD;
    const __u32 *src = fwd ? m->key.addr_lo : m->key.addr_hi;
    __u16 sport = fwd ? m->key.port_lo : m->key.port_hi;
    /* The client sends from orig.src before the translation and from reply.dst after it. */
    int orig = sport == n->orig.sport, reply = sport == n->reply.dport;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        orig &= src[i] == n->orig.src[i];
        reply &= src[i] == n->reply.dst[i];
    }
    return orig || reply ? SIDE_CLIENT : SIDE_SERVER;
}

/*
 * decide_reset - a TCP RST of s->meta's flow: when the flow is an established HTTP connection
 * (a request was seen, under its key or across NAT the other) and a reset rule matches, mark
 * it; the request behind it is the one pending, else the latest. A global function: verified
 * once, run for RSTs only, and only while some rule is a reset rule.
 * @fs: this CPU's flow entry (may be NULL).
 * @return 1 when this RST marked the flow.
 */
__noinline int decide_reset(struct __sk_buff *skb, struct http_scratch *s,
                            struct flow_cache_slot *fs, __u32 hook)
{
    __u32 zero = 0;
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);

    if (!skb || !s || !set || !(set->kinds & (1 << TRIGGER_RESET)))
        return 0;
    __u32 ifindex = skb->ifindex;
    struct pkt_meta *m = &s->meta;
    struct flow_timing *t = timing_find(fs, &m->key), *owner = t;
    if ((!owner || !owner->req_tail) && nat_peer(skb, m, t, &s->peer, 1))
        owner = timing_find(NULL, &s->peer);
    if (!owner || !owner->req_tail)
        return 0;
    /* The request pending, else the latest (answered) one, when certainly that one. */
    __u32 state;
    struct http_request *req = request_pending(owner, &state);
    if (state == REQUEST_NONE) {
        __u32 at = owner->req_tail - 1;
        req = &owner->req[at % HTTP_PIPELINE];
        state = request_certain(owner, req, at) ? REQUEST_KEPT : REQUEST_NOT_KEPT;
    }
    if (state != REQUEST_KEPT) {
        struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
        if (cnt)
            cnt->v[STAT_REQUEST_NOT_KEPT]++;
        req = &s->req;
        __builtin_memset(req, 0, sizeof(*req));
    }
    __u64 took = req->ts_ns && m->now >= req->ts_ns ? m->now - req->ts_ns : 0;
    /* Who reset says whether the pod behind the veth is the server (scope.h). */
    __u32 by = reset_side(m, owner);
    __u32 scope = reset_scope(ifindex, hook, by);
    struct rule_action *ra =
        rule_lookup(server_port(owner), TRIGGER_RESET, scope, took, req, &owner->key, NULL);
    if (!ra)
        return 0;
    struct trigger_info *ti = &s->trigger;
    ti->took = took;
    ti->status = 0;
    ti->hook = hook;
    ti->kind = TRIGGER_RESET;
    ti->by = by;
    ti->proto = HTTP_PROTO_1;
    ti->stream = 0;
    ti->request = state;
    ti->replay = req->replay;
    ti->replay_req = req->replay_req;
    ti->replay_key = owner->key;
    if (req != &s->req) {
        s->req.ts_ns = req->ts_ns;
        s->req.head_len = req->head_len;
        __builtin_memcpy(s->req.head, req->head, HTTP_REQUEST_HEAD_LEN);
    }
    return mirror_trigger(skb, m, ra, t, ti);
}

#endif /* MIRROR_DECIDE_H */
