/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the dispatcher: which protocol program follows a packet's payload, and the
 * tail call to it. Each direction of a connection is classified once, and what it is kept in
 * this CPU's flow cache slot (http_kind: enum http_dir_kind, scratch.h), which the packet's
 * first lookup finds: unknown and HTTP/1.x directions go to the HTTP/1 program (which finds
 * where HTTP/2 starts), HTTP/2 directions to the HTTP/2 program, and a direction not followed
 * (TLS, or no message after HTTP_GIVE_UP segments) to none: it costs the flow cache's floor and
 * nothing more. A UDP datagram goes to the DNS program when it is to or from a DNS port and DNS
 * is followed (a dns= rule, or DNS times on); any other costs the parser alone. So does a TCP
 * direction to or from a DNS port, classified as DNS there (HTTP_DIR_DNS).
 *
 * The programs sit in proto_progs, filled by user space with the protocols it loaded (the
 * protocols: setting, protocols_enabled). A tail call whose program is missing falls through:
 * the packet is then only accounted and, if its flow is marked, copied (finish.h). Each
 * program is verified on its own, with the stages it calls.
 */
#ifndef MIRROR_DISPATCH_H
#define MIRROR_DISPATCH_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "types.h"
#include "scratch.h"
#include "config.h"
#include "parse.h"

/*
 * Key: enum proto_prog. Value: a program (fd from user space). Filled after load, never
 * adopted from an earlier agent: its programs read this load's scratch layout.
 */
struct {
    __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
    __uint(max_entries, PROGS_MAX);
    __type(key, __u32);
    __type(value, __u32);
} proto_progs SEC(".maps");

/* What classify_head found a packet to need next. */
enum dispatch_next {
    NEXT_SKIP = -1,   /* not TCP, or malformed: nothing more to do */
    NEXT_FINISH = -2, /* no protocol program: the reset, the mark and the copy (finish.h) */
    /* >= 0: the enum proto_prog to tail call */
};

/* protocol_on - was the program of @prog (enum proto_prog) loaded? Known before verification. */
static __always_inline int protocol_on(__u32 prog)
{
    return protocols_enabled & (1U << prog);
}

/* The kinds of rules that may trigger on a DNS message: dns=, and noresponse> for a query. */
#define DNS_RULE_KINDS ((1 << TRIGGER_DNS) | (1 << TRIGGER_NORESPONSE))

/* dns_port - is @port one of the DNS ports (settings.dns_ports)? */
static __always_inline int dns_port(const struct settings *set, __u16 port)
{
    int hit = 0;

#pragma unroll
    for (int i = 0; i < DNS_PORTS_MAX; i++)
        hit |= port && set->dns_ports[i] == port;
    return hit;
}

/*
 * dns_followed - does the UDP datagram of @m go to the DNS program? When the program was
 * loaded, DNS is followed (a dns= or noresponse> rule, or DNS times on) and either port is a
 * DNS port.
 */
static __always_inline int dns_followed(const struct settings *set, const struct pkt_meta *m)
{
    if (!set || !protocol_on(PROG_DNS) ||
        !((set->kinds & DNS_RULE_KINDS) || (set->timing & TIMING_DNS)))
        return 0;
    return dns_port(set, m->src_port) || dns_port(set, m->dst_port);
}

/*
 * dispatch_next - the program that follows a TCP payload of @m's flow in @fs (may be NULL), from
 * what its direction was classified as: a direction not classified yet to or from a DNS port
 * goes to the DNS program (DNS over TCP), which classifies it so.
 * @set: the settings (may be NULL): no rule and no HTTP timing need HTTP followed.
 */
static __always_inline int dispatch_next(const struct flow_cache_slot *fs, const struct pkt_meta *m,
                                         const struct settings *set)
{
    __u8 kind = fs ? fs->http_kind[m->dir & 1] : HTTP_DIR_UNKNOWN;

    if (kind == HTTP_DIR_DNS || (kind == HTTP_DIR_UNKNOWN && dns_followed(set, m)))
        return protocol_on(PROG_DNS) ? PROG_DNS : NEXT_FINISH;
    if (!set || (!set->kinds && !(set->timing & TIMING_HTTP)))
        return NEXT_FINISH;
    if (kind == HTTP_DIR_OTHER)
        return NEXT_FINISH;
    if (kind == HTTP_DIR_H2 && protocol_on(PROG_HTTP2))
        return PROG_HTTP2;
    return protocol_on(PROG_HTTP1) ? PROG_HTTP1 : NEXT_FINISH;
}

/*
 * dispatch_reset - a TCP RST (@flags) while some rule is a reset rule goes to the reset stage
 * (its payload, which TCP discards, is not followed); else @next.
 */
static __always_inline int dispatch_reset(__u8 flags, const struct settings *set, int next)
{
    if ((flags & TCP_FLAG_RST) && set && (set->kinds & (1 << TRIGGER_RESET)))
        return PROG_RESET;
    return next;
}

/*
 * dispatch - tail call the program @next names (enum proto_prog). Constant keys: the JIT makes
 * each a direct jump. Returns only when there is no such program (the caller finishes).
 */
static __always_inline void dispatch(struct __sk_buff *skb, int next)
{
    if (next == PROG_HTTP1)
        bpf_tail_call_static(skb, &proto_progs, PROG_HTTP1);
    else if (next == PROG_HTTP2)
        bpf_tail_call_static(skb, &proto_progs, PROG_HTTP2);
    else if (next == PROG_RESET)
        bpf_tail_call_static(skb, &proto_progs, PROG_RESET);
    else if (next == PROG_DNS)
        bpf_tail_call_static(skb, &proto_progs, PROG_DNS);
}

/*
 * verdict - what an entry or protocol program returns: "continue" for the direct-action
 * programs (TC_ACT_UNSPEC and TCX_NEXT are both -1), and for the classic filters carrying
 * act_mirred a match when the packet is to be copied.
 */
static __always_inline int verdict(__u32 method, int mirrored)
{
    if (method == MIRROR_MIRRED)
        return mirrored ? CLS_MATCH : CLS_NO_MATCH;
    return TC_ACT_UNSPEC;
}

#endif /* MIRROR_DISPATCH_H */
