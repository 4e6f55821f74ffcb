/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains noresponse> for DNS: a query that waited a noresponse rule's time without
 * its response marks its flow, without a packet, as an HTTP request does (noresponse.h). The
 * tick looks at the kept queries (dns_queries) every NORESPONSE_DNS_EVERY ticks: a query
 * answered is no longer there, one that waited long enough for a rule of its client's scope
 * (its qname= and qtype= filters included) marks its flow and is looked at no more.
 */
#ifndef MIRROR_DNS_NORESPONSE_H
#define MIRROR_DNS_NORESPONSE_H

#include "dns_decide.h"
#include "noresponse.h"

/* The tick looks at the DNS queries every this many ticks (50 ms). */
#define NORESPONSE_DNS_EVERY 5

/* Where a walk over the DNS queries stands. */
struct dns_walk {
    __u64 now;
    __u32 full; /* stopped for room in the ring buffer */
    __u32 _pad;
};

/*
 * dns_noresponse_check - a bpf_for_each_map_elem step over dns_queries: the query @q of @k
 * marks its flow when it waited long enough for a noresponse rule.
 * @return 1 to stop the walk (the ring buffer full), else 0.
 */
static long dns_noresponse_check(struct bpf_map *map, struct dns_key *k, struct dns_query *q,
                                 struct dns_walk *w)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct http_scratch *s = bpf_map_lookup_elem(&http_scratch, &zero);

    if (!cnt || !s || q->state != DNS_QUERY_PENDING || !q->ts_ns || q->ts_ns > w->now)
        return 0;
    __u64 waited = w->now - q->ts_ns;
    /* The question, where dns_filter_pick reads it. */
    s->dns.id = k->id;
    s->dns.flags = 0;
    s->dns.qtype = q->qtype;
    s->dns.name_len = q->name_len;
    s->dns.cut = q->name_len >= DNS_NAME_MAX && !q->qtype;
    __builtin_memcpy(s->req.head, q->name, DNS_NAME_MAX);
    __u32 scope = rule_scope(q->ifindex, q->hook, SIDE_CLIENT);
    struct rule_entry *scoped;
    struct rule_entry *global = rule_entries(q->server, TRIGGER_NORESPONSE, scope, &scoped);
    struct rule_action *ra = dns_rule_pick(scoped, waited, s);
    if (!ra)
        ra = dns_rule_pick(global, waited, s);
    if (!ra)
        return 0;
    if (!ring_room()) {
        w->full = 1;
        return 1;
    }
    struct trigger_info *ti = &s->trigger;
    ti->took = waited;
    ti->status = 0;
    ti->hook = q->hook;
    ti->kind = TRIGGER_NORESPONSE;
    ti->by = SIDE_UNKNOWN;
    ti->proto = PROTO_DNS;
    ti->stream = 0;
    ti->request = REQUEST_KEPT;
    ti->replay = q->replay;
    ti->replay_req = 0; /* a slot of its own (replay_take) */
    ti->replay_key = k->key;
    ti->dns_type = q->qtype;
    ti->dns_id = k->id;
    s->req.ts_ns = q->ts_ns;
    s->req.head_len = q->name_len;
    noresponse_report(s, cnt, &k->key, q->dir, q->ifindex, ra, w->now);
    /* Marked now or before: looked at no more, kept for a late answer to be timed (copied as
     * the flow's packets are), until it comes or the LRU map lets it go. */
    q->state = DNS_QUERY_MARKED;
    return 0;
}

/*
 * dns_noresponse_walk - look at every kept DNS query at @now.
 * @return 1 when the walk stopped for room in the ring buffer.
 */
static __always_inline int dns_noresponse_walk(__u64 now)
{
    struct dns_walk w = {.now = now};

    bpf_for_each_map_elem(&dns_queries, dns_noresponse_check, &w, 0);
    return w.full;
}

#endif /* MIRROR_DNS_NORESPONSE_H */
