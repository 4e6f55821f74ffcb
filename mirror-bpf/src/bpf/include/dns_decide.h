/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains what a DNS message makes of its flow (the stage of the DNS program): a
 * query is kept (dns.h); a response is matched to its query, timed and counted by its response
 * code, and when a dns= rule covers its code (pseudo-status DNS_RCODE_BASE + rcode, rule.h),
 * its time (latency>) and its question (qname=, qname=!, qtype=), it marks the flow: the query replayed
 * ahead of it, the event naming the question the response itself carries (trigger.h).
 */
#ifndef MIRROR_DNS_DECIDE_H
#define MIRROR_DNS_DECIDE_H

#include "dns.h"
#include "dispatch.h"
#include "rule.h"
#include "scope.h"
#include "trigger.h"

/*
 * dns_qname_under - is the question's name (@name, @d->name_len bytes, not cut) @f's qname, or
 * a name under it? A suffix starting with a dot matches the names under it only.
 */
static __always_inline int dns_qname_under(const struct rule_filter *f, const struct dns_msg *d,
                                           const __u8 *name)
{
    __u32 n = d->name_len, k = f->qname_len;

    if (k > n || k > RULE_FILTER_TEXT)
        return 0;
    __u32 off = n - k;
    if (off) {
        __u32 before = off - 1;
        DNS_OPAQUE(before);
        if (f->qname[0] != '.' && (before >= DNS_NAME_MAX || name[before] != '.'))
            return 0;
    }
    for (__u32 i = 0; i < RULE_FILTER_TEXT; i++) {
        if (i >= k)
            break;
        __u32 at = off + i;
        DNS_OPAQUE(at);
        if (at >= DNS_NAME_MAX || name[at] != f->qname[i])
            return 0;
    }
    return 1;
}

/*
 * dns_qname_match - does the question's name pass @f's qname= (under it) or qname=! (not
 * under it)? A cut name, whose end is unknown, passes neither.
 */
static __always_inline int dns_qname_match(const struct rule_filter *f, const struct dns_msg *d,
                                           const __u8 *name)
{
    if (d->cut)
        return 0;
    return dns_qname_under(f, d, name) != f->qname_not;
}

/*
 * dns_filter_pick - the first rule of @e's filtered list (lowest id first) that matches a
 * response @took ns after its query (0: unknown) and whose qname= and qtype= the question in
 * s->dns (its name in s->req.head) passes: its rule_filters slot, 0 when none does. Counts the
 * rules turned down by their filter. A global function: verified once.
 */
__noinline __u32 dns_filter_pick(const struct rule_entry *e, __u64 took,
                                 const struct http_scratch *s)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!e || !s || !cnt)
        return 0;
    const struct dns_msg *d = &s->dns;
    const __u8 *name = s->req.head;
    for (int i = 0; i < RULE_FILTERED_MAX; i++) {
        __u32 slot = e->filtered[i];
        if (!slot)
            break;
        struct rule_filter *f = bpf_map_lookup_elem(&rule_filters, &slot);
        if (!f)
            continue;
        if (f->action.min_latency_ns && (!took || took < f->action.min_latency_ns))
            continue;
        /* An HTTP rule's filters (method=, path=, host=) are not for a DNS message. */
        if (f->methods || f->path_len || f->host_len)
            continue;
        if ((!f->qtype || (!d->cut && f->qtype == d->qtype)) &&
            (!f->qname_len || dns_qname_match(f, d, name)))
            return slot;
        cnt->v[STAT_FILTERED_OUT]++;
    }
    return 0;
}

/* dns_rule_pick - rule_pick for the DNS response in @s: the filters are qname= and qtype=. */
static __always_inline struct rule_action *dns_rule_pick(struct rule_entry *e, __u64 took,
                                                         const struct http_scratch *s)
{
    if (!e)
        return NULL;
    if (e->filtered[0]) {
        struct rule_action *ra = rule_filtered(dns_filter_pick(e, took, s));
        if (ra)
            return ra;
    }
    return rule_unfiltered(e, took);
}

/*
 * dns_decide - a response of s->meta's flow, @took ns after its query @q (NULL: not kept; kept
 * under @kept): when a rule of the server's scope matches, mark the flow, replay the query and
 * report. Seen at ingress, the response comes from the pod behind the veth, its server.
 * @return 1 when this response marked the flow.
 */
static __always_inline int dns_decide(struct __sk_buff *skb, struct http_scratch *s,
                                      const struct dns_query *q, const struct flow_key *kept,
                                      __u64 took)
{
    struct pkt_meta *m = &s->meta;
    struct dns_msg *d = &s->dns;
    __u32 rcode = DNS_RCODE(d->flags);
    __u32 scope = rule_scope(skb->ifindex, m->hook, SIDE_SERVER);
    struct rule_entry *scoped;
    struct rule_entry *global = rule_entries(m->src_port, DNS_RCODE_BASE + rcode, scope, &scoped);
    struct rule_action *ra = dns_rule_pick(scoped, took, s);

    if (!ra)
        ra = dns_rule_pick(global, took, s);
    if (!ra)
        return 0;
    struct trigger_info *ti = &s->trigger;
    ti->took = took;
    ti->status = rcode;
    ti->hook = m->hook;
    ti->kind = TRIGGER_DNS;
    ti->by = SIDE_SERVER;
    ti->proto = PROTO_DNS;
    ti->stream = 0;
    ti->request = q ? REQUEST_KEPT : REQUEST_NONE;
    ti->replay = q ? q->replay : 0;
    ti->replay_req = 0; /* a slot of its own (replay_take) */
    ti->replay_key = *kept;
    ti->dns_type = d->qtype;
    ti->dns_id = d->id;
    s->req.ts_ns = q ? q->ts_ns : 0;
    s->req.head_len = d->name_len;
    return mirror_trigger(skb, m, ra, NULL, ti);
}

/*
 * dns_replay_marked - the response to the kept query @q (kept under @kept) comes on a flow
 * marked since the query passed (by the answer to another query on the same socket: glibc
 * asks A and AAAA at once): the query goes to the mirror ahead of it, as at a trigger, so that
 * no answer reaches the mirror without its question.
 */
static __always_inline void dns_replay_marked(struct __sk_buff *skb, struct http_scratch *s,
                                              const struct dns_query *q,
                                              const struct flow_key *kept, struct counters *cnt)
{
    if (!bpf_map_lookup_elem(&mirror_marks, &s->meta.key))
        return;
    struct trigger_info *ti = &s->trigger;
    ti->replay = q->replay;
    ti->replay_req = 0;
    ti->replay_key = *kept;
    replay_trigger(skb, s, ti, cnt);
}

/*
 * dns_stage - the DNS message of s->meta's packet: a query kept, a response matched, timed,
 * counted and decided. A global function: verified once, in the DNS program.
 * @fs: this CPU's flow entry (may be NULL), whose TCP direction is classified as DNS here.
 * @return 2 when a query was kept with a replay slot (dns_query_copied, if the finish copied
 * it), 1 when a response marked its flow, else 0.
 */
__noinline int dns_stage(struct __sk_buff *skb, struct http_scratch *s, struct flow_cache_slot *fs)
{
    __u32 zero = 0;
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !s || !set || !cnt)
        return 0;
    struct pkt_meta *m = &s->meta;
    /* A TCP direction to or from a DNS port is DNS from here on: no port to look at again. */
    if (fs && m->key.proto == IPPROTO_TCP)
        fs->http_kind[m->dir & 1] = HTTP_DIR_DNS;
    int res = dns_read(skb, s);
    if (res == DNS_READ_BAD)
        cnt->v[STAT_DNS_MALFORMED]++;
    if (res != DNS_READ_OK)
        return 0;
    int response = s->dns.flags & DNS_FLAG_QR;
    /* The server's port: a client sending from a DNS port is not a server. */
    if (!dns_port(set, response ? m->src_port : m->dst_port))
        return 0;
    __u32 rules = set->kinds & (1 << TRIGGER_DNS);
    if (!response) {
        cnt->v[STAT_DNS_QUERIES]++;
        /* Kept for a replay when a dns= or a noresponse> rule may trigger on it. */
        return dns_query_keep(skb, s, set->kinds & DNS_RULE_KINDS);
    }
    const struct flow_key *kept;
    struct dns_query *q = dns_query_find(skb, s, &kept);
    if (!q)
        cnt->v[STAT_DNS_UNMATCHED]++;
    /* Over TCP a segment that does not start a message may look like one: a response is taken
     * only when it answers a query kept (its id and question), never named from a guess. */
    if (!q && m->key.proto == IPPROTO_TCP)
        return 0;
    cnt->v[STAT_DNS_RESPONSES]++;
    struct dns_rcode_counts *rc = bpf_map_lookup_elem(&dns_rcodes, &zero);
    if (rc)
        rc->v[DNS_RCODE(s->dns.flags)]++;
    __u64 took = dns_answer_time(q, m->now, skb->ifindex, set->timing & TIMING_DNS, cnt);
    int marked = rules ? dns_decide(skb, s, q, kept, took) : 0;
    if (!marked && q && q->replay && q->state == DNS_QUERY_PENDING)
        dns_replay_marked(skb, s, q, kept, cnt);
    /* Answered: a write, cheaper than a delete; the LRU takes the entry back in time. */
    if (q)
        q->state = DNS_QUERY_ANSWERED;
    return marked;
}

/* dns_query_copied - the query kept by dns_stage (s->dns_key) was copied with its flow, marked
 * when it passed: on the mirror already, its answer replays it no more. */
static __always_inline void dns_query_copied(struct http_scratch *s)
{
    struct dns_query *q = bpf_map_lookup_elem(&dns_queries, &s->dns_key);
    if (q)
        q->replay = 0;
}

#endif /* MIRROR_DNS_DECIDE_H */
