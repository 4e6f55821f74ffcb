/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the copy of a packet of a marked flow to the mirror interface, within the
 * node-wide budget (budget.h). Nothing here can drop the production packet.
 */
#ifndef MIRROR_MIRROR_H
#define MIRROR_MIRROR_H

#include "maps.h"
#include "budget.h"

/*
 * mirror_copy - copy the packet to the mirror interface.
 * With MIRROR_MIRRED the classic filter's act_mirred copies (on the program's match): we
 * only count.
 * @return 1 when a copy was made (or handed to mirred).
 */
static __always_inline int mirror_copy(struct __sk_buff *skb, enum mirror_method method,
                                       struct counters *cnt)
{
    __u32 len = skb->len;

    /* The node-wide budget: only here, where a copy is about to be made. */
    if (!budget_admit(len))
        return 0;
    if (method == MIRROR_CLONE) {
        __u32 zero = 0;
        struct settings *set = bpf_map_lookup_elem(&settings, &zero);

        if (!set || !set->mirror_ifindex) {
            cnt->v[STAT_MIRROR_NO_TARGET]++;
            return 0;
        }
        if (bpf_clone_redirect(skb, set->mirror_ifindex, mirror_deliver & BPF_F_INGRESS)) {
            cnt->v[STAT_MIRROR_ERRORS]++;
            return 0;
        }
    }
    cnt->v[STAT_MIRRORED_PACKETS]++;
    cnt->v[STAT_MIRRORED_BYTES] += len;
    return 1;
}

#endif /* MIRROR_MIRROR_H */
