/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the kernel's drops of the pods' packets, as counts and as triggers. The
 * drop program runs on the kfree_skb tracepoint (a packet freed with a drop reason, 5.17+), so
 * only when the kernel drops a packet: never per forwarded packet.
 *
 * A drop counts when it is real (not SKB_NOT_DROPPED_YET, SKB_CONSUMED, NOT_SPECIFIED, the
 * reason of a plain kfree_skb(), which the kernel still calls for normal frees, or QUEUE_PURGE,
 * a queue emptied as its socket closes or its device goes away) and the packet
 * is a pod's: it came in or goes out through an attached veth of the node's namespace, or
 * through the pod's end of one (a pod's own stack dropping it, in the pod's namespace), or its
 * flow is in the flow table (seen on a pod's veth), but not on the mirror's sink or its peer
 * (a copy its reader leaves is the mirror's own). Counted by reason (drop_counts) and by pod
 * and reason (drop_pods). The pod is the one the packet was going to when its route leads to
 * one (a policy dropping a connection counts at the pod it protects), else the one it came
 * from or was in: one pod per drop, named by its host-side veth. Then, while some rule is a drop
 * rule, the rule of its reason (pseudo-status DROP_REASON_BASE + reason) and server port (the
 * packet's destination port, else its source port) marks its flow, as any trigger does
 * (trigger.h: mark_flow), and the packet's first bytes go to the agent on drop_events with the
 * reason and the kernel's location, for the agent to write to the mirror. A flow is marked
 * once (its mark is the dedup); each rule makes at most DROP_TRIGGERS_PER_SEC triggers a second,
 * the excess counted.
 *
 * Across NAT, the dropped packet's conntrack entry gives both tuples (the client's, as sent to
 * the Service, and the server's), and both keys are marked, as the classifier marks them.
 */
#ifndef MIRROR_DROP_H
#define MIRROR_DROP_H

#include <bpf/bpf_core_read.h>

#include "compat.h"
#include "maps.h"
#include "parse.h"
#include "nat.h"
#include "rule.h"
#include "trigger.h"

/* Key: 0. Value: struct drop_counts, per CPU: the pods' drops by reason. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct drop_counts);
} drop_counts SEC(".maps");

/* Key: struct drop_pod_key. Value: __u64 per CPU: the pods' drops by pod and reason. Entries of
 * an interface are deleted when it is detached (user space), so a pod's counts leave with it. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(max_entries, DROP_PODS_MAX);
    __type(key, struct drop_pod_key);
    __type(value, __u64);
} drop_pods SEC(".maps");

/* The drop triggers of one rule in the current second. */
struct drop_window {
    __u64 start_ns;
    __u64 n;
};

/* Key: rule slot. Value: struct drop_window. Shared: a rule's rate is the node's. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, RULE_SLOTS);
    __type(key, __u32);
    __type(value, struct drop_window);
} drop_windows SEC(".maps");

/* Drop triggers, struct trigger_event each (the dropped packet in replay): a ring of their own,
 * so that a storm of drops never takes the space of the other triggers' events. */
struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 256 * 1024);
} drop_events SEC(".maps");

/* The drop program's own scratch, per CPU: it may run inside a classifier program (a copy
 * dropped), whose http_scratch it must not touch. */
struct drop_scratch {
    struct flow_key key;   /* the dropped packet's flow */
    struct flow_key orig;  /* conntrack's tuples of it: the client's, */
    struct flow_key reply; /* and the server's */
    struct mirror_mark mark;
    struct trigger_info ti;
    struct rule_action ra;
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct drop_scratch);
} drop_scratch SEC(".maps");

#define TCP_SYN_ACK_MASK 0x12
#define TCP_SYN_ONLY 0x02

/* drop_real - is @reason a real drop (not a free that the kernel calls a drop's)? The values
 * are the running kernel's (CO-RE): they change across kernels. */
static __always_inline int drop_real(__u32 reason)
{
    if (bpf_core_enum_value_exists(enum skb_drop_reason, SKB_DROP_REASON_QUEUE_PURGE) &&
        reason == bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_QUEUE_PURGE))
        return 0;
    return reason != bpf_core_enum_value(enum skb_drop_reason, SKB_NOT_DROPPED_YET) &&
           reason != bpf_core_enum_value(enum skb_drop_reason, SKB_CONSUMED) &&
           reason != bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_NOT_SPECIFIED);
}

/* drop_attached - @dev's ifindex when it is an attached interface of the node, else 0. */
static __always_inline __u32 drop_attached(struct net_device *dev)
{
    if (!dev || BPF_CORE_READ(dev, nd_net.net, ns.inum) != node_netns)
        return 0;
    __u32 ifindex = BPF_CORE_READ(dev, ifindex);
    return bpf_map_lookup_elem(&attached_ifaces, &ifindex) ? ifindex : 0;
}

/* drop_veth_peer - the other end of @dev when @dev is a veth, else NULL. A veth's private
 * area (netdev_priv: the net_device's priv[] since 6.9, before that right after it, aligned to
 * NETDEV_ALIGN) begins with the peer's pointer (struct veth_priv). */
static __always_inline struct net_device *drop_veth_peer(struct net_device *dev)
{
    const char *kind = BPF_CORE_READ(dev, rtnl_link_ops, kind);
    char name[5] = {};
    struct net_device *peer = NULL;
    void *priv;

    if (!kind || bpf_probe_read_kernel_str(name, sizeof(name), kind) != sizeof(name) ||
        name[0] != 'v' || name[1] != 'e' || name[2] != 't' || name[3] != 'h')
        return NULL;
    if (bpf_core_field_exists(dev->priv))
        priv = (void *)dev + bpf_core_field_offset(struct net_device, priv);
    else
        priv = (void *)dev + ((bpf_core_type_size(struct net_device) + 31) & ~31UL);
    if (bpf_probe_read_kernel(&peer, sizeof(peer), priv))
        return NULL;
    return peer;
}

/* drop_pod_of - the pod @dev leads to, by its attached host-side veth's ifindex: @dev itself,
 * or, for a device of another namespace (a pod's eth0), its veth peer. 0: none. */
static __always_inline __u32 drop_pod_of(struct net_device *dev)
{
    if (!dev)
        return 0;
    if (BPF_CORE_READ(dev, nd_net.net, ns.inum) == node_netns)
        return drop_attached(dev);
    return drop_attached(drop_veth_peer(dev));
}

/* drop_on_sink - is @dev the mirror's sink (@sink: its ifindex in the node's namespace) or the
 * sink's peer? What the mirror's readers leave (a copy is not addressed to them) is the
 * mirror's own, not a pod's. */
static __always_inline int drop_on_sink(struct net_device *dev, __u32 sink)
{
    if (!dev || !sink)
        return 0;
    if (BPF_CORE_READ(dev, nd_net.net, ns.inum) == node_netns &&
        BPF_CORE_READ(dev, ifindex) == sink)
        return 1;
    struct net_device *peer = drop_veth_peer(dev);
    return peer && BPF_CORE_READ(peer, nd_net.net, ns.inum) == node_netns &&
           BPF_CORE_READ(peer, ifindex) == sink;
}

/* drop_count_pod - one drop more for pod @ifindex (0: none known) and reason index @idx. */
static __always_inline void drop_count_pod(__u32 ifindex, __u32 idx, struct counters *cnt)
{
    struct drop_pod_key k = {.ifindex = ifindex, .reason = idx};
    __u64 *n = bpf_map_lookup_elem(&drop_pods, &k);

    if (!n) {
        __u64 one = 1;
        if (!bpf_map_update_elem(&drop_pods, &k, &one, BPF_NOEXIST))
            return;
        /* Another CPU made it meanwhile, or the map is full. */
        n = bpf_map_lookup_elem(&drop_pods, &k);
        if (!n) {
            cnt->v[STAT_DROP_PODS_FULL]++;
            return;
        }
    }
    (*n)++;
}

/*
 * drop_parse - the flow key of @skb's IPv4/IPv6 TCP or UDP packet into @k, its TCP flags and
 * ports. Read from the network header on (set on every path that drops by reason).
 * @return 1 when parsed.
 */
static __always_inline int drop_parse(struct sk_buff *skb, struct flow_key *k, __u8 *flags,
                                      __u16 *sport, __u16 *dport, __u8 *dir)
{
    unsigned char *head = BPF_CORE_READ(skb, head);
    __u16 nh = BPF_CORE_READ(skb, network_header);
    __u16 proto = bpf_ntohs(BPF_CORE_READ(skb, protocol));
    __u32 saddr[4] = {}, daddr[4] = {};
    __u32 l4;
    __u8 l4proto;

    if (nh == (__u16)~0U)
        return 0;
    if (proto == ETH_P_IP) {
        struct iphdr ip;
        if (bpf_probe_read_kernel(&ip, sizeof(ip), head + nh) || ip.version != 4 || ip.ihl < 5)
            return 0;
        if (ip.frag_off & bpf_htons(IP_OFFSET_MASK))
            return 0;
        saddr[0] = ip.saddr;
        daddr[0] = ip.daddr;
        l4 = nh + ip.ihl * 4;
        l4proto = ip.protocol;
        k->family = 4;
    } else if (proto == ETH_P_IPV6) {
        struct ipv6hdr ip6;
        if (bpf_probe_read_kernel(&ip6, sizeof(ip6), head + nh))
            return 0;
        __builtin_memcpy(saddr, &ip6.saddr, 16);
        __builtin_memcpy(daddr, &ip6.daddr, 16);
        l4 = nh + sizeof(ip6);
        l4proto = ip6.nexthdr;
        k->family = 6;
    } else {
        return 0;
    }
    if (l4proto != IPPROTO_TCP && l4proto != IPPROTO_UDP)
        return 0;
    __be16 ports[2];
    if (bpf_probe_read_kernel(ports, sizeof(ports), head + l4))
        return 0;
    *flags = 0;
    if (l4proto == IPPROTO_TCP)
        bpf_probe_read_kernel(flags, 1, head + l4 + 13);
    *sport = bpf_ntohs(ports[0]);
    *dport = bpf_ntohs(ports[1]);
    *dir = flow_key_make(k, saddr, daddr, *sport, *dport);
    k->proto = l4proto;
    k->_pad[0] = 0;
    k->_pad[1] = 0;
    return 1;
}

/* drop_ct - conntrack's two tuples of @skb's connection as flow keys into @s->orig and
 * @s->reply. @return 1 when the connection is known and translated (they differ). */
static __always_inline int drop_ct(struct sk_buff *skb, struct drop_scratch *s)
{
    unsigned long nfct = BPF_CORE_READ(skb, _nfct);
    struct nf_conn *ct = (struct nf_conn *)(nfct & ~7UL);
    struct nf_conntrack_tuple t;
    struct ct_tuple o = {}, r = {};

    if (!ct)
        return 0;
    int v6 = s->key.family == 6;
    if (bpf_core_read(&t, sizeof(t), &ct->tuplehash[0].tuple))
        return 0;
    ct_tuple_read(&o, &t, v6);
    if (bpf_core_read(&t, sizeof(t), &ct->tuplehash[1].tuple))
        return 0;
    ct_tuple_read(&r, &t, v6);
    ct_tuple_key(&s->orig, &o, s->key.family, s->key.proto);
    ct_tuple_key(&s->reply, &r, s->key.family, s->key.proto);
    return !flow_key_eq(&s->orig, &s->reply);
}

/* drop_admit - may rule slot @slot trigger once more this second? */
static __always_inline int drop_admit(__u32 slot, __u64 now)
{
    struct drop_window *w = bpf_map_lookup_elem(&drop_windows, &slot);

    if (!w)
        return 0;
    if (now - w->start_ns > NSEC_PER_SEC) {
        w->start_ns = now;
        w->n = 0;
    }
    return __sync_fetch_and_add(&w->n, 1) < DROP_TRIGGERS_PER_SEC;
}

/* drop_copy - the dropped packet into @ev: an Ethernet header (the packet's own when it has
 * one, else zero addresses), then its bytes from the network header, as many as the linear
 * data holds, up to REPLAY_FRAME_MAX in all. */
static __always_inline void drop_copy(struct sk_buff *skb, struct trigger_event *ev, __u16 proto)
{
    unsigned char *head = BPF_CORE_READ(skb, head);
    __u16 nh = BPF_CORE_READ(skb, network_header);
    __u16 mh = BPF_CORE_READ(skb, mac_header);
    __u32 tail = BPF_CORE_READ(skb, tail);
    __u32 len = BPF_CORE_READ(skb, len);
    __u32 data = (__u32)(BPF_CORE_READ(skb, data) - head);

    __builtin_memset(ev->replay, 0, 14);
    if (mh != (__u16)~0U && nh >= mh + 14)
        bpf_probe_read_kernel(ev->replay, 12, head + mh);
    ev->replay[12] = proto >> 8;
    ev->replay[13] = proto & 0xff;
    __u32 n = tail > nh ? tail - nh : 0;
    if (n > REPLAY_FRAME_MAX - 14)
        n = REPLAY_FRAME_MAX - 14;
    if (n && !bpf_probe_read_kernel(ev->replay + 14, n, head + nh))
        ev->replay_len = 14 + n;
    /* The packet's length from its network header: skb->len counts from skb->data. */
    ev->replay_wire_len = 14 + len + data - (nh < data + len ? nh : data);
}

/*
 * drop_seen - the kernel dropped @skb for @reason at @location (kfree_skb's caller): count it
 * if it is a pod's, and trigger on it if a rule asks.
 */
static __always_inline int drop_seen(struct sk_buff *skb, __u64 location, __u32 reason)
{
    __u32 zero = 0;
    struct drop_scratch *s = bpf_map_lookup_elem(&drop_scratch, &zero);
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct drop_counts *dc = bpf_map_lookup_elem(&drop_counts, &zero);
    __u16 sport, dport;
    __u8 flags, dir;

    struct settings *st = bpf_map_lookup_elem(&settings, &zero);

    if (!skb || !s || !cnt || !dc || !st || !drop_real(reason))
        return 0;
    if (!drop_parse(skb, &s->key, &flags, &sport, &dport, &dir))
        return 0;
    struct net_device *dev = BPF_CORE_READ(skb, dev);
    if (drop_on_sink(dev, st->mirror_ifindex))
        return 0;
    /* Whose: the pod its route leads to, else the one it came from or is in, else its flow. */
    unsigned long refdst = BPF_CORE_READ(skb, _skb_refdst);
    struct dst_entry *dst = (struct dst_entry *)(refdst & ~1UL);
    __u32 ifindex = dst ? drop_pod_of(BPF_CORE_READ(dst, dev)) : 0;
    if (!ifindex)
        ifindex = drop_pod_of(dev);
    int nat = drop_ct(skb, s);
    if (!ifindex && !bpf_map_lookup_elem(&flow_table, &s->key) &&
        !(nat && (bpf_map_lookup_elem(&flow_table, &s->orig) ||
                  bpf_map_lookup_elem(&flow_table, &s->reply))))
        return 0;
    cnt->v[STAT_DROPS]++;
    __u32 idx = reason < DROP_REASONS ? reason : 0;
    barrier_var(idx); /* the bound checked on the register the access uses */
    if (idx < DROP_REASONS)
        dc->v[idx]++;
    drop_count_pod(ifindex, idx, cnt);

    if (!(st->kinds & (1U << TRIGGER_DROP)) || reason >= DROP_REASONS)
        return 0;
    __u32 scope = 0;
    if (st->scoped && ifindex) {
        __u32 *sc = bpf_map_lookup_elem(&iface_scopes, &ifindex);
        scope = sc ? *sc : 0;
    }
    __u16 status = DROP_REASON_BASE + reason;
    struct rule_action *ra = rule_lookup(dport, status, scope, 0, NULL, &s->key, NULL);
    if (!ra)
        ra = rule_lookup(sport, status, scope, 0, NULL, &s->key, NULL);
    if (!ra)
        return 0;
    /* Marked: the flow triggered before (its retransmissions are copied from the veth). */
    struct flow_key *mk = nat ? &s->orig : &s->key;
    if (bpf_map_lookup_elem(&mirror_marks, mk))
        return 0;
    __u64 now = bpf_ktime_get_ns();
    if (!drop_admit(ra->slot, now)) {
        cnt->v[STAT_DROP_LIMITED]++;
        return 0;
    }
    s->ra = *ra;
    __builtin_memset(&s->ti, 0, sizeof(s->ti));
    s->ti.kind = TRIGGER_DROP;
    s->ti.status = reason;
    s->ti.by = (flags & TCP_SYN_ACK_MASK) == TCP_SYN_ONLY ? SIDE_CLIENT : SIDE_UNKNOWN;
    if (!mark_flow(mk, nat ? &s->reply : NULL, &s->ra, &s->ti, now, &s->mark, cnt))
        return 0;

    struct trigger_event *ev = bpf_ringbuf_reserve(&drop_events, sizeof(*ev), 0);
    if (!ev) {
        cnt->v[STAT_RINGBUF_DROPS]++;
        return 0;
    }
    __builtin_memset(ev, 0, sizeof(*ev));
    ev->key = s->key;
    if (nat)
        ev->nat = flow_key_eq(&s->key, &s->orig) ? s->reply : s->orig;
    ev->ts_ns = now;
    ev->rule_id = s->ra.rule_id;
    ev->ifindex = ifindex;
    ev->status = reason;
    ev->dir = dir;
    ev->kind = TRIGGER_DROP;
    ev->by = s->ti.by;
    ev->replay_ts_ns = now;
    ev->location = location;
    drop_copy(skb, ev, s->key.family == 6 ? ETH_P_IPV6 : ETH_P_IP);
    bpf_ringbuf_submit(ev, 0);
    return 1;
}

#endif /* MIRROR_DROP_H */
