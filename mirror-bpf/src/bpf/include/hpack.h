/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains HPACK (RFC 7541), the header compression of HTTP/2, as far as the
 * classifier reads it: the fields of a header block, one at a time, for the few it needs
 * (:status and grpc-status of a response, :method, :path and :authority of a request), and the
 * insertions into the dynamic table every block makes, so that a later block's reference to an
 * entry resolves to what it named.
 *
 * A reference names an entry by its age (62 is the latest insertion), so counting insertions
 * is enough to resolve it: evictions need not be followed, since a peer never names an entry it
 * evicted. Each direction (struct h2_dir) remembers the name of each of its latest
 * H2_TABLE_RING insertions and the values of its latest H2_TABLE_ENTRIES entries of interest.
 * Where a connection was not followed from its start, or a block was lost, the insertions
 * before are unknown: a reference to one is counted (STAT_H2_UNRESOLVED), never guessed.
 * Strings are read raw or Huffman-coded (hpack_huffman.h), values of interest up to H2_TEXT
 * bytes.
 */
#ifndef MIRROR_HPACK_H
#define MIRROR_HPACK_H

#include "maps.h"
#include "method.h"
#include "hpack_huffman.h"

/* Where a block's bytes are: http_scratch.buf, read within its first HTTP_SCAN_MAX bytes. */
#define HPACK_AT(x) ((x) & (HTTP_SCAN_MAX - 1))

/* The static table's entries that carry a :status value (indices 8-14). */
#define HPACK_STATIC_STATUS_FIRST 8
#define HPACK_STATIC_STATUS_LAST 14
/* The first dynamic table index. */
#define HPACK_DYNAMIC_FIRST 62

/*
 * hpack_int - the integer of @prefix bits at @at of @buf (the block ends at @end), RFC 7541
 * 5.1; @at is moved past it. Values above 2^28 are taken as malformed.
 * @return 0, or -1 when it runs past @end or is too large.
 */
static __always_inline int hpack_int(const __u8 *buf, __u32 *at, __u32 end, __u32 prefix,
                                     __u32 *out)
{
    __u32 p = *at, mask = (1U << prefix) - 1;

    if (p >= end)
        return -1;
    __u32 v = buf[HPACK_AT(p)] & mask;
    p++;
    if (v == mask) {
        int done = 0;
        for (__u32 i = 0; i < 4; i++) {
            if (p >= end)
                return -1;
            __u8 b = buf[HPACK_AT(p)];
            p++;
            v += (__u32)(b & 0x7f) << (7 * i);
            if (!(b & 0x80)) {
                done = 1;
                break;
            }
        }
        if (!done)
            return -1;
    }
    *at = p;
    *out = v;
    return 0;
}

/*
 * hpack_literal_name - the field of interest the literal name of @len bytes at @p names, raw
 * or Huffman-coded (@huff); H2_FIELD_NONE for any other. Compared a word at a time: the block's
 * buffer has slack past its bytes.
 */
static __always_inline __u32 hpack_literal_name(const __u8 *p, __u32 len, __u32 huff)
{
    __u64 w = *(const __u64 *)p;
    __u64 w5 = w & 0xffffffffffULL, w7 = w & 0xffffffffffffffULL;

    if (!huff) {
        if (len == 5 && w5 == HTTP_WORD8(':', 'p', 'a', 't', 'h', 0, 0, 0))
            return H2_FIELD_PATH;
        if (len == 7 && w7 == HTTP_WORD8(':', 'm', 'e', 't', 'h', 'o', 'd', 0))
            return H2_FIELD_METHOD;
        if (len == 7 && w7 == HTTP_WORD8(':', 's', 't', 'a', 't', 'u', 's', 0))
            return H2_FIELD_STATUS;
        if (len == 10 && w == HTTP_WORD8(':', 'a', 'u', 't', 'h', 'o', 'r', 'i') && p[8] == 't' &&
            p[9] == 'y')
            return H2_FIELD_AUTHORITY;
        if (len == 11 && w == HTTP_WORD8('g', 'r', 'p', 'c', '-', 's', 't', 'a') && p[8] == 't' &&
            p[9] == 'u' && p[10] == 's')
            return H2_FIELD_GRPC_STATUS;
        return H2_FIELD_NONE;
    }
    /* Their Huffman codes (hpack_huffman.h's code), as little-endian words. */
    if (len == 4 && (__u32)w == 0x3fd358b9) /* :path */
        return H2_FIELD_PATH;
    if (len == 5 && w5 == 0xe4395349b9ULL) /* :method */
        return H2_FIELD_METHOD;
    if (len == 5 && w5 == 0xa3368d84b8ULL) /* :status */
        return H2_FIELD_STATUS;
    if (len == 8 && w == 0x7f7d32ec39533bb8ULL) /* :authority */
        return H2_FIELD_AUTHORITY;
    if (len == 8 && w == 0x8fda3412b2c8ca9aULL) /* grpc-status */
        return H2_FIELD_GRPC_STATUS;
    return H2_FIELD_NONE;
}

/* hpack_static_name - the field of interest a static table index names (H2_FIELD_NONE: other). */
static __always_inline __u32 hpack_static_name(__u32 idx)
{
    if (idx == 1)
        return H2_FIELD_AUTHORITY;
    if (idx == 2 || idx == 3)
        return H2_FIELD_METHOD;
    if (idx == 4 || idx == 5)
        return H2_FIELD_PATH;
    if (idx >= HPACK_STATIC_STATUS_FIRST && idx <= HPACK_STATIC_STATUS_LAST)
        return H2_FIELD_STATUS;
    return H2_FIELD_NONE;
}

/*
 * huffman_step - one byte of a Huffman-coded string (bpf_loop callback): its two 4-bit steps
 * through hpack_huffman, the symbols met appended to h2.text (up to H2_TEXT).
 * @return 0 to go on, 1 to stop (malformed, or the text is full).
 */
static long huffman_step(__u64 i, void *ctx)
{
    __u32 zero = 0;
    struct http_scratch *s = bpf_map_lookup_elem(&http_scratch, &zero);

    if (!s)
        return 1;
    struct h2_scratch *h = &s->h2;
    __u8 b = s->buf[HPACK_AT(h->huff_at + i)];
    __u32 state = h->huff_state;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        __u32 bits = half ? b & 0xf : b >> 4;
        __u32 e = hpack_huffman[((state & 0xff) << 4 | bits) & (256 * 16 - 1)];
        if (e & HUFFMAN_FAIL) {
            h->huff_flags = HUFFMAN_FAIL;
            return 1;
        }
        if (e & HUFFMAN_EMIT) {
            __u32 n = h->text_len;
            if (n >= H2_TEXT) {
                h->huff_flags = HUFFMAN_ACCEPT; /* cut at H2_TEXT: what was read stands */
                return 1;
            }
            h->text[n & (H2_TEXT - 1)] = e >> 8;
            h->text_len = n + 1;
        }
        state = e & 0xff;
        h->huff_flags = e & HUFFMAN_ACCEPT;
    }
    h->huff_state = state;
    return 0;
}

/*
 * hpack_string - the string of @len bytes at @at of the block (Huffman-coded when @huffman)
 * into h2.text, its first H2_TEXT characters. Run for the values of the fields of interest only;
 * inlined into hpack_field (the Huffman steps are a bpf_loop callback: one call frame more).
 * @return 0, -1 when it is malformed.
 */
static __always_inline int hpack_string(struct http_scratch *s, __u32 at, __u32 len, __u32 huffman)
{
    if (!s)
        return -1;
    struct h2_scratch *h = &s->h2;

    h->text_len = 0;
    if (!huffman) {
        /* Whole words (the block's buffer has slack past HTTP_SCAN_MAX). */
        const __u8 *src = &s->buf[HPACK_AT(at)];
        __u64 *dst = __builtin_assume_aligned(h->text, 8);
#pragma unroll
        for (int i = 0; i < H2_TEXT / 8; i++)
            dst[i] = *(const __u64 *)(src + 8 * i);
        h->text_len = len < H2_TEXT ? len : H2_TEXT;
        return 0;
    }
    h->huff_at = at;
    h->huff_state = 0;
    h->huff_flags = HUFFMAN_ACCEPT;
    bpf_loop(len < H2_HUFFMAN_IN ? len : H2_HUFFMAN_IN, huffman_step, NULL, 0);
    return h->huff_flags & HUFFMAN_ACCEPT ? 0 : -1;
}

/*
 * hpack_number - h2.text as a decimal number of 1 to @digits digits.
 * @return the number, 0xffff when it is not one.
 */
static __always_inline __u32 hpack_number(const struct h2_scratch *h, __u32 digits)
{
    __u32 n = h->text_len, v = 0;

    if (!n || n > digits)
        return 0xffff;
    for (__u32 i = 0; i < 3; i++) {
        if (i >= n)
            break;
        __u8 c = h->text[i];
        if (c < '0' || c > '9')
            return 0xffff;
        v = v * 10 + (c - '0');
    }
    return v;
}

/*
 * hpack_value - the value of a field of interest, in h2.text: its number (:status,
 * grpc-status; 0xffff when not one) into @code; the text stays in h2.text.
 */
static __always_inline void hpack_value(struct h2_scratch *h, __u32 field, __u16 *code)
{
    *code = 0xffff;
    if (field == H2_FIELD_STATUS)
        *code = hpack_number(h, 3);
    else if (field == H2_FIELD_GRPC_STATUS)
        *code = hpack_number(h, 2);
}

/*
 * hpack_apply - a field of interest of the block, with its value (@code, or the text in h2.text),
 * into what the block says (h2 scratch).
 */
static __always_inline void hpack_apply(struct h2_scratch *h, __u32 field, __u32 code)
{
    const __u8 *text = h->text;
    __u32 len = h->text_len;

    h->fields |= 1U << (field & 7);
    if (len > H2_TEXT)
        len = H2_TEXT;
    switch (field) {
    case H2_FIELD_STATUS:
        if (code >= 100 && code < HTTP_STATUS_SLOTS)
            h->status = code;
        break;
    case H2_FIELD_GRPC_STATUS:
        if (code < GRPC_STATUS_CODES)
            h->grpc_status = code + 1;
        break;
    case H2_FIELD_METHOD:
        __builtin_memcpy(__builtin_assume_aligned(h->method, 8),
                         __builtin_assume_aligned(h->text, 8), sizeof(h->method));
        h->method_len = len < sizeof(h->method) ? len : sizeof(h->method);
        break;
    case H2_FIELD_PATH:
        __builtin_memcpy(__builtin_assume_aligned(h->path, 8), __builtin_assume_aligned(h->text, 8),
                         H2_TEXT);
        h->path_len = len;
        break;
    case H2_FIELD_AUTHORITY: {
        /* Lower case, without the port (an IPv6 literal keeps its brackets). */
        struct host_text *a = &h->stream.authority;
        __u32 n = 0, v6 = text[0] == '[';
        for (__u32 i = 0; i < H2_TEXT; i++) {
            if (i >= len)
                break;
            __u8 c = text[i];
            if (c == ':' && !v6)
                break;
            if (c >= 'A' && c <= 'Z')
                c |= 0x20;
            a->text[i] = c;
            n = i + 1;
            if (c == ']')
                break;
        }
        a->len = n;
        break;
    }
    }
}

/* hpack_static_full - a static table entry named whole (an indexed field) into @h. */
static __always_inline void hpack_static_full(struct h2_scratch *h, __u32 idx)
{
    if (idx >= HPACK_STATIC_STATUS_FIRST && idx <= HPACK_STATIC_STATUS_LAST) {
        /* :status 200, 204, 206, 304, 400, 404, 500 (indices 8-14), three bits a digit pair. */
        __u32 i = idx - HPACK_STATIC_STATUS_FIRST;
        __u32 status = i < 3    ? 200 + (i == 1   ? 4
                                         : i == 2 ? 6
                                                  : 0)
                       : i == 3 ? 304
                       : i < 6  ? 400 + (i == 5 ? 4 : 0)
                                : 500;
        hpack_apply(h, H2_FIELD_STATUS, status);
        return;
    }
    /* 2 GET, 3 POST, 4 "/", 5 "/index.html". */
    __u64 *t = __builtin_assume_aligned(h->text, 8);
    t[1] = 0;
    switch (idx) {
    case 2:
        t[0] = HTTP_WORD('G', 'E', 'T', 0);
        h->text_len = 3;
        hpack_apply(h, H2_FIELD_METHOD, 0);
        break;
    case 3:
        t[0] = HTTP_WORD('P', 'O', 'S', 'T');
        h->text_len = 4;
        hpack_apply(h, H2_FIELD_METHOD, 0);
        break;
    case 4:
        t[0] = '/';
        h->text_len = 1;
        hpack_apply(h, H2_FIELD_PATH, 0);
        break;
    case 5:
        t[0] = HTTP_WORD8('/', 'i', 'n', 'd', 'e', 'x', '.', 'h');
        t[1] = HTTP_WORD('t', 'm', 'l', 0);
        h->text_len = 11;
        hpack_apply(h, H2_FIELD_PATH, 0);
        break;
    }
}

/*
 * hpack_insertion - the insertion number a dynamic index names in @d, when followed.
 * @return 0 and @n set, -1 when it names an insertion not followed (before the table was
 * followed, or beyond what is remembered).
 */
static __always_inline int hpack_insertion(const struct h2_dir *d, __u32 idx, __u32 *n)
{
    __u32 age = idx - HPACK_DYNAMIC_FIRST;

    if (age >= d->inserted || age >= H2_TABLE_RING)
        return -1;
    *n = d->inserted - 1 - age;
    return 0;
}

/* hpack_entry - the remembered value of insertion @n of @d (NULL: pushed out). */
static __always_inline struct h2_entry *hpack_entry(struct h2_dir *d, __u32 n)
{
#pragma unroll
    for (int i = 0; i < H2_TABLE_ENTRIES; i++)
        if (d->ent[i].ins == n + 1)
            return &d->ent[i];
    return NULL;
}

/* hpack_unresolved - a reference to an entry not followed: counted. */
static __always_inline void hpack_unresolved(void)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (cnt)
        cnt->v[STAT_H2_UNRESOLVED]++;
}

/*
 * hpack_insert - the field just read (@field, value in h2.text and @code) is inserted into the
 * dynamic table of @d: its name is remembered, and its value when it is of interest.
 */
static __always_inline void hpack_insert(struct h2_dir *d, const struct h2_scratch *h, __u32 field,
                                         __u16 code)
{
    __u32 n = d->inserted;

    d->kinds[n & (H2_TABLE_RING - 1)] = field;
    if (field != H2_FIELD_NONE) {
        struct h2_entry *e = &d->ent[d->next_entry & (H2_TABLE_ENTRIES - 1)];
        d->next_entry++;
        e->ins = n + 1;
        e->field = field;
        e->code = code;
        e->len = h->text_len;
        __builtin_memcpy(__builtin_assume_aligned(e->text, 8), __builtin_assume_aligned(h->text, 8),
                         H2_TEXT);
    }
    d->inserted = n + 1;
}

/*
 * hpack_field - the header field at h2.at of the block in s->buf (up to h2.end): what it says
 * of a field of interest into s->h2, its insertion into @d's table; h2.at moved past it.
 * Inlined into the field loop's bpf_loop callback (h2.h), verified once with it: a call of its
 * own per field cost more than its body here.
 * @return 0 for a field read, 1 at the block's end, -1 when it is malformed or runs past the
 * bytes read (the table's state is lost then: the caller says so).
 */
static __always_inline int hpack_field(struct http_scratch *s, struct h2_dir *d)
{
    if (!s || !d)
        return -1;
    struct h2_scratch *h = &s->h2;
    const __u8 *buf = s->buf;
    __u32 at = h->at, end = h->end, idx = 0;

    if (end > HTTP_SCAN_MAX)
        return -1;
    if (at >= end)
        return 1;
    __u8 b = buf[HPACK_AT(at)];
    if (b & 0x80) {
        /* Indexed: a whole entry. */
        if (hpack_int(buf, &at, end, 7, &idx) || !idx)
            return -1;
        h->at = at;
        if (idx < HPACK_DYNAMIC_FIRST) {
            hpack_static_full(h, idx);
            return 0;
        }
        __u32 n;
        if (hpack_insertion(d, idx, &n)) {
            hpack_unresolved();
            return 0;
        }
        __u32 field = d->kinds[n & (H2_TABLE_RING - 1)];
        if (field == H2_FIELD_NONE)
            return 0;
        struct h2_entry *e = hpack_entry(d, n);
        if (!e) {
            hpack_unresolved();
            return 0;
        }
        __builtin_memcpy(__builtin_assume_aligned(h->text, 8), __builtin_assume_aligned(e->text, 8),
                         H2_TEXT);
        h->text_len = e->len;
        hpack_apply(h, e->field, e->code);
        return 0;
    }
    if ((b & 0xe0) == 0x20) {
        /* A dynamic table size update: nothing the references depend on. */
        if (hpack_int(buf, &at, end, 5, &idx))
            return -1;
        h->at = at;
        return 0;
    }
    /* A literal: with incremental indexing (01), without (0000) or never indexed (0001). */
    int insert = (b & 0xc0) == 0x40;
    __u32 field = H2_FIELD_NONE, len = 0;
    if (hpack_int(buf, &at, end, insert ? 6 : 4, &idx))
        return -1;
    if (idx) {
        if (idx < HPACK_DYNAMIC_FIRST) {
            field = hpack_static_name(idx);
        } else {
            __u32 n;
            if (hpack_insertion(d, idx, &n))
                hpack_unresolved();
            else
                field = d->kinds[n & (H2_TABLE_RING - 1)];
        }
    } else {
        /* A literal name (some encoders name even the pseudo-headers so). */
        if (at >= end)
            return -1;
        __u32 huff = buf[HPACK_AT(at)] & 0x80;
        if (hpack_int(buf, &at, end, 7, &len) || len > end - at)
            return -1;
        field = hpack_literal_name(&buf[HPACK_AT(at)], len, huff);
        at += len;
    }
    /* The value. */
    if (at >= end)
        return -1;
    __u32 huff = buf[HPACK_AT(at)] & 0x80;
    if (hpack_int(buf, &at, end, 7, &len) || len > end - at)
        return -1;
    __u16 code = 0xffff;
    if (field != H2_FIELD_NONE) {
        if (hpack_string(s, at, len, huff))
            return -1;
        hpack_value(h, field, &code);
        hpack_apply(h, field, code);
    }
    if (insert)
        hpack_insert(d, h, field, code);
    h->at = at + len;
    return 0;
}

/*
 * hpack_lost - the table state of @d is lost (a block not read whole): every insertion before
 * is forgotten; references to them are counted from now on, never guessed.
 */
static __always_inline void hpack_lost(struct h2_dir *d)
{
    d->inserted = 0;
    d->next_entry = 0;
#pragma unroll
    for (int i = 0; i < H2_TABLE_ENTRIES; i++)
        d->ent[i].ins = 0;
}

#endif /* MIRROR_HPACK_H */
