/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the header parser: Ethernet, up to two 802.1Q/802.1ad tags, IPv4 with
 * options, IPv6 with a bounded walk over extension headers, TCP with options, UDP. Headers are
 * read in the linear area; anything truncated or inconsistent is reported, never guessed.
 */
#ifndef MIRROR_PARSE_H
#define MIRROR_PARSE_H

#include <bpf/bpf_endian.h>

#include "compat.h"
#include "types.h"
#include "scratch.h"

/* How many IPv6 extension headers are walked before giving up. */
#define IPV6_EXT_MAX 6
/* How many VLAN tags are stripped. */
#define VLAN_MAX 2
/* The IP header gives no length (BIG TCP above 64 KiB): L4 is the rest of the skb. */
#define L4_LEN_FROM_SKB 0xFFFFFFFFU
/* TCP flag bits of pkt_meta.tcp_flags (the header's flag byte; vmlinux.h's enum of the same
 * names holds them as bits of the whole flag word instead). */
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

enum parse_result {
    PARSE_TCP = 0,   /* a TCP segment: struct pkt_meta is filled */
    PARSE_OTHER,     /* valid, but not for us (non-IP, not TCP or UDP, non-first fragment) */
    PARSE_MALFORMED, /* truncated or inconsistent */
    PARSE_UDP,       /* a UDP datagram: struct pkt_meta is filled (tcp_flags and seq 0) */
};

struct cursor {
    void *pos;
    void *end;
};

/*
 * cursor_take - claim the next @len bytes.
 * @return a pointer to them, or NULL when the packet is shorter.
 */
static __always_inline void *cursor_take(struct cursor *c, __u32 len)
{
    void *p = c->pos;

    if (p + len > c->end)
        return NULL;
    c->pos = p + len;
    return p;
}

/*
 * flow_key_make - fill @k in canonical order from source and destination endpoints.
 * @saddr/@daddr: four words each (IPv4 uses word 0); ports in host order.
 * @return the direction (enum flow_dir) of a packet from source to destination.
 */
static __always_inline __u8 flow_key_make(struct flow_key *k, const __u32 *saddr,
                                          const __u32 *daddr, __u16 sport, __u16 dport)
{
    int src_is_lo = 0, decided = 0;

#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (!decided && saddr[i] != daddr[i]) {
            src_is_lo = bpf_ntohl(saddr[i]) < bpf_ntohl(daddr[i]);
            decided = 1;
        }
    }
    if (!decided)
        src_is_lo = sport <= dport;

    const __u32 *lo = src_is_lo ? saddr : daddr;
    const __u32 *hi = src_is_lo ? daddr : saddr;

#pragma unroll
    for (int i = 0; i < 4; i++) {
        k->addr_lo[i] = lo[i];
        k->addr_hi[i] = hi[i];
    }
    k->port_lo = src_is_lo ? sport : dport;
    k->port_hi = src_is_lo ? dport : sport;
    return src_is_lo ? FLOW_DIR_FORWARD : FLOW_DIR_REVERSE;
}

/*
 * flow_key_eq - are @a and @b the same flow? Compared a 64-bit word at a time: a key on the
 * stack must be 8-byte aligned (the verifier refuses misaligned stack reads; map values and
 * the scratch area may be read unaligned).
 */
static __always_inline int flow_key_eq(const struct flow_key *a, const struct flow_key *b)
{
    const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
    __u64 diff = 0;

    _Static_assert(sizeof(*a) % 8 == 0, "flow_key is a whole number of 64-bit words");
    /* One branch, not five. */
#pragma unroll
    for (int i = 0; i < (int)(sizeof(*a) / 8); i++)
        diff |= x[i] ^ y[i];
    return !diff;
}

/*
 * parse_tcp - parse the TCP header at the cursor and finish @m.
 * @l4_len: bytes of L4 (header + payload) according to the IP header, or L4_LEN_FROM_SKB.
 * @skb_len: skb->len, which a consistent IP length never exceeds.
 */
static __always_inline int parse_tcp(struct cursor *c, void *frame, struct pkt_meta *m,
                                     const __u32 *saddr, const __u32 *daddr, __u32 l4_len,
                                     __u32 skb_len)
{
    __u32 l4_off = (__u32)(c->pos - frame);
    struct tcphdr *tcp = cursor_take(c, sizeof(*tcp));

    if (!tcp)
        return PARSE_MALFORMED;
    if (l4_len == L4_LEN_FROM_SKB)
        l4_len = skb_len > l4_off ? skb_len - l4_off : 0;
    /* A frame shorter than its IP length is truncated: its payload is not what it claims. */
    if (l4_off + l4_len > skb_len)
        return PARSE_MALFORMED;
    __u32 doff = tcp->doff * 4;
    if (doff < sizeof(*tcp) || doff > l4_len)
        return PARSE_MALFORMED;
    /* Options must be present in the packet too. */
    if (!cursor_take(c, doff - sizeof(*tcp)))
        return PARSE_MALFORMED;

    __u16 sport = bpf_ntohs(tcp->source);
    m->dir = flow_key_make(&m->key, saddr, daddr, sport, bpf_ntohs(tcp->dest));
    m->key.proto = IPPROTO_TCP;
    m->key._pad[0] = 0;
    m->key._pad[1] = 0;
    m->src_port = sport;
    m->dst_port = bpf_ntohs(tcp->dest);
    m->seq = bpf_ntohl(tcp->seq);
    m->tcp_flags = ((__u8 *)tcp)[13];
    m->payload_off = (__u32)(c->pos - frame);
    m->payload_len = l4_len - doff;
    return PARSE_TCP;
}

/*
 * parse_udp - parse the UDP header at the cursor and finish @m, as parse_tcp does. A datagram
 * is taken whole or not at all: its length must agree with the IP header's and the frame's.
 */
static __always_inline int parse_udp(struct cursor *c, void *frame, struct pkt_meta *m,
                                     const __u32 *saddr, const __u32 *daddr, __u32 l4_len,
                                     __u32 skb_len)
{
    __u32 l4_off = (__u32)(c->pos - frame);
    struct udphdr *udp = cursor_take(c, sizeof(*udp));

    /* UDP is followed for DNS alone: a datagram it cannot read is not for us, not malformed. */
    if (!udp)
        return PARSE_OTHER;
    __u32 ulen = bpf_ntohs(udp->len);
    /* Not one datagram as sent (UDP GSO, a length the IP header disagrees with): not for us. */
    if (l4_len == L4_LEN_FROM_SKB || ulen < sizeof(*udp) || ulen > l4_len ||
        l4_off + ulen > skb_len)
        return PARSE_OTHER;
    __u16 sport = bpf_ntohs(udp->source);
    m->dir = flow_key_make(&m->key, saddr, daddr, sport, bpf_ntohs(udp->dest));
    m->key.proto = IPPROTO_UDP;
    m->key._pad[0] = 0;
    m->key._pad[1] = 0;
    m->src_port = sport;
    m->dst_port = bpf_ntohs(udp->dest);
    m->seq = 0;
    m->tcp_flags = 0;
    m->payload_off = l4_off + sizeof(*udp);
    m->payload_len = ulen - sizeof(*udp);
    return PARSE_UDP;
}

/* parse_ipv4 - IPv4 header with options; non-first fragments are PARSE_OTHER. */
static __always_inline int parse_ipv4(struct cursor *c, void *frame, struct pkt_meta *m,
                                      __u32 skb_len)
{
    struct iphdr *ip = cursor_take(c, sizeof(*ip));

    if (!ip)
        return PARSE_MALFORMED;
    __u32 ihl = ip->ihl * 4;
    __u32 tot_len = bpf_ntohs(ip->tot_len);
    /* tot_len 0: BIG TCP (GSO above 64 KiB); parse_tcp takes the length from the skb. */
    if (ip->version != 4 || ihl < sizeof(*ip) || (tot_len && tot_len < ihl))
        return PARSE_MALFORMED;
    if (!cursor_take(c, ihl - sizeof(*ip)))
        return PARSE_MALFORMED;
    if (bpf_ntohs(ip->frag_off) & IP_OFFSET_MASK)
        return PARSE_OTHER;
    if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
        return PARSE_OTHER;

    __u32 saddr[4] = {ip->saddr, 0, 0, 0};
    __u32 daddr[4] = {ip->daddr, 0, 0, 0};
    __u32 l4_len = tot_len ? tot_len - ihl : L4_LEN_FROM_SKB;
    m->key.family = 4;
    if (ip->protocol == IPPROTO_UDP)
        return parse_udp(c, frame, m, saddr, daddr, l4_len, skb_len);
    return parse_tcp(c, frame, m, saddr, daddr, l4_len, skb_len);
}

/* parse_ipv6 - IPv6 header, then hop-by-hop, routing, destination-options, fragment, AH. */
static __always_inline int parse_ipv6(struct cursor *c, void *frame, struct pkt_meta *m,
                                      __u32 skb_len)
{
    struct ipv6hdr *ip6 = cursor_take(c, sizeof(*ip6));

    if (!ip6)
        return PARSE_MALFORMED;
    if (ip6->version != 6)
        return PARSE_MALFORMED;

    __u32 l4_len = bpf_ntohs(ip6->payload_len);
    __u8 next = ip6->nexthdr;
    /* payload_len 0: BIG TCP (jumbo); lengths come from the skb instead. */
    int jumbo = !l4_len;

#pragma unroll
    for (int i = 0; i < IPV6_EXT_MAX; i++) {
        __u32 len;

        switch (next) {
        case IPPROTO_HOPOPTS:
        case IPPROTO_ROUTING:
        case IPPROTO_DSTOPTS: {
            __u8 *ext = cursor_take(c, 2);
            if (!ext)
                return PARSE_MALFORMED;
            next = ext[0];
            len = (ext[1] + 1) * 8;
            break;
        }
        case IPPROTO_AH: {
            __u8 *ext = cursor_take(c, 2);
            if (!ext)
                return PARSE_MALFORMED;
            next = ext[0];
            len = (ext[1] + 2) * 4;
            break;
        }
        case IPPROTO_FRAGMENT: {
            struct frag_hdr *frag = cursor_take(c, sizeof(*frag));
            if (!frag)
                return PARSE_MALFORMED;
            if (bpf_ntohs(frag->frag_off) & IP6_OFFSET_MASK)
                return PARSE_OTHER;
            next = frag->nexthdr;
            len = sizeof(*frag);
            if (!jumbo && l4_len < len)
                return PARSE_MALFORMED;
            l4_len -= jumbo ? 0 : len;
            continue;
        }
        case IPPROTO_TCP:
            m->key.family = 6;
            return parse_tcp(c, frame, m, (__u32 *)&ip6->saddr, (__u32 *)&ip6->daddr,
                             jumbo ? L4_LEN_FROM_SKB : l4_len, skb_len);
        case IPPROTO_UDP:
            m->key.family = 6;
            return parse_udp(c, frame, m, (__u32 *)&ip6->saddr, (__u32 *)&ip6->daddr,
                             jumbo ? L4_LEN_FROM_SKB : l4_len, skb_len);
        default:
            return PARSE_OTHER;
        }
        /* The 2 bytes already taken are part of len. */
        if (len < 2 || (!jumbo && l4_len < len) || !cursor_take(c, len - 2))
            return PARSE_MALFORMED;
        l4_len -= jumbo ? 0 : len;
    }
    return next == IPPROTO_TCP ? PARSE_MALFORMED : PARSE_OTHER;
}

/*
 * parse_packet - parse the frame of @skb into @m. A global function: verified once, on its own
 * (inlined into classify, its branches multiplied classify's: 549k instructions verified per
 * program instead of 334k).
 * @return enum parse_result.
 */
static __always_inline int parse_packet(struct __sk_buff *skb, struct pkt_meta *m)
{
    if (!skb || !m)
        return PARSE_MALFORMED;
    void *frame = (void *)(long)skb->data;
    struct cursor c = {.pos = frame, .end = (void *)(long)skb->data_end};
    struct ethhdr *eth = cursor_take(&c, sizeof(*eth));

    if (!eth)
        return PARSE_MALFORMED;
    __u16 proto = bpf_ntohs(eth->h_proto);

#pragma unroll
    for (int i = 0; i < VLAN_MAX; i++) {
        if (proto != ETH_P_8021Q && proto != ETH_P_8021AD)
            break;
        struct vlan_hdr *vlan = cursor_take(&c, sizeof(*vlan));
        if (!vlan)
            return PARSE_MALFORMED;
        proto = bpf_ntohs(vlan->h_vlan_encapsulated_proto);
    }

    if (proto == ETH_P_IP)
        return parse_ipv4(&c, frame, m, skb->len);
    if (proto == ETH_P_IPV6)
        return parse_ipv6(&c, frame, m, skb->len);
    return PARSE_OTHER;
}

#endif /* MIRROR_PARSE_H */
