/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the table of HTTP/2 streams awaiting their answers (h2_decide.h): a
 * request's stream kept under the key it was seen with, found again by its response, its
 * trailers and its end. A set-associative array, not a hash map: a stream's bucket is a hash of
 * its connection's key and its id, its H2_STREAM_WAYS ways are looked at in place (inlined array
 * lookups), and opening or freeing one is a write, not an insert or a delete (an LRU hash insert
 * and delete cost 140 and 70 ns per stream here, a lock each). A request finding its bucket full
 * takes the way of the oldest request there, whose answer then finds no stream (counted, as a
 * stream missed), never another's.
 *
 * Ways are written by the CPUs that see requests and read by those that see answers: each has a
 * sequence count (a sequence lock). A writer makes it odd by compare-and-exchange (a way another
 * CPU is writing is left to it: the stream is not kept), writes, and makes it even again; a
 * reader copies what it needs, then checks that the count has not moved (h2_stream_stable), so
 * that a way overwritten meanwhile is read as no stream, not as another's.
 */
#ifndef MIRROR_H2_STREAMS_H
#define MIRROR_H2_STREAMS_H

#include "maps.h"
#include "parse.h"
#include "flow_cache.h"

_Static_assert((H2_STREAM_BUCKETS & (H2_STREAM_BUCKETS - 1)) == 0, "a power of two");
_Static_assert(sizeof(struct h2_way_head) * H2_STREAM_WAYS == 64, "a bucket's heads: one line");
_Static_assert(sizeof(struct h2_stream_bucket) % 64 == 0, "buckets: whole lines");

/* h2_stream_bucket_of - the bucket of stream @k (NULL only if the map is smaller). */
static __always_inline struct h2_stream_bucket *h2_stream_bucket_of(const struct h2_stream_key *k)
{
    __u64 h = flow_key_mix(&k->key, (__u64)k->stream << 32 | k->stream);
    __u32 idx = (__u32)(h >> 32) & (H2_STREAM_BUCKETS - 1);

    return bpf_map_lookup_elem(&h2_streams, &idx);
}

/* h2_way_seq - the sequence count of @h, read once, before (or after) what it guards. */
static __always_inline __u32 h2_way_seq(const struct h2_way_head *h)
{
    __u32 seq = *(const volatile __u32 *)&h->seq;

    asm volatile("" ::: "memory");
    return seq;
}

/*
 * h2_stream_find - the way of bucket @b holding stream @k: its number in @way, its sequence
 * count then in @seq.
 * @return 1 when found, 0 when no way holds it (or the one that does is being written).
 */
static __always_inline int h2_stream_find(struct h2_stream_bucket *b, const struct h2_stream_key *k,
                                          __u32 *way, __u32 *seq)
{
    if (!b || !k->stream)
        return 0;
#pragma unroll
    for (__u32 w = 0; w < H2_STREAM_WAYS; w++) {
        __u32 q = h2_way_seq(&b->head[w]);
        if (!(q & 1) && b->head[w].stream == k->stream && flow_key_eq(&b->way[w].key, &k->key)) {
            *way = w;
            *seq = q;
            return 1;
        }
    }
    return 0;
}

/* h2_stream_stable - was way @way of @b left as it was since its count read @seq
 * (h2_stream_find)? Asked after reading it: when not, what was read may be half another
 * stream's. */
static __always_inline int h2_stream_stable(const struct h2_stream_bucket *b, __u32 way, __u32 seq)
{
    asm volatile("" ::: "memory");
    return h2_way_seq(&b->head[way & (H2_STREAM_WAYS - 1)]) == seq;
}

/*
 * h2_stream_open - keep @ns as stream @k's request in its bucket @b: in the way that holds the
 * stream already, else a free one, else the one of the oldest request.
 * @return 0, or -1 when it could not be kept (the way chosen is being written by another CPU).
 */
static __always_inline int h2_stream_open(struct h2_stream_bucket *b, const struct h2_stream_key *k,
                                          const struct h2_stream *ns)
{
    __u32 pick = 0;
    __u64 oldest = ~0ULL;

    if (!b || !k->stream)
        return -1;
#pragma unroll
    for (__u32 w = 0; w < H2_STREAM_WAYS; w++) {
        const struct h2_way_head *h = &b->head[w];
        if (h->stream == k->stream && flow_key_eq(&b->way[w].key, &k->key)) {
            pick = w;
            break;
        }
        /* A free way first (age 0), else the oldest request's. */
        __u64 age = h->stream ? h->ts_ns | 1 : 0;
        if (age < oldest) {
            oldest = age;
            pick = w;
        }
    }
    pick &= H2_STREAM_WAYS - 1;
    struct h2_way_head *h = &b->head[pick];
    __u32 seq = h2_way_seq(h);
    if ((seq & 1) || __sync_val_compare_and_swap(&h->seq, seq, seq + 1) != seq)
        return -1;
    h->stream = k->stream;
    h->ts_ns = ns->req.ts_ns;
    b->way[pick].key = k->key;
    __builtin_memcpy(&b->way[pick].st, ns, sizeof(*ns));
    __sync_fetch_and_add(&h->seq, 1);
    return 0;
}

/* h2_stream_close - free way @way of @b, unless it was written since its count read @seq. */
static __always_inline void h2_stream_close(struct h2_stream_bucket *b, __u32 way, __u32 seq)
{
    struct h2_way_head *h = &b->head[way & (H2_STREAM_WAYS - 1)];

    if (__sync_val_compare_and_swap(&h->seq, seq, seq + 1) != seq)
        return;
    h->stream = 0;
    __sync_fetch_and_add(&h->seq, 1);
}

#endif /* MIRROR_H2_STREAMS_H */
