/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains a flow's mark as every packet asks for it: is the packet's flow marked
 * (without the shared lookup while no trigger happened since this CPU last looked), and is the
 * packet within the mark's budget of packets, bytes and time.
 */
#ifndef MIRROR_MARK_H
#define MIRROR_MARK_H

#include "maps.h"

/*
 * mark_lookup - the mark of the flow, skipping the shared lookup while no trigger happened
 * since this CPU last looked (see mark_epoch).
 * @fs: this CPU's flow entry (NULL: always look up).
 */
static __always_inline struct mirror_mark *mark_lookup(struct flow_cache_slot *fs,
                                                       const struct flow_key *key)
{
    /* Read before the lookup: a trigger racing with it changes the epoch, so we look again. */
    __u32 epoch = mark_epoch;

    if (fs && fs->mark_seen == epoch)
        return NULL;
    struct mirror_mark *mk = bpf_map_lookup_elem(&mirror_marks, key);
    if (fs)
        fs->mark_seen = mk ? 0 : epoch;
    return mk;
}

/*
 * mark_admit - charge one packet of @len bytes to the mark's budget.
 * @return 1 when the packet is to be mirrored, 0 when the mark has ended.
 */
static __always_inline int mark_admit(struct mirror_mark *mk, __u32 len, __u64 now,
                                      struct counters *cnt)
{
    /* The other tuple of a translated connection: one budget, kept in the first mark. */
    if (mk->linked) {
        mk = bpf_map_lookup_elem(&mirror_marks, &mk->peer);
        if (!mk)
            return 0;
    }
    if (mk->ended)
        return 0;
    if (mk->deadline_ns && now > mk->deadline_ns)
        goto end;
    if (mk->max_bytes && mk->bytes >= mk->max_bytes)
        goto end;
    __u64 n = __sync_fetch_and_add(&mk->packets, 1);
    if (mk->max_packets && n >= mk->max_packets) {
        __sync_fetch_and_add(&mk->packets, -1);
        goto end;
    }
    __sync_fetch_and_add(&mk->bytes, len);
    return 1;
end:
    if (__sync_val_compare_and_swap(&mk->ended, 0, 1) == 0)
        cnt->v[STAT_MIRROR_ENDED]++;
    return 0;
}

#endif /* MIRROR_MARK_H */
