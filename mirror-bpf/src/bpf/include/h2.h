/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains HTTP/2 cleartext in a TCP stream, followed per direction the way http.h
 * follows HTTP/1.x messages: where each frame starts, by TCP sequence number. A direction is
 * taken for HTTP/2 at its connection preface (prior knowledge, or after an HTTP/1.1 request with
 * Upgrade: h2c), at a SETTINGS frame where its first message was due (a server's first frame,
 * or after a 101 answer), or, where a connection began before it was followed, at a segment
 * that is a chain of frames ending with it (h2_resync). From there each frame's 9-byte header
 * says where the next one starts: a frame header split across segments is kept (its first
 * bytes), many frames in one segment are each looked at, and DATA is skipped by its length
 * without being read (a segment of DATA costs one compare: http_segment). Header blocks
 * (HEADERS, PUSH_PROMISE) are read with hpack.h, a block whose frame ends in a later segment
 * kept until it ends (up to H2_BLOCK_MAX bytes). What a block says is decided in h2_decide.h.
 */
#ifndef MIRROR_H2_H
#define MIRROR_H2_H

#include "maps.h"
#include "parse.h"
#include "method.h"
#include "timing.h"
#include "hpack.h"

/* Frame types (RFC 9113, 6). */
#define H2_DATA 0x0
#define H2_HEADERS 0x1
#define H2_PRIORITY 0x2
#define H2_RST_STREAM 0x3
#define H2_SETTINGS 0x4
#define H2_PUSH_PROMISE 0x5
#define H2_PING 0x6
#define H2_GOAWAY 0x7
#define H2_WINDOW_UPDATE 0x8
#define H2_CONTINUATION 0x9
/* Frame flags. */
#define H2_END_STREAM 0x1
#define H2_END_HEADERS 0x4
#define H2_PADDED 0x8
#define H2_PRIORITY_FLAG 0x20
#define H2_FRAME_HEADER 9
/* Bytes of the segment read at once from a frame's start (the window, in the scratch buffer):
 * the headers of the frames after it and their header blocks are read from there while they
 * fall inside it: one read for a segment of small frames, not two per frame. After a frame
 * longer than that (DATA of a large answer: its next header is far), H2_WINDOW_NEAR. */
#define H2_WINDOW HTTP_SCAN_MAX
#define H2_WINDOW_NEAR 64
#define H2_PREFACE_LEN 24
/* The largest frame a peer may send without raising SETTINGS_MAX_FRAME_SIZE. */
#define H2_FRAME_DEFAULT_MAX 16384

#include "h2_decide.h"
#include "stream.h"
#include "dispatch.h"

/* A frame header, read. */
struct h2_frame_hdr {
    __u32 len;
    __u32 stream;
    __u8 type;
    __u8 flags;
};

/* h2_parse_hdr - the 9 bytes at @p as a frame header. */
static __always_inline void h2_parse_hdr(const __u8 *p, struct h2_frame_hdr *f)
{
    f->len = (__u32)p[0] << 16 | (__u32)p[1] << 8 | p[2];
    f->type = p[3];
    f->flags = p[4];
    f->stream = ((__u32)p[5] << 24 | (__u32)p[6] << 16 | (__u32)p[7] << 8 | p[8]) & 0x7fffffff;
}

/*
 * h2_plausible - could @f be a frame of a connection (the stream id where its type needs one,
 * none where it must have none, the fixed lengths)? @strict: within the default maximum size,
 * of a known type (a chain taken for HTTP/2 without a preface).
 */
static __always_inline int h2_plausible(const struct h2_frame_hdr *f, int strict)
{
    switch (f->type) {
    case H2_DATA:
    case H2_HEADERS:
    case H2_CONTINUATION:
    case H2_PUSH_PROMISE:
        if (!f->stream)
            return 0;
        break;
    case H2_PRIORITY:
        return f->stream && f->len == 5;
    case H2_RST_STREAM:
        return f->stream && f->len == 4;
    case H2_SETTINGS:
        return !f->stream && f->len % 6 == 0 && !(f->flags & 1 && f->len);
    case H2_PING:
        return !f->stream && f->len == 8;
    case H2_GOAWAY:
        return !f->stream && f->len >= 8;
    case H2_WINDOW_UPDATE:
        return f->len == 4;
    default:
        return !strict;
    }
    return !strict || f->len <= H2_FRAME_DEFAULT_MAX;
}

/*
 * h2_begins - do the @n bytes at @p (a segment's first, where a message was due) begin HTTP/2:
 * the client's preface, or a SETTINGS frame (the server's first frame)?
 * @return the bytes before the first frame (24 for the preface, 0), -1 when not.
 */
static __always_inline int h2_begins(const __u8 *p, __u32 n)
{
    if (n >= 16 && *(const __u64 *)p == HTTP_WORD8('P', 'R', 'I', ' ', '*', ' ', 'H', 'T') &&
        *(const __u64 *)(p + 8) == HTTP_WORD8('T', 'P', '/', '2', '.', '0', '\r', '\n'))
        return H2_PREFACE_LEN;
    if (n < H2_FRAME_HEADER || p[3] != H2_SETTINGS || p[4] & ~1)
        return -1;
    struct h2_frame_hdr f;
    h2_parse_hdr(p, &f);
    return f.len <= H2_FRAME_DEFAULT_MAX && h2_plausible(&f, 1) && !(p[5] & 0x80) ? 0 : -1;
}

/*
 * h2_resync - is the segment of s->meta, from payload offset @off, a chain of plausible frames
 * of known types that ends exactly with it (a direction of a connection that began before it
 * was followed, or whose frames were lost)? At most 8 frame headers are read. A global
 * function: verified once, run at segment starts of directions with no message known yet.
 */
__noinline int h2_resync(struct __sk_buff *skb, struct http_scratch *s, __u32 off)
{
    if (!skb || !s)
        return 0;
    struct pkt_meta *m = &s->meta;
    __u32 len = m->payload_len;
    __u8 p[H2_FRAME_HEADER];
    struct h2_frame_hdr f;

    for (int i = 0; i < 8; i++) {
        if (off + H2_FRAME_HEADER > len)
            return 0;
        if (bpf_skb_load_bytes(skb, m->payload_off + off, p, H2_FRAME_HEADER))
            return 0;
        h2_parse_hdr(p, &f);
        if (!h2_plausible(&f, 1) || p[5] & 0x80)
            return 0;
        off += H2_FRAME_HEADER + f.len;
        if (off == len)
            return 1;
    }
    return 0;
}

/*
 * h2_conn_get - the HTTP/2 state of the flow of @key, created (empty) when @create.
 */
static __always_inline struct h2_conn *h2_conn_get(const struct flow_key *key, int create)
{
    struct h2_conn *c = bpf_map_lookup_elem(&h2_conns, key);
    __u32 zero = 0;

    if (c || !create)
        return c;
    struct zero_values *init = bpf_map_lookup_elem(&zero_values, &zero);
    if (!init)
        return NULL;
    bpf_map_update_elem(&h2_conns, key, &init->h2, BPF_NOEXIST);
    return bpf_map_lookup_elem(&h2_conns, key);
}

/*
 * h2_lost - the framing of @m's direction was lost (a gap, or what could not be a frame): the
 * frames skipped may have carried header blocks, so its table state is lost too.
 */
static __always_inline void h2_lost(const struct pkt_meta *m, struct counters *cnt)
{
    struct h2_conn *c = h2_conn_get(&m->key, 0);

    if (c)
        hpack_lost(&c->dir[m->dir & 1]);
    cnt->v[STAT_H2_LOST]++;
}

/*
 * h2_start - direction @dir of @t speaks HTTP/2 from payload offset @off of this segment on
 * (see h2_begins): say so in the position, the flow and the counters; its table is followed from
 * here (from its start when the preface or the first SETTINGS is seen).
 */
static __always_inline void h2_start(struct http_scratch *s, struct flow_timing *t, __u32 off,
                                     struct counters *cnt)
{
    __u32 dir = s->meta.dir & 1;
    struct h2_conn *c = h2_conn_get(&s->meta.key, 1);

    if (c)
        hpack_lost(&c->dir[dir]);
    t->h2 |= 1 << dir;
    s->pos.off = off;
    s->pos.state = HTTP2_FRAME;
    s->pos.seen = 1;
    cnt->v[STAT_H2_CONNECTIONS]++;
}

/* Fields read per step of the field loop: each step is a call (and a return). */
#define H2_FIELDS_PER_STEP 2

/*
 * h2_field_step - the next H2_FIELDS_PER_STEP fields of the header block being read (bpf_loop
 * callback: its body is verified once, not once per step), @ctx the direction's table state (a
 * pointer to it, on the caller's stack); the last result (see hpack_field) kept in
 * h2.field_result.
 * @return 1 to stop: at the block's end, or when it could not be read.
 */
static long h2_field_step(__u64 i, void *ctx)
{
    struct h2_dir **d = ctx;
    __u32 zero = 0;
    struct http_scratch *s = bpf_map_lookup_elem(&http_scratch, &zero);

    if (!s)
        return 1;
    int r = 0;
#pragma unroll
    for (int k = 0; k < H2_FIELDS_PER_STEP && !r; k++)
        r = hpack_field(s, *d);
    s->h2.field_result = r;
    return r != 0;
}

/*
 * h2_block_of - the frame (@type, @flags, @stream, payload of @flen bytes) whose header block's
 * first @n bytes are in s->buf from @at, for h2_block: read next, by the frame loop (h2_frame_step), not
 * from inside h2_frame (each call frame's stack adds up along a chain).
 */
static __always_inline void h2_block_of(struct h2_scratch *h, __u32 at, __u32 n, __u32 flen,
                                        __u32 type, __u32 flags, __u32 stream)
{
    h->ready = H2_READY_BLOCK;
    h->block_at = at;
    h->block_n = n;
    h->frame_len = flen;
    h->frame_type = type;
    h->frame_flags = flags;
    h->frame_stream = stream;
}

/*
 * h2_block - the header block of the frame described in s->h2 (h2_block_of) of s->meta's
 * direction, its first bytes in s->buf: read each field (hpack.h) into s->h2, with the
 * direction's table state in @c (the connection's, looked up once per segment by the frame
 * loop); a HEADERS block is then decided (h2_decide, called next by the frame loop). A global
 * function: verified once, run per header block.
 */
__noinline int h2_block(struct http_scratch *s, struct h2_conn *c)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!s || !c || !cnt)
        return 0;
    struct h2_dir *d = &c->dir[s->meta.dir & 1];
    struct h2_scratch *h = &s->h2;
    __u32 n = h->block_n, flen = h->frame_len, type = h->frame_type, flags = h->frame_flags;
    __u32 at = h->block_at & (H2_WINDOW - 1), start = at, end = at + n, block_end = at + flen;
    /* The block is what the padding and the priority or promised stream leave. */
    if (flags & H2_PADDED) {
        __u32 pad = s->buf[at];
        start = at + 1;
        if (pad + 1 > flen) {
            hpack_lost(d);
            cnt->v[STAT_H2_LOST]++;
            return 0;
        }
        block_end = at + flen - pad;
        if (block_end < end)
            end = block_end;
    }
    if (type == H2_HEADERS && flags & H2_PRIORITY_FLAG)
        start += 5;
    if (type == H2_PUSH_PROMISE)
        start += 4;
    h->at = start;
    h->end = end;
    h->status = 0;
    h->grpc_status = 0;
    h->fields = 0;
    h->method_len = 0;
    h->path_len = 0;
    h->stream.authority.len = 0;
    h->field_result = 0;
    _Static_assert(H2_BLOCK_FIELDS % H2_FIELDS_PER_STEP == 0, "whole steps");
    bpf_loop(H2_BLOCK_FIELDS / H2_FIELDS_PER_STEP, h2_field_step, &d, 0);
    int r = h->field_result;
    /* Not read whole (cut, malformed, too many fields, or continued in CONTINUATION frames):
     * the insertions it made are not all known. */
    int whole = r == 1 && block_end <= at + n;
    if (!(flags & H2_END_HEADERS)) {
        cnt->v[STAT_H2_CONTINUATION]++;
        whole = 0;
    }
    if (!whole) {
        hpack_lost(d);
        cnt->v[STAT_H2_LOST]++;
    }
    if (type == H2_HEADERS)
        h->ready = H2_READY_DECIDE;
    return 0;
}

/*
 * h2_header_frame - a frame that carries a header block (@f), its payload from payload offset
 * @pay of this segment, its first @peeked bytes in the window at @at of s->buf: read the block
 * when it ends here (from the window when it is whole there); keep its bytes when it ends in a
 * later segment (HTTP2_BLOCK, the position then at the segment's end). Inlined into h2_frame.
 */
static __always_inline int h2_header_frame(struct __sk_buff *skb, struct http_scratch *s,
                                           struct flow_timing *t, __u32 pay, __u32 flen, __u32 type,
                                           __u32 flags, __u32 stream, __u32 at, __u32 peeked)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !s || !t || !cnt)
        return 0;
    struct pkt_meta *m = &s->meta;
    __u32 dir = m->dir & 1, len = m->payload_len;
    if (type == H2_CONTINUATION) {
        /* Its block began in a HEADERS frame without END_HEADERS: lost and counted there. */
        return 0;
    }
    if (pay > len)
        return 0;
    __u32 here = len - pay;
    if (flen <= peeked) {
        h2_block_of(&s->h2, at, flen, flen, type, flags, stream);
        return 0;
    }
    s->h2.win_len = 0; /* the buffer holds this block from here */
    if (flen <= here) {
        /* Its first HTTP_SCAN_MAX bytes: a larger block is read that far (and lost after). */
        __u64 n = flen > HTTP_SCAN_MAX ? HTTP_SCAN_MAX : flen;
        asm volatile("%0 &= 0x3ff" : "+r"(n));
        if (n > HTTP_SCAN_MAX || (n && bpf_skb_load_bytes(skb, m->payload_off + pay, s->buf, n)))
            return 0;
        h2_block_of(&s->h2, 0, n, flen, type, flags, stream);
        return 0;
    }
    /* The block ends in a later segment: the table state is needed here (the frame loop looks
     * it up for a block read at once). */
    struct h2_conn *c = h2_conn_get(&m->key, 1);
    if (!c)
        return 0;
    struct h2_dir *d = &c->dir[dir];
    if (flen > H2_BLOCK_MAX) {
        /* Too large to keep: its fields are lost. */
        hpack_lost(d);
        cnt->v[STAT_H2_LOST]++;
        return 0;
    }
    /* Kept until the frame ends (here < flen <= H2_BLOCK_MAX). */
    __u64 k = here;
    asm volatile("%0 &= 0xff" : "+r"(k));
    if (k && bpf_skb_load_bytes(skb, m->payload_off + pay, d->block, k)) {
        hpack_lost(d);
        return 0;
    }
    d->block_len = k;
    d->block_total = flen;
    d->block_stream = stream;
    d->block_type = type;
    d->block_flags = flags;
    s->pos.state = HTTP2_BLOCK;
    s->pos.off = len;
    return 0;
}

/*
 * h2_block_lost - a header block kept across segments cannot be read (its state is not what it
 * should be, or a load failed): the table state of @d is lost, and the direction's framing.
 */
static __always_inline void h2_block_lost(struct h2_dir *d, struct http_pos *pos,
                                          struct counters *cnt)
{
    hpack_lost(d);
    pos->state = HTTP_SCAN;
    pos->stop = 1;
    cnt->v[STAT_H2_LOST]++;
}

/*
 * h2_block_rest - the segment goes on with a header block kept from earlier ones (HTTP2_BLOCK,
 * at the position): when the frame ends here, read the block whole, else keep these bytes too.
 * Inlined into h2_frame.
 */
static __always_inline int h2_block_rest(struct __sk_buff *skb, struct http_scratch *s,
                                         struct flow_timing *t)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !s || !t || !cnt)
        return 0;
    struct pkt_meta *m = &s->meta;
    struct http_pos *pos = &s->pos;
    __u32 dir = m->dir & 1, len = m->payload_len, off = pos->off;
    struct h2_conn *c = h2_conn_get(&m->key, 0);
    if (!c || off >= len) {
        pos->state = HTTP_SCAN;
        pos->stop = 1;
        return 0;
    }
    struct h2_dir *d = &c->dir[dir];
    __u32 have = d->block_len & 0xff, total = d->block_total;
    if (total > H2_BLOCK_MAX || have >= total) {
        h2_block_lost(d, pos, cnt);
        return 0;
    }
    __u32 rest = total - have, avail = len - off;
    if (rest > avail) {
        /* Still not whole: these bytes join the kept ones (a block over three segments or
         * more: up to half the space each, else lost). */
        __u64 k = avail, at = have;
        if (k >= H2_BLOCK_MAX / 2 || at >= H2_BLOCK_MAX / 2) {
            hpack_lost(d);
            pos->state = HTTP2_FRAME;
            pos->off = off + rest;
            pos->stop = 1;
            cnt->v[STAT_H2_LOST]++;
            return 0;
        }
        asm volatile("%0 &= 0x7f" : "+r"(k));
        asm volatile("%0 &= 0x7f" : "+r"(at));
        if (k && !bpf_skb_load_bytes(skb, m->payload_off + off, &d->block[at], k))
            d->block_len = at + k;
        pos->off = len;
        pos->stop = 1;
        return 0;
    }
    s->h2.win_len = 0; /* the buffer holds the block from here */
    __builtin_memcpy(s->buf, d->block, H2_BLOCK_MAX);
    __u64 k = rest;
    asm volatile("%0 &= 0x1ff" : "+r"(k));
    if (k < 1 || k > H2_BLOCK_MAX ||
        bpf_skb_load_bytes(skb, m->payload_off + off, &s->buf[have], k)) {
        h2_block_lost(d, pos, cnt);
        return 0;
    }
    h2_block_of(&s->h2, 0, total, total, d->block_type, d->block_flags, d->block_stream);
    pos->off = off + rest;
    pos->state = HTTP2_FRAME;
    return 0;
}

/*
 * h2_frame - the frame whose header starts at the position (after the bytes kept from earlier
 * segments when pos->partial): read its header, its header block if it carries one, and move
 * the position past it. A global function: verified once, run per frame header.
 */
__noinline int h2_frame(struct __sk_buff *skb, struct http_scratch *s, struct flow_timing *t)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !s || !t || !cnt)
        return 0;
    struct pkt_meta *m = &s->meta;
    struct http_pos *pos = &s->pos;
    struct h2_scratch *h = &s->h2;
    __u32 dir = m->dir & 1, len = m->payload_len, off = pos->off;
    if (off >= len) {
        pos->stop = 1;
        return 0;
    }
    if (pos->state == HTTP2_BLOCK)
        return h2_block_rest(skb, s, t);
    struct http_stream *st = &t->stream[dir];
    __u32 kept = pos->partial ? st->partial_len & 0xf : 0;
    if (kept >= H2_FRAME_HEADER)
        kept = 0;
    __builtin_memcpy(h->hdr, st->partial, HTTP_PARTIAL_LEN);
    pos->partial = 0;
    __u32 need = H2_FRAME_HEADER - kept, avail = len - off;
    if (avail < need) {
        /* The header ends in a later segment: keep its first bytes. */
        __u64 k = avail;
        asm volatile("%0 &= 0xf" : "+r"(k)); /* avail < need <= 9: up to 8 bytes */
        if (k && !bpf_skb_load_bytes(skb, m->payload_off + off, &h->hdr[kept], k)) {
            __builtin_memcpy(st->partial, h->hdr, HTTP_PARTIAL_LEN);
            st->partial_len = kept + k;
            st->next_seq = m->seq + off - kept;
            st->state = HTTP2_PARTIAL;
            pos->kept = 1;
        } else {
            pos->state = HTTP_SCAN;
        }
        pos->off = len;
        pos->stop = 1;
        return 0;
    }
    /* A header whole in this segment is read from the window (H2_WINDOW bytes of the segment
     * in s->buf), read anew from here when the header is not inside it. */
    __u32 peeked = 0, rel = 0;
    int fail = 0;
    if (kept) {
        __u64 k = need;
        asm volatile("%0 &= 0xf" : "+r"(k));
        fail = k < 1 || k > H2_FRAME_HEADER ||
               bpf_skb_load_bytes(skb, m->payload_off + off, &h->hdr[kept], k);
    } else {
        if (!h->win_len || off < h->win_off || off + H2_FRAME_HEADER > h->win_off + h->win_len) {
            __u32 size = h->win_far ? H2_WINDOW_NEAR : H2_WINDOW;
            __u64 k = avail > size ? size : avail;
            asm volatile("%0 &= 0x3ff" : "+r"(k));
            h->win_len = 0;
            fail = k < H2_FRAME_HEADER || k > H2_WINDOW ||
                   bpf_skb_load_bytes(skb, m->payload_off + off, s->buf, k);
            if (!fail) {
                h->win_off = off;
                h->win_len = k;
            }
        }
        rel = (off - h->win_off) & (H2_WINDOW - 1);
        peeked = h->win_off + h->win_len - (off + H2_FRAME_HEADER);
        if (rel + H2_FRAME_HEADER > H2_WINDOW)
            fail = 1;
    }
    if (fail) {
        pos->state = HTTP_SCAN;
        pos->stop = 1;
        return 0;
    }
    struct h2_frame_hdr f;
    h2_parse_hdr(kept ? h->hdr : &s->buf[rel], &f);
    if (!h2_plausible(&f, 0)) {
        /* Not a frame where one was due: the framing is lost. */
        pos->state = HTTP_SCAN;
        pos->unframed = 1;
        pos->stop = 1;
        return 0;
    }
    __u32 pay = off + need;
    h->win_far = f.len >= H2_WINDOW;
    pos->off = pay + f.len;
    pos->state = HTTP2_FRAME;
    if (f.type == H2_HEADERS || f.type == H2_PUSH_PROMISE || f.type == H2_CONTINUATION)
        h2_header_frame(skb, s, t, pay, f.len, f.type, f.flags, f.stream, rel + H2_FRAME_HEADER,
                        peeked);
    else if ((f.type == H2_DATA && f.flags & H2_END_STREAM) || f.type == H2_RST_STREAM)
        h2_stream_end(skb, s, t, f.stream, f.type == H2_RST_STREAM);
    if (pos->off >= len)
        pos->stop = 1;
    return 0;
}

/*
 * h2_segment - the HTTP/2 stage of a segment: every frame whose header starts in it, from the
 * position on, in order (see h2_frame), up to H2_SEGMENT_FRAMES; after a frame that carries a
 * header block, the block is read (h2_block) and a HEADERS block decided (h2_decide), one after
 * the other rather than nested, so that their stacks do not add up. A global function: verified
 * once (its loop of calls with it).
 * @return 1 when a block marked the flow.
 */
__noinline int h2_segment(struct __sk_buff *skb, struct http_scratch *s, struct flow_cache_slot *fs,
                          struct flow_timing *t, struct counters *cnt)
{
    if (!skb || !s || !t || !cnt)
        return 0;
    struct http_pos *pos = &s->pos;
    __u32 len = s->meta.payload_len;
    /* The connection's table state: one lookup for the segment's blocks. */
    struct h2_conn *c = NULL;

    pos->stop = 0;
    s->h2.win_len = 0;
    s->h2.win_far = 0;
    s->h2.open_stream = 0;
    for (int i = 0; i < H2_SEGMENT_FRAMES; i++) {
        if (pos->stop || pos->off >= len || pos->state < HTTP2_FRAME)
            break;
        s->h2.ready = H2_READY_NONE;
        h2_frame(skb, s, t);
        if (s->h2.ready == H2_READY_BLOCK) {
            if (!c)
                c = h2_conn_get(&s->meta.key, 1);
            h2_block(s, c);
        }
        if (s->h2.ready != H2_READY_DECIDE)
            continue;
        s->h2.rule_status = 0;
        s->h2.rule_grpc = 0;
        h2_decide(skb, s, fs, t);
        if (s->h2.rule_status && !pos->triggered)
            pos->triggered = h2_rule(skb, s, t, s->h2.rule_status, TRIGGER_STATUS);
        if (s->h2.rule_grpc && !pos->triggered)
            pos->triggered = h2_rule(skb, s, t, s->h2.rule_grpc, TRIGGER_GRPC);
    }
    if (pos->state >= HTTP2_FRAME && !pos->stop && pos->off < len) {
        /* More frames than one segment's look: the framing is lost here. */
        pos->state = HTTP_SCAN;
        pos->unframed = 1;
    }
    if (pos->unframed)
        h2_lost(&s->meta, cnt);
    return pos->triggered;
}

/*
 * h2_stage - the HTTP/2 program's work on one segment of s->meta's direction: its frames from
 * the position on (h2_segment), then where the stream stands (stream.h). The position comes
 * from the HTTP/1 program when it found HTTP/2 starting in this segment (pos.handed), else from
 * the direction's state. Inlined into the HTTP/2 program, its one caller.
 * @return PROG_HTTP1 when the direction is no longer in HTTP/2 frames (its state says so: the
 * position is handed to the HTTP/1 program, which looks for a message or a frame again), else
 * NEXT_FINISH.
 */
static __always_inline int h2_stage(struct __sk_buff *skb, struct http_scratch *s,
                                    struct flow_cache_slot *fs, struct counters *cnt)
{
    if (!skb || !s || !cnt)
        return NEXT_FINISH;
    struct pkt_meta *m = &s->meta;
    struct http_pos *pos = &s->pos;
    struct flow_timing *t = timing_find(fs, &m->key);

    if (!stream_enter(s, t))
        return NEXT_FINISH;
    if (pos->state < HTTP2_FRAME) {
        /* The direction's state says HTTP/1 (or lost): never so when handed on. */
        pos->handed = 1;
        return PROG_HTTP1;
    }
    if (t)
        h2_segment(skb, s, fs, t, cnt);
    stream_end(s, fs, t);
    return NEXT_FINISH;
}

#endif /* MIRROR_H2_H */
