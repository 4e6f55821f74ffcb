/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the request filters of rules (method=, path=, host=): which of the rules
 * with filters covering a (port, status) key applies to the request behind a trigger. Run only
 * once a key's entry has such rules and the rest of a trigger's condition may hold: never per
 * packet, and at most RULE_FILTERED_MAX filters per trigger, however many rules exist (each
 * key lists its own, rule_entry.filtered). The method and target come from the request's head
 * (struct http_request: for HTTP/2 "METHOD path" from its HEADERS), the host from the Host
 * header of its kept segment (replay.h: without one kept, a host= filter does not match) or,
 * for HTTP/2, its :authority.
 */
#ifndef MIRROR_FILTER_H
#define MIRROR_FILTER_H

#include "maps.h"
#include "replay.h"
#include "method.h"

/* Hides @x's value from the compiler, so that it checks the bound of the very register it
 * indexes with (instead of a pointer it derived before the check). */
#define FILTER_OPAQUE(x) asm volatile("" : "+r"(x))

/*
 * filter_host_copy - the host name at @v of the request kept in @r into @out: lower case, up to
 * a port, a blank or the line's end (an IPv6 literal with its brackets). A global function: verified once, whatever @v is.
 */
__noinline int filter_host_copy(const struct replay_slot *r, __u32 v, struct host_text *out)
{
    if (!r || !out)
        return 0;
    __u32 len = r->len, n = 0, v6 = 0;

    for (__u32 i = 0; i < H2_TEXT; i++) {
        __u32 at = v + i;
        FILTER_OPAQUE(at);
        if (at >= len || at >= REPLAY_FRAME_MAX)
            break;
        __u8 c = r->frame[at];
        if (c == '\r' || c == '\n' || c == ' ' || c == '\t' || (c == ':' && !v6))
            break;
        if (c >= 'A' && c <= 'Z')
            c |= 0x20;
        out->text[i] = c;
        n = i + 1;
        if (!i && c == '[')
            v6 = 1;
        if (c == ']')
            break;
    }
    out->len = n;
    return 0;
}

/*
 * filter_host - the value of the Host header of the request kept in @r (searched from the
 * request's start), lower case and without a port, into @out (len 0 when there is none).
 * A global function: verified once, run once per trigger with a host= filter.
 */
__noinline int filter_host(const struct replay_slot *r, struct host_text *out)
{
    if (!out)
        return 0;
    out->len = 0;
    if (!r || !r->len)
        return 0;
    __u32 from = r->req_off, len = r->len;

    for (__u32 i = 0; i < REPLAY_FRAME_MAX - 8; i++) {
        __u32 at = from + i;
        FILTER_OPAQUE(at);
        if (at + 8 > len || at + 8 > REPLAY_FRAME_MAX)
            break;
        const __u8 *p = &r->frame[at];
        /* "\nhost:", case-insensitive: ':' stays what it is when OR-ed with 0x20. */
        if (p[0] != '\n' || (p[1] | 0x20) != 'h' || (p[2] | 0x20) != 'o' || (p[3] | 0x20) != 's' ||
            (p[4] | 0x20) != 't' || p[5] != ':')
            continue;
        __u32 v = at + 6;
        FILTER_OPAQUE(v);
        if (v < len && v < REPLAY_FRAME_MAX && (r->frame[v] == ' ' || r->frame[v] == '\t'))
            v++;
        return filter_host_copy(r, v, out);
    }
    return 0;
}

/*
 * filter_match - does the request (head in @req, Host or :authority in @host, may be NULL)
 * pass @f? A global function: verified once.
 */
__noinline int filter_match(const struct rule_filter *f, const struct http_request *req,
                            const struct host_text *host)
{
    /* A DNS rule's filters (qname=, qtype=) are not for a request (dns_decide.h). */
    if (!f || !req || f->qname_len || f->qtype)
        return 0;
    __u32 skip = 0, method = http_method(req->head, &skip);

    if (f->methods && !(f->methods & method))
        return 0;
    if (f->path_len) {
        if (!method || skip + f->path_len > req->head_len)
            return 0;
        for (__u32 i = 0; i < RULE_FILTER_TEXT; i++) {
            if (i >= f->path_len)
                break;
            __u32 at = skip + i;
            FILTER_OPAQUE(at);
            if (at >= HTTP_REQUEST_HEAD_LEN || req->head[at] != f->path[i])
                return 0;
        }
    }
    if (f->host_len) {
        if (!host || host->len != f->host_len)
            return 0;
        for (__u32 i = 0; i < RULE_FILTER_TEXT; i++) {
            if (i >= f->host_len)
                break;
            if (host->text[i & (H2_TEXT - 1)] != f->host[i])
                return 0;
        }
    }
    return 1;
}

/*
 * filter_pick - the first rule of @e's filtered list (lowest id first) that matches a trigger
 * @took ns after the request (its latency> or noresponse> threshold) and whose filter the request
 * passes: its rule_filters key (its slot), 0 when none does. Counts the rules whose condition
 * held but whose filter turned the request down. A global function: verified once.
 * @req: the request's head, whole; its segment kept (if it was) under @key.
 * @given: the request's :authority (HTTP/2), or NULL: its Host header, read from its kept
 * segment when a filter needs it.
 */
__noinline __u32 filter_pick(const struct rule_entry *e, __u64 took, const struct http_request *req,
                             const struct flow_key *key, const struct host_text *given)
{
    __u32 zero = 0, looked = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct http_scratch *s = bpf_map_lookup_elem(&http_scratch, &zero);
    const struct host_text *host = given;

    if (!e || !req || !key || !cnt || !s)
        return 0;
    /* A flow marked already: nothing more to decide (a later trigger would not mark it again),
     * and nothing to count as turned down. */
    if (bpf_map_lookup_elem(&mirror_marks, key))
        return 0;
    for (int i = 0; i < RULE_FILTERED_MAX; i++) {
        __u32 slot = e->filtered[i];
        if (!slot)
            break;
        struct rule_filter *f = bpf_map_lookup_elem(&rule_filters, &slot);
        if (!f)
            continue;
        if (f->action.min_latency_ns && (!took || took < f->action.min_latency_ns))
            continue;
        if (f->host_len && !host && !looked) {
            const struct replay_slot *r = replay_slot_of(req->replay, key, req->replay_req);
            filter_host(r, &s->host);
            /* Taken over while it was read (noresponse.h): no Host is known. */
            if (r && !replay_intact(r, req->replay_req))
                s->host.len = 0;
            host = &s->host;
            looked = 1;
        }
        if (filter_match(f, req, host))
            return slot;
        cnt->v[STAT_FILTERED_OUT]++;
    }
    return 0;
}

#endif /* MIRROR_FILTER_H */
