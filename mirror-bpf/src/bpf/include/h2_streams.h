/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the table of HTTP/2 streams awaiting their answers (h2_decide.h): a
 * request's stream kept under the key it was seen with, found again by its response, its
 * trailers and its end. A set-associative array, not a hash map: its H2_STREAM_WAYS ways of a
 * bucket are looked at in place (inlined array lookups), and opening or freeing one is a write,
 * not an insert or a delete (an LRU hash insert and delete cost 140 and 70 ns per stream here,
 * a lock each).
 *
 * Two buckets may hold a stream. Its ring bucket: a connection's streams go to H2_STREAM_RING
 * consecutive buckets in turn, by their ids, so that a new stream lands where the connection's
 * streams of a little earlier were, answered and freed since: lines in the cache, not a random
 * line of the table's 2.5 MB (a request's bucket, cold, was a quarter of its cost). When its ring
 * bucket has no free way (more than the ring holds awaiting answers at once), its spill bucket,
 * a hash of the connection and the stream: a request finding that one full takes the way of the
 * oldest request there, whose answer then finds no stream (counted, as a stream missed), never
 * another's. A stream is looked for in its ring bucket, then in its spill bucket.
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

_Static_assert((H2_STREAM_RING & (H2_STREAM_RING - 1)) == 0 && H2_STREAM_RING <= H2_STREAM_BUCKETS,
               "a power of two, within the table");

/* h2_stream_conn - the hash of stream @k's connection, which places its buckets. */
static __always_inline __u64 h2_stream_conn(const struct h2_stream_key *k)
{
    return flow_key_mix(&k->key, 0);
}

/* h2_ring_index - the ring bucket of stream @k of the connection hashed @conn: ids 2n and
 * 2n + 1 share one, the next ids the next one. */
static __always_inline __u32 h2_ring_index(__u64 conn, const struct h2_stream_key *k)
{
    return ((__u32)(conn >> 32) + ((k->stream >> 1) & (H2_STREAM_RING - 1))) &
           (H2_STREAM_BUCKETS - 1);
}

/* h2_spill_index - the spill bucket of stream @k of the connection hashed @conn: a hash of the
 * connection and the id, outside the connection's ring (full when a stream spills). */
static __always_inline __u32 h2_spill_index(__u64 conn, const struct h2_stream_key *k)
{
    __u64 h = flow_key_mix(&k->key, (__u64)k->stream << 32 | k->stream);
    __u32 base = (__u32)(conn >> 32), idx = (__u32)(h >> 32);

    if (((idx - base) & (H2_STREAM_BUCKETS - 1)) < H2_STREAM_RING)
        idx += H2_STREAM_RING;
    return idx & (H2_STREAM_BUCKETS - 1);
}

/* h2_bucket - bucket @idx of the table (NULL only if the map is smaller). */
static __always_inline struct h2_stream_bucket *h2_bucket(__u32 idx)
{
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

/*
 * h2_stream_lookup - the way holding stream @k: in its ring bucket, else in its spill bucket.
 * @b: set to the bucket (NULL when no way holds the stream), @idx to its index.
 * @way, @seq: see h2_stream_find.
 * @return 1 when found.
 */
static __always_inline int h2_stream_lookup(const struct h2_stream_key *k,
                                            struct h2_stream_bucket **b, __u32 *idx, __u32 *way,
                                            __u32 *seq)
{
    __u64 conn = h2_stream_conn(k);
    __u32 at = h2_ring_index(conn, k);
    struct h2_stream_bucket *r = h2_bucket(at);

    *b = NULL;
    if (!h2_stream_find(r, k, way, seq)) {
        at = h2_spill_index(conn, k);
        r = h2_bucket(at);
        if (!h2_stream_find(r, k, way, seq))
            return 0;
    }
    *b = r;
    *idx = at;
    return 1;
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
 * h2_stream_way - the way of bucket @b for stream @k: the one that holds it already, else a
 * free one, else (when @evict) the one of the oldest request.
 * @return the way, or -1 when none (a full bucket, not @evict).
 */
static __always_inline int h2_stream_way(const struct h2_stream_bucket *b,
                                         const struct h2_stream_key *k, int evict)
{
    int pick = -1;
    __u64 oldest = ~0ULL;

#pragma unroll
    for (__u32 w = 0; w < H2_STREAM_WAYS; w++) {
        const struct h2_way_head *h = &b->head[w];
        if (h->stream == k->stream && flow_key_eq(&b->way[w].key, &k->key))
            return w;
        /* A free way first (age 0), else the oldest request's. */
        __u64 age = h->stream ? h->ts_ns | 1 : 0;
        if ((!age || evict) && age < oldest) {
            oldest = age;
            pick = w;
        }
    }
    return pick;
}

/*
 * h2_stream_open - keep @ns as stream @k's request: in the way of its ring bucket that holds
 * the stream already or is free, else in its spill bucket (see h2_stream_way).
 * @return 0, or -1 when it could not be kept (the way chosen is being written by another CPU).
 */
static __always_inline int h2_stream_open(const struct h2_stream_key *k, const struct h2_stream *ns)
{
    if (!k->stream)
        return -1;
    __u64 conn = h2_stream_conn(k);
    struct h2_stream_bucket *b = h2_bucket(h2_ring_index(conn, k));
    int pick = b ? h2_stream_way(b, k, 0) : -1;
    if (pick < 0) {
        b = h2_bucket(h2_spill_index(conn, k));
        if (!b)
            return -1;
        pick = h2_stream_way(b, k, 1);
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

/*
 * h2_stream_close - free way @way of @b, unless it was written since its count read @seq.
 * @return 1 when freed.
 */
static __always_inline int h2_stream_close(struct h2_stream_bucket *b, __u32 way, __u32 seq)
{
    struct h2_way_head *h = &b->head[way & (H2_STREAM_WAYS - 1)];

    if (__sync_val_compare_and_swap(&h->seq, seq, seq + 1) != seq)
        return 0;
    h->stream = 0;
    __sync_fetch_and_add(&h->seq, 1);
    return 1;
}

#endif /* MIRROR_H2_STREAMS_H */
