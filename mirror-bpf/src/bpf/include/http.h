/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains HTTP/1.x in a TCP stream: where each message of a direction starts, and
 * what it is. A message is a status line ("HTTP/1.0 " or "HTTP/1.1 " and three digits) or a
 * request line (a known method token and a space). Its header block is searched (up to
 * HTTP_SCAN_MAX bytes, within the segment) for its end, Content-Length and Transfer-Encoding:
 * chunked; from these the TCP sequence number of the next message is known (after a body of
 * Content-Length bytes, after the last chunk, at once after a 1xx, 204, 304 or an answer to
 * HEAD; never for a body that runs until the connection closes). So a message is found
 * wherever it starts: after another in the same segment (pipelining), after 1xx interim
 * responses, or split across segments (its first bytes are kept); and body bytes are never
 * taken for a message, whatever they contain. Where the framing cannot be followed (a header
 * block longer than the scan or its segment, a gap), the direction falls back to looking at
 * segment starts until a message is found there again (counted as STAT_HTTP_UNFRAMED).
 * Payloads are read with bpf_skb_load_bytes(), so non-linear skbs work.
 */
#ifndef MIRROR_HTTP_H
#define MIRROR_HTTP_H

#include "maps.h"
#include "parse.h"
#include "method.h"
#include "timing.h"
#include "decide.h"
#include "scope.h"
#include "noresponse.h"
#include "replay.h"
#include "h2.h"
#include "stream.h"
#include "dispatch.h"

/* Bytes read to classify the start of a message; the shortest status line "HTTP/1.1 200" has 12. */
#define HTTP_PEEK_LEN 16
#define HTTP_STATUS_LINE_MIN 12
/* http_chunk(): the size line ended the body (bit set on the returned length). */
#define HTTP_CHUNK_LAST 0x80000000U
/* The content type of a TLS handshake record, its first byte. */
#define TLS_HANDSHAKE 0x16

enum http_kind {
    HTTP_NONE = 0,
    HTTP_REQUEST,
    HTTP_RESPONSE,
    HTTP_MAYBE, /* too short to tell, and could start a message: kept for the next segment */
};

/* OR-ed into a word of ASCII: letters become lower case; '-', ':' and ' ' stay what they are. */
#define HTTP_LOWER8 0x2020202020202020ULL

static __always_inline int is_digit(__u8 ch)
{
    return ch >= '0' && ch <= '9';
}

/*
 * http_status - parse a status line in @p.
 * @len: valid bytes in @p (at least HTTP_STATUS_LINE_MIN).
 * @return the status (100..599), or 0 when @p is not a status line.
 */
static __always_inline __u16 http_status(const __u8 *p, __u32 len)
{
    if (*(__u32 *)p != HTTP_WORD('H', 'T', 'T', 'P') || p[4] != '/' || p[5] != '1' || p[6] != '.' ||
        (p[7] != '0' && p[7] != '1') || p[8] != ' ')
        return 0;
    if (!is_digit(p[9]) || !is_digit(p[10]) || !is_digit(p[11]))
        return 0;
    /* The code must end there: "HTTP/1.1 5000" is not a status line. */
    if (len > 12 && p[12] != ' ' && p[12] != '\r')
        return 0;
    __u16 status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    return status >= 100 && status < HTTP_STATUS_SLOTS ? status : 0;
}

/*
 * http_is_request - does @p start with a request method followed by a space?
 * @return the length of "METHOD " (0 when not a request).
 */
static __always_inline __u32 http_is_request(const __u8 *p)
{
    __u32 len = 0;

    return http_method(p, &len) ? len : 0;
}

/*
 * http_prefix - could the @n bytes of @p (fewer than a status line needs) begin a status line
 * ("HTTP/1.x NNN") or a request line (upper-case letters of a method)?
 */
static __always_inline int http_prefix(const __u8 *p, __u32 n)
{
    int status = 1, method = 1;

#pragma unroll
    for (__u32 i = 0; i < HTTP_STATUS_LINE_MIN; i++) {
        if (i >= n)
            break;
        __u8 c = p[i];
        __u8 want = i < 7 ? "HTTP/1."[i] : 0;
        if (i < 7 && c != want)
            status = 0;
        if (i == 7 && c != '0' && c != '1')
            status = 0;
        if (i == 8 && c != ' ')
            status = 0;
        if (i > 8 && !is_digit(c))
            status = 0;
        if (c < 'A' || c > 'Z')
            method = 0;
    }
    return n && (status || method);
}

/* http_kind - what the @n bytes in @p begin; @status is set for a response. */
static __always_inline int http_kind(const __u8 *p, __u32 n, __u16 *status)
{
    if (n >= HTTP_STATUS_LINE_MIN) {
        *status = http_status(p, n);
        if (*status)
            return HTTP_RESPONSE;
    }
    __u32 l = http_is_request(p);
    if (l && l < n)
        return HTTP_REQUEST;
    if (n <= HTTP_STATUS_LINE_MIN && http_prefix(p, n))
        return HTTP_MAYBE;
    return HTTP_NONE;
}

/*
 * http_line - the header line at @ls of @s->buf (@n bytes valid): is it the blank line that
 * ends the block? Else note Content-Length and Transfer-Encoding: chunked in @f.
 * A global function: verified once.
 * @return 1 at the blank line (f->hdr_len set).
 */
__noinline int http_line(struct http_scratch *s, __u32 ls, __u32 n, struct http_framing *f)
{
    if (!s || !f || ls >= HTTP_SCAN_MAX)
        return 0;
    __u8 *p = &s->buf[ls];

    if (ls < n && p[0] == '\n') {
        f->hdr_len = ls + 1;
        return 1;
    }
    if (ls + 1 < n && p[0] == '\r' && p[1] == '\n') {
        f->hdr_len = ls + 2;
        return 1;
    }
    if (ls + 16 > n)
        return 0;
    __u64 w0 = *(__u64 *)p | HTTP_LOWER8;
    __u64 w1 = *(__u64 *)(p + 8) | HTTP_LOWER8;
    if (w0 == HTTP_WORD8('c', 'o', 'n', 't', 'e', 'n', 't', '-') &&
        (w1 & 0x00FFFFFFFFFFFFFFULL) == HTTP_WORD8('l', 'e', 'n', 'g', 't', 'h', ':', 0)) {
        __u32 v = 0, digits = 0;
        for (__u32 i = 15; i < 40; i++) {
            if (ls + i >= n)
                break;
            __u8 c = p[i];
            if ((c == ' ' || c == '\t') && !digits)
                continue;
            if (!is_digit(c))
                break;
            if (++digits > 9) {
                f->unframed = 1;
                return 0;
            }
            v = v * 10 + (c - '0');
        }
        if (digits) {
            f->has_length = 1;
            f->content_length = v;
        }
        return 0;
    }
    if (w0 == HTTP_WORD8('t', 'r', 'a', 'n', 's', 'f', 'e', 'r') &&
        w1 == HTTP_WORD8('-', 'e', 'n', 'c', 'o', 'd', 'i', 'n')) {
        if (ls + 27 > n || (p[16] | 0x20) != 'g' || p[17] != ':')
            return 0;
        __u32 i = 18;
        if (p[i] == ' ')
            i++;
        /* 7 bytes of "chunked", read as 8 with the byte after it masked off. */
        __u64 v = *(__u64 *)(p + i) | HTTP_LOWER8;
        if (ls + i + 7 <= n &&
            (v & 0x00FFFFFFFFFFFFFFULL) == HTTP_WORD8('c', 'h', 'u', 'n', 'k', 'e', 'd', 0))
            f->chunked = 1;
    }
    return 0;
}

/*
 * http_load - the bytes of a message in this segment, from @at (frame offset), @avail of them,
 * up to HTTP_SCAN_MAX, into s->buf: one read serves its first line, its header block and the
 * head of a request.
 * @return the bytes read (0: none).
 */
static __always_inline __u32 http_load(struct __sk_buff *skb, struct http_scratch *s, __u32 at,
                                       __u32 avail)
{
    __u64 n = avail > HTTP_SCAN_MAX ? HTTP_SCAN_MAX : avail;

    /* A no-op the compiler cannot drop: it bounds the register for the verifier. */
    asm volatile("%0 &= 0x3ff" : "+r"(n));
    if (n < 1 || bpf_skb_load_bytes(skb, at, s->buf, n))
        return 0;
    return n;
}

/*
 * http_headers - search the header block of a message whose first @n bytes in this segment are
 * in s->buf (see http_load) for its end and framing. A global function: verified once.
 * @return 1 when the end of the block was found (f->hdr_len, from the start of s->buf).
 */
/* The top bit of each zero byte of @v (exact for the lowest; a 0x01 byte above a zero byte may
 * be marked too: every mark is checked byte by byte after). */
#define HTTP_ZERO_BYTES(v) (((v)-0x0101010101010101ULL) & ~(v)&0x8080808080808080ULL)
#define HTTP_BYTES(c) (0x0101010101010101ULL * (__u8)(c))

__noinline int http_headers(struct http_scratch *s, __u32 n, struct http_framing *f)
{
    if (!s || !f || n < 2)
        return 0;
    /* Whole aligned words: one load each (a u8 pointer would make the compiler read bytes). */
    const __u64 *words = __builtin_assume_aligned(s->buf, 8);
    __u8 *buf = __builtin_assume_aligned(s->buf, 8);

    for (__u32 w = 0; w < HTTP_SCAN_MAX / 8; w++) {
        if (w * 8 >= n)
            break;
        /* Only the newlines are found word by word (most words of a header block hold none);
         * the line after each is looked at only where it can matter: the blank line,
         * Content-Length and Transfer-Encoding. (Filtering the newlines by the byte after
         * them within the word pass, as before, cost more than it spared: a nginx answer's
         * header block took 470 ns instead of 560 under test_run.) */
        __u64 hits = HTTP_ZERO_BYTES(words[w] ^ HTTP_BYTES('\n'));
        for (__u32 k = 0; k < 8 && hits; k++) {
            /* The lowest mark is bit 8b+7 for byte b: multiplying 1 << 8b by the bytes
             * 7, 6 ... 0 brings b to the top byte. */
            __u32 b = (((hits & -hits) >> 7) * 0x0001020304050607ULL) >> 56;
            hits &= hits - 1;
            __u32 pos = (w * 8 + b) & (HTTP_SCAN_MAX - 1);
            if (pos >= n)
                break;
            if (buf[pos] != '\n')
                continue;
            /* The line at ls: blank, "Content-Length" ('-' then 'L' at 7 and 8) or
             * "Transfer-Encoding" ('-' at 8); http_line tells for sure. */
            __u32 ls = pos + 1;
            __u8 r = buf[ls], c = r | 0x20;
            if (r == '\r' || r == '\n' ||
                (c == 'c' && buf[ls + 7] == '-' && (buf[ls + 8] | 0x20) == 'l') ||
                (c == 't' && buf[ls + 8] == '-')) {
                if (http_line(s, ls, n, f))
                    return 1;
            }
        }
    }
    return 0;
}

/*
 * http_chunk - the chunk-size line of a chunked body at @at (frame offset), @avail bytes of
 * the segment from there. A global function.
 * @return the bytes from @at to the next chunk-size line, HTTP_CHUNK_LAST at the last chunk
 * (size 0), 0 when it cannot tell (a line split across segments, a malformed line).
 */
__noinline __u32 http_chunk(struct __sk_buff *skb, __u32 at, __u32 avail)
{
    __u8 p[HTTP_PEEK_LEN] = {};
    __u32 n = avail > HTTP_PEEK_LEN ? HTTP_PEEK_LEN : avail;

    if (!skb || n < 3 || bpf_skb_load_bytes(skb, at, p, n))
        return 0;
    __u32 size = 0, i = 0;
    for (; i < 8; i++) {
        __u8 c = p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
            d = (c | 0x20) - 'a' + 10;
        else
            break;
        size = size << 4 | d;
    }
    if (!i || size > 0x7fff0000)
        return 0;
    /* Chunk extensions (";name=value") up to the line's end. */
    for (; i < HTTP_PEEK_LEN - 1; i++)
        if (p[i] == '\r')
            break;
    if (i + 1 >= n || p[i] != '\r' || p[i + 1] != '\n')
        return 0;
    __u32 line = i + 2;
    /* The last chunk: trailers, if any, and the blank line follow (see http_message). */
    return size ? line + size + 2 : HTTP_CHUNK_LAST;
}

/* Answers with no body whatever their headers say. */
static __always_inline int http_no_body(__u16 status, const struct http_request *req)
{
    return status < 200 || status == 204 || status == 304 ||
           (req->head_len >= 5 && *(__u32 *)req->head == HTTP_WORD('H', 'E', 'A', 'D') &&
            req->head[4] == ' ');
}

/*
 * http_message - the message (or chunk-size line) at s->pos.off of the segment of s->meta:
 * classify it, queue a request, time a response and match it against the rules, then move
 * the position past it according to its framing. A global function: verified once.
 * @s: this CPU's scratch area (the packet, the position, the buffers).
 * @t: the flow's shared entry (NULL: none yet; created for a message, see pos->created).
 * @cnt: this CPU's counters.
 */
__noinline int http_message(struct __sk_buff *skb, struct http_scratch *s,
                            struct flow_cache_slot *fs, struct flow_timing *t, struct counters *cnt)
{
    if (!skb || !s || !cnt)
        return 0;
    struct pkt_meta *m = &s->meta;
    struct http_pos *pos = &s->pos;
    __u32 len = m->payload_len, dir = m->dir & 1;
    if (pos->off >= len) {
        pos->stop = 1;
        return 0;
    }
    __u32 at = m->payload_off + pos->off, avail = len - pos->off;
    if (pos->state == HTTP_CHUNK) {
        __u32 r = http_chunk(skb, at, avail);
        struct http_framing *trailers = &s->framing;
        __builtin_memset(trailers, 0, sizeof(*trailers));
        /* After the last chunk, its trailers end like a header block: at a blank line. */
        if (r == HTTP_CHUNK_LAST && http_headers(s, http_load(skb, s, at, avail), trailers)) {
            pos->off += trailers->hdr_len;
            pos->state = HTTP_AT;
            return 0;
        }
        if (!r || r == HTTP_CHUNK_LAST) {
            pos->unframed = 1;
            pos->state = HTTP_SCAN;
            pos->stop = 1;
            return 0;
        }
        pos->off += r;
        return 0;
    }
    /* Where no message is known to start (a stream not yet followed, or lost), most segments
     * start none (bulk data): their first bytes are enough to tell, and the header block is
     * read only for a message. Where the framing says one starts, it is read at once. */
    __u32 first = avail;
    if ((pos->state == HTTP_SCAN || pos->state == HTTP_ANSWERED) && !pos->partial &&
        avail > HTTP_PARTIAL_LEN)
        first = HTTP_PARTIAL_LEN;
    __u32 loaded = http_load(skb, s, at, first);
    /* The first line, after the bytes kept from earlier segments when it continues them. */
    struct http_stream *kept = pos->partial && t ? &t->stream[dir] : NULL;
    __u32 kept_len = 0;
    if (kept) {
        kept_len = kept->partial_len & (HTTP_PARTIAL_LEN - 1);
        __builtin_memcpy(__builtin_assume_aligned(s->peek, 8),
                         __builtin_assume_aligned(kept->partial, 8), HTTP_PARTIAL_LEN);
        __builtin_memcpy(s->peek + kept_len, s->buf, HTTP_PARTIAL_LEN);
    } else {
        __builtin_memcpy(__builtin_assume_aligned(s->peek, 8), __builtin_assume_aligned(s->buf, 8),
                         HTTP_PARTIAL_LEN);
    }
    __u32 n = kept_len + loaded;
    __u16 status = 0;
    int kind = http_kind(__builtin_assume_aligned(s->peek, 8), n, &status);
    pos->partial = 0;
    pos->stop = 1;
    /* Only a response (a request is pending: see http_segment) starts here; else body. */
    if (pos->state == HTTP_ANSWERED && kind != HTTP_RESPONSE && kind != HTTP_MAYBE)
        return 0;
    if (kind == HTTP_MAYBE && n == kept_len + avail) {
        /* The segment ends inside what could be the first line: keep its bytes. */
        if (!t) {
            t = timing_get(fs, &m->key, 1, cnt);
            pos->created = 1;
        }
        if (t) {
            struct http_stream *st = &t->stream[dir];
            __builtin_memcpy(st->partial, s->peek, HTTP_PARTIAL_LEN);
            st->partial_len = n;
            st->next_seq = m->seq + pos->off - kept_len;
            st->state = HTTP_PARTIAL;
            pos->kept = 1;
        }
        return 0;
    }
    if (kind == HTTP_NONE && pos->state == HTTP_SCAN && !pos->off && !kept && n >= 3 &&
        s->peek[0] == TLS_HANDSHAKE && s->peek[1] == 3 && s->peek[2] <= 4) {
        /* A TLS handshake record (ClientHello, ServerHello) opens the direction: encrypted
         * from here on, never followed (stream_classify). */
        pos->tls = 1;
        return 0;
    }
    if (kind == HTTP_NONE && protocol_on(PROG_HTTP2)) {
        /* HTTP/2: its preface or first SETTINGS where a message was due, or frames again at a
         * segment's start where no message is known (a connection followed late, or lost). */
        int skip = h2_begins(__builtin_assume_aligned(s->peek, 8), n);
        if (skip < 0 && pos->state == HTTP_SCAN && !pos->off && !kept &&
            ((fs && fs->http_kind[dir] == HTTP_DIR_UNKNOWN) || (t && t->h2 & (1 << dir))) &&
            h2_resync(skb, s, 0))
            skip = 0;
        if (skip >= 0) {
            if (!t) {
                t = timing_get(fs, &m->key, 1, cnt);
                pos->created = 1;
            }
            if (t)
                h2_start(s, t, pos->off + skip, cnt);
            return 0;
        }
    }
    if (kind != HTTP_REQUEST && kind != HTTP_RESPONSE) {
        /* Not a message where one was due: the framing was lost. */
        if (pos->state != HTTP_SCAN)
            pos->unframed = 1;
        pos->state = HTTP_SCAN;
        return 0;
    }
    pos->seen = 1;
    if (!t) {
        t = timing_get(fs, &m->key, 1, cnt);
        pos->created = 1;
    }
    if (MIRROR_PROFILE_STOP == PROFILE_STOP_SEGMENT) {
        pos->stop = 1;
        return 0;
    }

    /* The answer to the only request pending under this key (across NAT the requests are
     * under the other key, and responses framed), on a connection that never had more
     * requests pending than the queue holds: the next response can start only after a next
     * request, so its framing need not be followed, and its header block (most of the cost
     * of a response) is not read. */
    pos->answered = kind == HTTP_RESPONSE && status >= 200 && t && !t->deep && !t->req_gap &&
                    t->req_head + 1 == t->req_tail;
    /* In the scratch area: this frame is on the deepest call chain (to a trigger). */
    struct http_framing *f = &s->framing;
    __builtin_memset(f, 0, sizeof(*f));
    int found = 0;
    if (!pos->answered) {
        if (first < avail)
            loaded = http_load(skb, s, at, avail);
        found = http_headers(s, loaded, f);
    }
    __u32 body = f->has_length ? f->content_length : 0;
    int chunked = f->chunked, close = 0;
    if (kind == HTTP_REQUEST) {
        cnt->v[STAT_HTTP_REQUESTS]++;
        if (t) {
            __u32 zero = 0;
            struct settings *set = bpf_map_lookup_elem(&settings, &zero);
            /* Kept before it is queued: the queue says whether it shares the flow's slot. */
            __u32 kept = replay_keep(skb, s, t, pos->off, loaded);
            timing_request(t, s, avail, m->now, set, kept);
            t->req_ifindex = skb->ifindex;
            t->req_hook = pos->hook;
            if (set && (set->kinds & (1 << TRIGGER_NORESPONSE)))
                noresponse_arm(fs, &m->key);
        }
    } else {
        cnt->v[STAT_HTTP_RESPONSES]++;
        __u64 took = 0;
        struct http_request *src = NULL;
        struct flow_timing *owner = NULL;
        __u32 state = REQUEST_NONE;
        s->req.head_len = 0;
        /* A 1xx is interim: the request is still awaiting its final answer. */
        if (status >= 200 && t)
            took = timing_response(skb, s, fs, t, status, &src, &owner, &state);
        if (state == REQUEST_NOT_KEPT)
            cnt->v[STAT_REQUEST_NOT_KEPT]++;
        __u32 done = src ? src->number + 1 : 0;
        if (!pos->triggered)
            pos->triggered = decide_response(skb, s, t, status, took, src, owner, state);
        /* Handled: its kept segment is free for the next request to take over (replay_keep). */
        if (done && owner)
            owner->req_done = done;
        if (http_no_body(status, &s->req)) {
            body = 0;
            chunked = 0;
        } else if (!chunked && !f->has_length) {
            close = 1; /* the body runs until the connection closes */
        }
    }
    if (pos->answered) {
        pos->state = HTTP_ANSWERED;
        return 0;
    }
    if (!found || f->unframed || !t) {
        pos->unframed = 1;
        pos->state = HTTP_SCAN;
        return 0;
    }
    pos->off += f->hdr_len;
    if (close) {
        pos->state = HTTP_CLOSE;
        return 0;
    }
    pos->stop = 0;
    if (chunked) {
        pos->state = HTTP_CHUNK;
        return 0;
    }
    pos->off += body;
    pos->state = HTTP_AT;
    return 0;
}

/*
 * http1_stage - the HTTP/1 program's work on one segment of s->meta's direction: every message
 * (or chunk-size line) that starts in it, in order (see http_message), then where the next one
 * starts (stream.h). Inlined into the HTTP/1 program, its one caller.
 * @return PROG_HTTP2 when the rest of the segment is HTTP/2 frames (the position is handed to
 * the HTTP/2 program in s->pos), else NEXT_FINISH (the segment is done).
 */
static __always_inline int http1_stage(struct __sk_buff *skb, struct http_scratch *s,
                                       struct flow_cache_slot *fs, struct counters *cnt)
{
    if (!skb || !s || !cnt)
        return NEXT_FINISH;
    struct pkt_meta *m = &s->meta;
    struct http_pos *pos = &s->pos;
    struct flow_timing *t = timing_find(fs, &m->key);
    __u32 len = m->payload_len;

    /* Handed on by the HTTP/2 program when the direction's frames were lost. */
    if (!stream_enter(s, t))
        return NEXT_FINISH;
    if (pos->was >= HTTP2_FRAME && pos->state == HTTP_SCAN) {
        /* A gap in HTTP/2 frames: looked at again from here as any stream is. */
        h2_lost(m, cnt);
        pos->unframed = 0;
    } else if (pos->state >= HTTP2_FRAME) {
        pos->handed = 1;
        return PROG_HTTP2;
    }
    for (int i = 0; i < HTTP_SEGMENT_MSGS && !pos->stop && pos->off < len; i++)
        http_message(skb, s, fs, t, cnt);
    if (pos->state >= HTTP2_FRAME) {
        /* HTTP/2 from here on (its preface, or the frames after an h2c upgrade). */
        pos->handed = 1;
        return PROG_HTTP2;
    }
    if (pos->off >= len)
        pos->stop = 1;
    /* Messages left unread in this segment: the framing is lost. */
    if (!pos->stop && pos->off < len && pos->state != HTTP_SCAN) {
        pos->unframed = 1;
        pos->state = HTTP_SCAN;
    }
    if (pos->unframed)
        cnt->v[STAT_HTTP_UNFRAMED]++;
    stream_end(s, fs, t);
    return NEXT_FINISH;
}

#endif /* MIRROR_HTTP_H */
