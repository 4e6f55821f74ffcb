/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the stream bookkeeping the protocol programs share: where a direction of a
 * connection stands in its byte stream before a segment (the next message's or frame's
 * sequence number, bytes kept of a split first line or frame header), its state written back
 * after it, and what the direction is taken for (the class the dispatcher reads, dispatch.h).
 * HTTP/1 (http.h) and HTTP/2 (h2.h) read the segment between the two, each in its own
 * program; the position travels from one to the other in the scratch area (pos.handed).
 */
#ifndef MIRROR_STREAM_H
#define MIRROR_STREAM_H

#include "maps.h"
#include "parse.h"
#include "flow_cache.h"
#include "timing.h"

/* scratch_get - this CPU's scratch area: the packet (meta) and the position in its segment. */
static __always_inline struct http_scratch *scratch_get(void)
{
    __u32 zero = 0;

    return bpf_map_lookup_elem(&http_scratch, &zero);
}

/* counters_get - this CPU's counters. */
static __always_inline struct counters *counters_get(void)
{
    __u32 zero = 0;

    return bpf_map_lookup_elem(&stats, &zero);
}

/*
 * slot_get - this CPU's flow cache slot of the packet in @m (classify_head chose it, and filled
 * it with the flow: on this CPU, in this run of the entry program, which nothing that takes a
 * slot interrupts). Its first word is compared all the same, as a check that costs one load.
 */
static __always_inline struct flow_cache_slot *slot_get(const struct pkt_meta *m)
{
    __u32 idx = m->slot;
    struct flow_cache_slot *fs = bpf_map_lookup_elem(&flow_cache, &idx);

    return fs && *(const __u64 *)&fs->key == *(const __u64 *)&m->key ? fs : NULL;
}

/*
 * stream_gap - the segment of s->meta starts past where its direction's next message was due
 * (a segment not seen, or one another CPU is handling at this very time): the framing is lost,
 * and the request queue of @t is uncertain from here (request_gap) before any message of this
 * segment is matched, since one may have hidden in what was not seen.
 */
static __always_inline void stream_gap(struct http_scratch *s, struct flow_timing *t)
{
    s->pos.unframed = 1;
    s->pos.state = HTTP_SCAN;
    request_gap(t, s->meta.dir & 1);
}

/*
 * stream_begin - where the direction of s->meta stands before this segment, from its shared
 * entry @t (may be NULL: not followed yet), into s->pos.
 * @return 1 when the segment is to be read, 0 when it cannot start a message (body, or a
 * direction whose body runs until the connection closes).
 */
static __always_inline int stream_begin(struct http_scratch *s, struct flow_timing *t)
{
    struct pkt_meta *m = &s->meta;
    struct http_pos *pos = &s->pos;
    __u32 len = m->payload_len, dir = m->dir & 1;

    __builtin_memset(pos, 0, sizeof(*pos));
    pos->hook = m->hook;
    if (!t)
        return 1; /* HTTP_SCAN */
    struct http_stream *st = &t->stream[dir];
    __s32 delta = (__s32)(st->next_seq - m->seq);
    __u32 was = st->state;
    pos->state = pos->was = was;
    if (was == HTTP_CLOSE)
        return 0;
    if (was == HTTP_ANSWERED) {
        /* Not framed, but followed by sequence number (next_seq: the end of the latest
         * segment): a segment seen already (a retransmission, or one that another CPU's queue
         * let a later one overtake) starts nothing, and one past a gap is a loss of framing (a
         * response may hide in what was not seen). Else body, unless a request is pending:
         * then a response may start the segment. */
        if (delta > 0 && (__u32)delta >= len)
            return 0;
        if (delta < 0) {
            stream_gap(s, t);
            return 1;
        }
        st->next_seq = m->seq + len;
        pos->off = delta;
        return t->req_head != t->req_tail;
    }
    if (was == HTTP_PARTIAL || was == HTTP2_PARTIAL) {
        /* The continuation starts right after the kept bytes; anything else: forget them, and
         * the message they began with them (a gap: it may not be found again). */
        pos->partial = delta + (__s32)st->partial_len == 0;
        if (pos->partial)
            pos->state = was == HTTP_PARTIAL ? HTTP_AT : HTTP2_FRAME;
        else
            stream_gap(s, t);
    } else if (was != HTTP_SCAN) {
        if (delta < 0) {
            /* Past the next message without having seen it: a gap. */
            stream_gap(s, t);
        } else if ((__u32)delta >= len) {
            return 0; /* body only (or a retransmission of it) */
        } else {
            pos->off = delta;
        }
    }
    return 1;
}

/*
 * stream_enter - where a protocol program reads the segment of s->meta from: the position the
 * program before it handed on (pos.handed, taken here), else the direction's state in its
 * shared entry @t (stream_begin).
 * @return 1 when the segment is to be read, 0 when it cannot start a message.
 */
static __always_inline int stream_enter(struct http_scratch *s, struct flow_timing *t)
{
    if (s->pos.handed) {
        s->pos.handed = 0;
        return 1;
    }
    timing_used(t);
    return stream_begin(s, t);
}

/*
 * stream_classify - what the direction of @pos is taken for, in this CPU's slot @fs (may be
 * NULL), for the dispatcher: HTTP/2 while its frames are followed, HTTP (seen) once a message
 * was, not followed after a TLS record or HTTP_GIVE_UP segments in a row that began nothing.
 * Written only when it changes.
 */
static __always_inline void stream_classify(struct flow_cache_slot *fs, const struct http_pos *pos,
                                            __u32 dir)
{
    if (!fs)
        return;
    __u8 was = fs->http_kind[dir & 1], now = was;

    if (pos->state >= HTTP2_FRAME)
        now = HTTP_DIR_H2;
    else if (was == HTTP_DIR_H2 || (was == HTTP_DIR_UNKNOWN && pos->seen))
        now = HTTP_DIR_SEEN;
    else if (was == HTTP_DIR_UNKNOWN && pos->tls)
        now = HTTP_DIR_OTHER;
    else if (was == HTTP_DIR_UNKNOWN && pos->was == HTTP_SCAN && pos->state == HTTP_SCAN &&
             !pos->kept && ++fs->http_misses[dir & 1] >= HTTP_GIVE_UP)
        now = HTTP_DIR_OTHER;
    if (now != was)
        fs->http_kind[dir & 1] = now;
}

/*
 * stream_end - the segment was read: classify the direction and write where its stream stands
 * to the shared entry (found again when this segment created it). Written only when there is
 * something to say: a flow that is not HTTP never writes.
 */
static __always_inline void stream_end(struct http_scratch *s, struct flow_cache_slot *fs,
                                       struct flow_timing *t)
{
    struct pkt_meta *m = &s->meta;
    struct http_pos *pos = &s->pos;
    __u32 dir = m->dir & 1;

    stream_classify(fs, pos, dir);
    if (pos->created)
        t = timing_find(fs, &m->key);
    if (t && pos->unframed)
        request_gap(t, dir);
    if (t && !pos->kept && (pos->state != HTTP_SCAN || pos->was != HTTP_SCAN) &&
        !(pos->state == HTTP_ANSWERED && pos->was == HTTP_ANSWERED)) {
        struct http_stream *st = &t->stream[dir];
        st->state = pos->state;
        /* An answered direction is followed to the end of its latest segment (stream_begin). */
        st->next_seq = m->seq + (pos->state == HTTP_ANSWERED ? m->payload_len : pos->off);
        st->partial_len = 0;
    }
}

#endif /* MIRROR_STREAM_H */
