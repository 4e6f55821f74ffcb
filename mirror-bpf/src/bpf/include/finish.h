/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the end of every packet's path, whichever program it ends in (the entry
 * program when no other program follows it, else the protocol or reset program): when the
 * flow is marked (mark.h), the copy to the mirror interface
 * (mirror.h) within the mark's and the node's budgets, the kept request first when the mark
 * was made without a packet (replay.h).
 */
#ifndef MIRROR_FINISH_H
#define MIRROR_FINISH_H

#include "maps.h"
#include "mark.h"
#include "mirror.h"
#include "replay.h"
#include "stream.h"

/*
 * packet_finish - the mark and the copy of the packet in this CPU's scratch area @hs, whose
 * flow cache slot is @fs (may be NULL), counted in @cnt. A global function: verified once in
 * each program that ends a packet's path.
 * @return 1 when the packet is to be mirrored (copied here, or by act_mirred).
 */
static __always_inline int packet_finish(struct __sk_buff *skb, struct http_scratch *hs,
                                         struct flow_cache_slot *fs, struct counters *cnt)
{
    if (!skb || !cnt || !hs)
        return 0;
    struct pkt_meta *m = &hs->meta;
    struct mirror_mark *mk = mark_lookup(fs, &m->key);
    if (!mk || !mark_admit(mk, skb->len, m->now, cnt))
        return 0;
    /* Marked without a packet (noresponse.h): this first packet after it brings the request. */
    if (mk->replay_due)
        replay_due(skb, mk);
    return mirror_copy(skb, m->method, cnt);
}

#endif /* MIRROR_FINISH_H */
