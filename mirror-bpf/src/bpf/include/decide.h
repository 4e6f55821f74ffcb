/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the decision: what a message of a flow's stream, once parsed (http.h) and
 * timed (timing.h), makes of its flow. Today one kind: a final response whose status, server
 * port and response time match a rule (rule.h) marks the flow (trigger.h). Each kind of trigger
 * is decided here, on what the stages before it found, never inside a protocol's parser.
 */
#ifndef MIRROR_DECIDE_H
#define MIRROR_DECIDE_H

#include "maps.h"
#include "rule.h"
#include "timing.h"
#include "trigger.h"

/*
 * decide_response - a final response with @status of s->meta's flow, @took ns after the
 * request it answers (0: unknown; the request in s->req, its entry in @src): when a rule
 * matches, mark the flow and report (mirror_trigger).
 * @t: the flow's shared entry (may be NULL).
 * @return 1 when this response marked the flow.
 */
static __always_inline int decide_response(struct __sk_buff *skb, struct http_scratch *s,
                                           struct flow_timing *t, __u16 status, __u64 took,
                                           const struct http_request *src)
{
    struct pkt_meta *m = &s->meta;
    struct rule_action *ra = rule_lookup(m->src_port, status, took);

    if (!ra)
        return 0;
    struct trigger_info *ti = &s->trigger;
    ti->took = took;
    ti->status = status;
    ti->hook = s->pos.hook;
    request_head_copy(&s->req, src);
    return mirror_trigger(skb, m, ra, t, ti);
}

#endif /* MIRROR_DECIDE_H */
