/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains one flow across NAT. A connection that the node's conntrack translated
 * (DNAT for a ClusterIP, DNAT and SNAT for a NodePort or a pod reaching its own Service) is
 * seen under two flow keys, one on each side of the translation: client:port <-> VIP:80 on the
 * client's veth, client:port <-> pod:80 (or node:port <-> pod:80) on the server's. When a flow
 * is created (by any packet but a SYN: conntrack has no entry before the SYN has passed the
 * node), conntrack is asked for both tuples; when they differ, each key is recorded in
 * flow_nat with the other. A response without a pending request and a trigger whose other key
 * is not known yet ask again, once per flow. Never per packet.
 *
 * Without conntrack (a kernel without it, or an eBPF load balancer that translates before
 * conntrack sees the packet) nothing is recorded: each tuple is a flow of its own.
 */
#ifndef MIRROR_NAT_H
#define MIRROR_NAT_H

#include "maps.h"
#include "parse.h"

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb_ctx,
                                         struct bpf_sock_tuple *bpf_tuple, __u32 tuple__sz,
                                         struct bpf_ct_opts *opts, __u32 opts__sz) __ksym __weak;
extern void bpf_ct_release(struct nf_conn *ct) __ksym __weak;

/* The size of struct bpf_ct_opts every kernel with the kfunc accepts (no zone fields). */
#define CT_OPTS_SZ 12

/* ct_tuple_read - one direction of a conntrack entry, ports in host order. */
static __always_inline void ct_tuple_read(struct ct_tuple *out, const struct nf_conntrack_tuple *t,
                                          int v6)
{
    out->src[0] = t->src.u3.all[0];
    out->dst[0] = t->dst.u3.all[0];
#pragma unroll
    for (int i = 1; i < 4; i++) {
        out->src[i] = v6 ? t->src.u3.all[i] : 0;
        out->dst[i] = v6 ? t->dst.u3.all[i] : 0;
    }
    out->sport = bpf_ntohs(t->src.u.tcp.port);
    out->dport = bpf_ntohs(t->dst.u.tcp.port);
}

/* ct_tuple_key - the flow key of a conntrack tuple of protocol @proto. */
static __always_inline void ct_tuple_key(struct flow_key *k, const struct ct_tuple *t, __u8 family,
                                         __u8 proto)
{
    flow_key_make(k, t->src, t->dst, t->sport, t->dport);
    k->proto = proto;
    k->family = family;
    k->_pad[0] = 0;
    k->_pad[1] = 0;
}

/*
 * nat_learn - ask conntrack about the connection of @m's packet; when it is translated, record
 * each of its two keys in flow_nat with the other. A global function: verified once.
 * @return 1 when the connection is translated.
 */
__noinline int nat_learn(struct __sk_buff *skb, struct pkt_meta *m)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct nat_scratch *s = bpf_map_lookup_elem(&nat_scratch, &zero);

    if (!skb || !m || !cnt || !s || !bpf_ksym_exists(bpf_skb_ct_lookup))
        return 0;
    /* The packet's own source and destination, from the canonical key and its direction. */
    int fwd = m->dir == FLOW_DIR_FORWARD;
    const __u32 *src = fwd ? m->key.addr_lo : m->key.addr_hi;
    const __u32 *dst = fwd ? m->key.addr_hi : m->key.addr_lo;
    __u16 sport = fwd ? m->key.port_lo : m->key.port_hi;
    __u16 dport = fwd ? m->key.port_hi : m->key.port_lo;
    struct bpf_sock_tuple *tup = (struct bpf_sock_tuple *)s->tuple;
    struct bpf_ct_opts *opts = (struct bpf_ct_opts *)s->opts;
    __u32 tup_sz;
    int v6 = m->key.family == 6;

    __builtin_memset(s->tuple, 0, sizeof(s->tuple));
    __builtin_memset(s->opts, 0, sizeof(s->opts));
    if (v6) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            tup->ipv6.saddr[i] = src[i];
            tup->ipv6.daddr[i] = dst[i];
        }
        tup->ipv6.sport = bpf_htons(sport);
        tup->ipv6.dport = bpf_htons(dport);
        tup_sz = sizeof(tup->ipv6);
    } else {
        tup->ipv4.saddr = src[0];
        tup->ipv4.daddr = dst[0];
        tup->ipv4.sport = bpf_htons(sport);
        tup->ipv4.dport = bpf_htons(dport);
        tup_sz = sizeof(tup->ipv4);
    }
    opts->netns_id = -1; /* BPF_F_CURRENT_NETNS */
    opts->l4proto = m->key.proto;
    cnt->v[STAT_CT_LOOKUPS]++;
    struct nf_conn *ct = bpf_skb_ct_lookup(skb, tup, tup_sz, opts, CT_OPTS_SZ);
    if (!ct)
        return 0;
    struct flow_nat *n = &s->nat;
    ct_tuple_read(&n->orig, &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple, v6);
    ct_tuple_read(&n->reply, &ct->tuplehash[IP_CT_DIR_REPLY].tuple, v6);
    bpf_ct_release(ct);

    ct_tuple_key(&s->orig, &n->orig, m->key.family, m->key.proto);
    ct_tuple_key(&s->reply, &n->reply, m->key.family, m->key.proto);
    if (flow_key_eq(&s->orig, &s->reply))
        return 0;
    __builtin_memset(n->_pad, 0, sizeof(n->_pad));
    n->peer = s->reply;
    bpf_map_update_elem(&flow_nat, &s->orig, n, BPF_ANY);
    n->peer = s->orig;
    bpf_map_update_elem(&flow_nat, &s->reply, n, BPF_ANY);
    cnt->v[STAT_NAT_FLOWS]++;
    return 1;
}

/*
 * nat_peer - the other key of @m's connection when it is translated. When it is not known yet,
 * conntrack is asked if @ask and @t (the flow's shared entry, may be NULL) says it was not
 * asked before.
 * @return 1 when @peer was set.
 */
static __always_inline int nat_peer(struct __sk_buff *skb, struct pkt_meta *m,
                                    struct flow_timing *t, struct flow_key *peer, int ask)
{
    struct flow_nat *n = bpf_map_lookup_elem(&flow_nat, &m->key);

    if (!n && ask && (!t || !t->nat_checked)) {
        if (t)
            t->nat_checked = 1;
        nat_learn(skb, m);
        n = bpf_map_lookup_elem(&flow_nat, &m->key);
    }
    if (!n)
        return 0;
    *peer = n->peer;
    return 1;
}

#endif /* MIRROR_NAT_H */
