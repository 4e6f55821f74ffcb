/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the question every egress asks: did this packet come in through an
 * interface where our ingress runs (then it was classified there, and is skipped here)?
 */
#ifndef MIRROR_IFACES_H
#define MIRROR_IFACES_H

#include "maps.h"

/*
 * ingress_attached - whether @iif (not 0) has our classifier at ingress: from iface_cache
 * while attach_epoch has not changed since the entry was written, else from attached_ifaces.
 * The epoch is read before the hash, so an entry written from a value older than the latest
 * change carries an older epoch and is never used.
 */
static __always_inline int ingress_attached(__u32 iif)
{
    __u32 zero = 0, slot = iif & (IFACE_CACHE_SLOTS - 1), id = iif & 0x7fffffff;
    __u32 *epoch = bpf_map_lookup_elem(&attach_epoch, &zero);
    __u64 *c = bpf_map_lookup_elem(&iface_cache, &slot);

    if (!epoch || !c)
        return 0;
    __u32 e = *(volatile __u32 *)epoch;
    __u64 v = *(volatile __u64 *)c;
    if ((__u32)(v >> 32) == e && ((__u32)v >> 1) == id)
        return v & 1;
    __u32 *hooks = bpf_map_lookup_elem(&attached_ifaces, &iif);
    __u64 in = hooks && (*hooks & (1 << HOOK_INGRESS));
    *(volatile __u64 *)c = (__u64)e << 32 | id << 1 | in;
    return in;
}

#endif /* MIRROR_IFACES_H */
