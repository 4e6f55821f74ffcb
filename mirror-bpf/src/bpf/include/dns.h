/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains DNS as the classifier follows it, over UDP and over TCP (a message at the
 * start of a segment, after its 2-byte length): the header and question of a message (RFC 1035 4.1), each query kept (dns_queries, by its flow as seen and its id) until
 * its response (then left to the LRU, answered), which finds it under its own key or, across a Service's NAT, the other one
 * (nat.h), and is timed and counted by its response code. A response with the same id whose
 * question differs is not that query's: it is counted unmatched, never named as it. What a
 * response makes of its flow is decided in dns_decide.h.
 *
 * Only messages to or from a DNS port (settings.dns_ports) reach here (dispatch.h): a UDP
 * packet that is not DNS costs the parser and nothing more.
 */
#ifndef MIRROR_DNS_H
#define MIRROR_DNS_H

#include "maps.h"
#include "hist.h"
#include "nat.h"
#include "replay.h"

#define DNS_HEADER_LEN 12
/* Bytes of a message read: its header, a question whose name fits DNS_NAME_MAX (a length byte
 * before each label, the root's at the end), its type and class. */
#define DNS_READ_MAX (DNS_HEADER_LEN + DNS_NAME_MAX + 2 + 4)
/* Flags: a response (QR), the opcode (0: a standard query), the response code. */
#define DNS_FLAG_QR 0x8000
#define DNS_OPCODE(flags) (((flags) >> 11) & 0xF)
#define DNS_RCODE(flags) ((flags)&0xF)

/* Hides @x's value from the compiler, so that the verifier checks the bound of the very
 * register that indexes. */
#define DNS_OPAQUE(x) asm volatile("" : "+r"(x))

enum dns_read_result {
    DNS_READ_OK = 0,
    DNS_READ_SKIP, /* not a standard query or its response with one question: not followed */
    DNS_READ_BAD,  /* not DNS, or cut: counted */
};

/*
 * dns_read - read the header and question of the DNS message in s->meta's payload into s->dns,
 * the name's text (lower case, labels joined by dots, no final dot) into s->req.head, zero
 * after it. A name longer than DNS_NAME_MAX is kept cut (its type then unknown, 0). A global
 * function: verified once.
 * @return enum dns_read_result.
 */
__noinline int dns_read(struct __sk_buff *skb, struct http_scratch *s)
{
    if (!skb || !s)
        return DNS_READ_BAD;
    struct pkt_meta *m = &s->meta;
    struct dns_msg *d = &s->dns;
    __u8 *text = s->req.head;
    /* Over TCP a message follows its 2-byte length: read where a segment starts with one. */
    __u32 skip = m->key.proto == IPPROTO_TCP ? 2 : 0;
    __u64 len = m->payload_len;

    if (len < skip + DNS_HEADER_LEN + 5)
        return DNS_READ_BAD;
    len -= skip;
    if (len > DNS_READ_MAX)
        len = DNS_READ_MAX;
    DNS_OPAQUE(len);
    if (len < 1 || len > DNS_READ_MAX ||
        bpf_skb_load_bytes(skb, m->payload_off + skip, s->buf, len))
        return DNS_READ_BAD;
    const __u8 *b = s->buf;
    d->id = (__u16)b[0] << 8 | b[1];
    d->flags = (__u16)b[2] << 8 | b[3];
    if (DNS_OPCODE(d->flags) || b[4] || b[5] != 1)
        return DNS_READ_SKIP;

    __builtin_memset(text, 0, DNS_NAME_MAX);
    __u32 rem = 0, end = 0, cut = 0;
    /* Wire byte i is text byte i - 1: the first length byte drops, the others become dots. */
    for (__u32 i = 0; i < DNS_NAME_MAX + 2; i++) {
        __u32 at = DNS_HEADER_LEN + i;
        if (at >= len)
            break;
        __u8 c = b[at];
        if (!rem && !c) {
            end = at + 1;
            break;
        }
        if (i > DNS_NAME_MAX) {
            cut = 1;
            break;
        }
        if (!rem) {
            /* A compression pointer or an extended label has no place in a question. */
            if (c & 0xC0)
                return DNS_READ_BAD;
            rem = c;
            c = '.';
        } else {
            rem--;
            if (c >= 'A' && c <= 'Z')
                c |= 0x20;
        }
        __u32 t = i - 1;
        DNS_OPAQUE(t);
        if (i && t < DNS_NAME_MAX)
            text[t] = c;
    }
    d->cut = cut;
    if (cut) {
        d->name_len = DNS_NAME_MAX;
        d->qtype = 0;
        return DNS_READ_OK;
    }
    if (!end || end + 4 > len)
        return DNS_READ_BAD;
    __u32 wire = end - DNS_HEADER_LEN;
    d->name_len = wire > 1 ? wire - 2 : 0;
    DNS_OPAQUE(end);
    if (end > DNS_READ_MAX - 2)
        return DNS_READ_BAD;
    d->qtype = (__u16)b[end] << 8 | b[end + 1];
    return DNS_READ_OK;
}

/* dns_same_question - does the kept query @q ask what the message in @d (its name in @name)
 * answers? Ids repeat: a response is its query's only when the question is the same. */
static __always_inline int dns_same_question(const struct dns_query *q, const struct dns_msg *d,
                                             const __u8 *name)
{
    if (q->qtype != d->qtype || q->name_len != d->name_len)
        return 0;
    const __u64 *x = (const __u64 *)q->name, *y = (const __u64 *)name;
    __u64 diff = 0;
#pragma unroll
    for (int i = 0; i < DNS_NAME_MAX / 8; i++)
        diff |= x[i] ^ y[i];
    return !diff;
}

/*
 * dns_query_keep - a query of s->meta's flow: kept until its response (or a noresponse mark,
 * dns_noresponse.h) with its time and, when a DNS rule exists (@rules), its whole datagram for
 * a replay. A retransmission (same flow, id and question) keeps the first one's. A global
 * function: verified once.
 * @return 2 when the query was kept with a replay slot, else 0.
 */
__noinline int dns_query_keep(struct __sk_buff *skb, struct http_scratch *s, __u32 rules)
{
    if (!skb || !s)
        return 0;
    struct pkt_meta *m = &s->meta;
    struct dns_key *k = &s->dns_key;

    k->key = m->key;
    k->id = s->dns.id;
    __builtin_memset(k->_pad, 0, sizeof(k->_pad));
    struct dns_query *old = bpf_map_lookup_elem(&dns_queries, k);
    if (old && old->state != DNS_QUERY_ANSWERED && dns_same_question(old, &s->dns, s->req.head))
        return 0;
    struct dns_query *q = &s->dns_query;
    q->ts_ns = m->now;
    q->ifindex = skb->ifindex;
    q->qtype = s->dns.qtype;
    q->server = m->dst_port;
    q->name_len = s->dns.name_len;
    q->dir = m->dir;
    q->hook = m->hook;
    q->state = DNS_QUERY_PENDING;
    __builtin_memcpy(q->name, s->req.head, DNS_NAME_MAX);
    q->replay = rules ? replay_take(skb, m) : 0;
    bpf_map_update_elem(&dns_queries, k, q, BPF_ANY);
    return q->replay ? 2 : 0;
}

/*
 * dns_query_find - the kept query a response of s->meta's flow answers (its id and question in
 * s->dns), under the flow's key or, across NAT, the other one (@kept set to the key it was
 * found under, s->dns_key its entry's key). NULL when none was kept.
 */
static __always_inline struct dns_query *dns_query_find(struct __sk_buff *skb,
                                                        struct http_scratch *s,
                                                        const struct flow_key **kept)
{
    struct pkt_meta *m = &s->meta;
    struct dns_key *k = &s->dns_key;

    k->key = m->key;
    k->id = s->dns.id;
    __builtin_memset(k->_pad, 0, sizeof(k->_pad));
    *kept = &m->key;
    struct dns_query *q = bpf_map_lookup_elem(&dns_queries, k);
    if ((!q || q->state == DNS_QUERY_ANSWERED) && nat_peer(skb, m, NULL, &s->peer, 1)) {
        k->key = s->peer;
        *kept = &s->peer;
        q = bpf_map_lookup_elem(&dns_queries, k);
    }
    if (!q || q->state == DNS_QUERY_ANSWERED)
        return NULL;
    return dns_same_question(q, &s->dns, s->req.head) ? q : NULL;
}

/*
 * dns_answer_time - a response to the query @q (may be NULL) at @now: the time it took (0:
 * unknown), counted in the histogram of the interface it was seen on, @ifindex, when DNS
 * times are on (@timed).
 */
static __always_inline __u64 dns_answer_time(const struct dns_query *q, __u64 now, __u32 ifindex,
                                             __u32 timed, struct counters *cnt)
{
    if (!q || !q->ts_ns || q->ts_ns > now)
        return 0;
    __u64 took = now - q->ts_ns;
    if (timed && hist_add(ifindex, HIST_DNS_RESPONSE, 0, took))
        cnt->v[STAT_HIST_INSERT_FAILED]++;
    return took;
}

#endif /* MIRROR_DNS_H */
