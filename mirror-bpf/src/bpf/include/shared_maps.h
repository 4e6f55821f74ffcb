/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the maps shared by the classifier and the tracing programs: user space
 * creates them with the classifier and hands the same maps to the tracing object before its
 * load, so that both write one set of histograms and agree on the attached interfaces.
 */
#ifndef MIRROR_SHARED_MAPS_H
#define MIRROR_SHARED_MAPS_H

#include "types.h"
#include "scratch.h"

/* Key: ifindex. Value: enum hook_kind bits attached. Lets egress skip packets already seen. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 8192);
    __type(key, __u32);
    __type(value, __u32);
} attached_ifaces SEC(".maps");

/*
 * Key: histogram slot. Value: struct latency_hist, per CPU (no atomics; summed in user space).
 * An array: a slot found once (hist_slots, then each CPU's hist_cache) is updated by an inlined
 * array lookup (hist.h).
 */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, HIST_SLOTS);
    __type(key, __u32);
    __type(value, struct latency_hist);
} latency_hists SEC(".maps");

/* Key: struct hist_key. Value: its latency_hists slot. Slots are never given back. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, HIST_SLOTS);
    __type(key, struct hist_key);
    __type(value, __u32);
} hist_slots SEC(".maps");

/*
 * Key: ifindex % HIST_CACHE_IFACES. Value: struct hist_cache_entry, per CPU: the slots of that
 * interface's histograms as this CPU found them in hist_slots, so that a sample costs an
 * inlined array lookup. Another interface at the same index takes the entry over.
 */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, HIST_CACHE_IFACES);
    __type(key, __u32);
    __type(value, struct hist_cache_entry);
} hist_cache SEC(".maps");

/* Key: 0. Value: the next latency_hists slot to give out (shared by both objects). */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} hist_next SEC(".maps");

/*
 * Key: the address of a struct sk_buff. Value: struct skb_stamp.
 * When a packet entered the node through an attached interface, and reached our classifier;
 * deleted when it leaves, is read, or is freed (the address is reused at once).
 */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, __u64);
    __type(value, struct skb_stamp);
} skb_stamps SEC(".maps");

#endif /* MIRROR_SHARED_MAPS_H */
