/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the per-CPU exact-match flow cache in front of the flow table: each CPU
 * has FLOW_CACHE_SLOTS slots of its own in one array, a flow's slot chosen by a hash of its
 * key and confirmed by comparing the whole key. A packet of a cached flow is counted in place,
 * through an inlined array lookup that touches its slot's two cache lines, instead of a
 * per-CPU LRU hash lookup (never inlined, several lines walked: half of the floor's cost).
 * Two flows with the same slot take turns: the newcomer writes the other's counts back to its
 * flow_table entry and takes the slot (flow.h), so both stay exact. Shared by the classifier
 * and the floor programs of the benchmark (baseline.bpf.c).
 */
#ifndef MIRROR_FLOW_CACHE_H
#define MIRROR_FLOW_CACHE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "types.h"

/*
 * Key: CPU * FLOW_CACHE_SLOTS + slot. Value: struct flow_cache_slot.
 * Sized by user space at load to the possible CPUs' slots. A plain array indexed by CPU, not a
 * per-CPU one: its values are contiguous, and BPF_F_MMAPABLE makes the kernel start them on a
 * page, so each slot is exactly two cache lines. User space reads them in batches (flow.rs).
 */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, FLOW_CACHE_SLOTS);
    __uint(map_flags, BPF_F_MMAPABLE);
    __type(key, __u32);
    __type(value, struct flow_cache_slot);
} flow_cache SEC(".maps");

/* Odd 64-bit multipliers (from the golden ratio and xxhash's primes). */
#define FLOW_CACHE_P1 0x9E3779B97F4A7C15ULL
#define FLOW_CACHE_P2 0xC2B2AE3D27D4EB4FULL

/* flow_key_mix - a multiply-xor hash of the five 64-bit words of @k, @seed folded into the
 * first: its upper 32 bits are well mixed. */
static __always_inline __u64 flow_key_mix(const struct flow_key *k, __u64 seed)
{
    const __u64 *w = (const __u64 *)k;
    __u64 h = (w[0] ^ seed) * FLOW_CACHE_P1;

    _Static_assert(sizeof(*k) == 40, "five words");
    h = (h ^ (h >> 29) ^ w[1]) * FLOW_CACHE_P2;
    h = (h ^ (h >> 29) ^ w[2]) * FLOW_CACHE_P1;
    h = (h ^ (h >> 29) ^ w[3]) * FLOW_CACHE_P2;
    h = (h ^ (h >> 29) ^ w[4]) * FLOW_CACHE_P1;
    return h;
}

/* flow_cache_index - this CPU's slot for @k. */
static __always_inline __u32 flow_cache_index(const struct flow_key *k)
{
    __u64 h = flow_key_mix(k, 0);

    _Static_assert((FLOW_CACHE_SLOTS & (FLOW_CACHE_SLOTS - 1)) == 0, "a power of two");
    return bpf_get_smp_processor_id() * FLOW_CACHE_SLOTS + (__u32)(h >> 32) % FLOW_CACHE_SLOTS;
}

/* flow_cache_slot_of - this CPU's slot for @k (whichever flow holds it), NULL only when the
 * map is smaller than the CPUs. */
static __always_inline struct flow_cache_slot *flow_cache_slot_of(const struct flow_key *k)
{
    __u32 idx = flow_cache_index(k);

    return bpf_map_lookup_elem(&flow_cache, &idx);
}

/* flow_cache_take - @c now holds the flow of @key, every count and state field zero. */
static __always_inline void flow_cache_take(struct flow_cache_slot *c, const struct flow_key *key)
{
    __builtin_memset(c, 0, sizeof(*c));
    c->key = *key;
}

/*
 * flow_cache_count - count one packet of @len bytes in direction @dir of the flow in @c.
 * @return 1 when the direction's packets reached FLOW_CACHE_WRITEBACK (time to write back).
 */
static __always_inline int flow_cache_count(struct flow_cache_slot *c, __u32 dir, __u32 len,
                                            __u8 flags, __u64 now)
{
    struct flow_cache_dir *d = &c->dir[dir & 1];

    if (!d->first_seen_ns)
        d->first_seen_ns = now;
    d->bytes += len;
    d->last_seen_ns = now;
    c->tcp_flags[dir & 1] |= flags;
    return ++c->packets[dir & 1] >= FLOW_CACHE_WRITEBACK;
}

#endif /* MIRROR_FLOW_CACHE_H */
