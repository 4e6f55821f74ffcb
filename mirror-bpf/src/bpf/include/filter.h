/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the request filters of rules (method=, path=, host=): which of the rules
 * with filters covering a (port, status) key applies to the request behind a trigger. Run only
 * once a key's entry has such rules and the rest of a trigger's condition may hold: never per
 * packet, and at most RULE_FILTERED_MAX filters per trigger, however many rules exist (each
 * key lists its own, rule_entry.filtered). The method and target come from the request's head
 * (struct http_request), the Host header from its kept segment (replay.h): without one kept,
 * a host= filter does not match.
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
 * filter_host - where the value of the Host header of the request kept in @r begins (after
 * "Host:" and blanks, searched from the request's start), 0 when there is none.
 * A global function: verified once, run once per trigger with filters.
 */
__noinline int filter_host(const struct replay_slot *r)
{
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
        return v;
    }
    return 0;
}

/*
 * filter_match - does the request (head in @req, kept segment in @r, its Host value at @host)
 * pass @f? A global function: verified once.
 */
__noinline int filter_match(const struct rule_filter *f, const struct http_request *req,
                            const struct replay_slot *r, __u32 host)
{
    if (!f || !req)
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
        if (!r || !host)
            return 0;
        for (__u32 i = 0; i < RULE_FILTER_TEXT; i++) {
            if (i >= f->host_len)
                break;
            __u32 at = host + i;
            FILTER_OPAQUE(at);
            if (at >= r->len || at >= REPLAY_FRAME_MAX)
                return 0;
            __u8 c = r->frame[at];
            if (c >= 'A' && c <= 'Z')
                c |= 0x20;
            if (c != f->host[i])
                return 0;
        }
        /* The name ends there (a port may follow). */
        __u32 end = host + f->host_len;
        FILTER_OPAQUE(end);
        if (end < r->len && end < REPLAY_FRAME_MAX) {
            __u8 c = r->frame[end];
            if (c != '\r' && c != '\n' && c != ':' && c != ' ' && c != '\t')
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
 */
__noinline __u32 filter_pick(const struct rule_entry *e, __u64 took, const struct http_request *req,
                             const struct flow_key *key)
{
    __u32 zero = 0, host = 0, looked = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct replay_slot *r = NULL;

    if (!e || !req || !key || !cnt)
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
        if (f->host_len && !looked) {
            r = replay_slot_of(req->replay, key);
            host = filter_host(r);
            looked = 1;
        }
        if (filter_match(f, req, r, host))
            return slot;
        cnt->v[STAT_FILTERED_OUT]++;
    }
    return 0;
}

#endif /* MIRROR_FILTER_H */
