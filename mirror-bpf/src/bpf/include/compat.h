/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the constants the data path needs that vmlinux.h does not carry:
 * uapi #defines (tc verdicts, ethertypes) are not part of kernel BTF.
 */
#ifndef MIRROR_COMPAT_H
#define MIRROR_COMPAT_H

/* tc verdicts (uapi/linux/pkt_cls.h). TC_ACT_UNSPEC lets later filters run: we never end the chain. */
#define TC_ACT_UNSPEC (-1)
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define TC_ACT_REDIRECT 7

/* Classic (non direct-action) cls_bpf: 0 means "no match", -1 "match with the default classid". */
#define CLS_NO_MATCH 0
#define CLS_MATCH (-1)

/* Ethertypes (uapi/linux/if_ether.h), host order. */
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8

/* IPv4 fragment offset mask and "more fragments" bit, host order. */
#define IP_OFFSET_MASK 0x1FFF
#define IP_MF 0x2000

/* IPv6 extension headers missing from vmlinux.h (uapi/linux/in6.h #defines). */
#define IPPROTO_HOPOPTS 0
#define IPPROTO_ROUTING 43
#define IPPROTO_FRAGMENT 44
#define IPPROTO_DSTOPTS 60

/* IPv6 fragment header: offset is the top 13 bits of frag_off, host order. */
#define IP6_OFFSET_MASK 0xFFF8

/* errno values returned by map helpers (negated). */
#define EEXIST 17

#ifndef NSEC_PER_SEC
#define NSEC_PER_SEC 1000000000ULL
#endif

#endif /* MIRROR_COMPAT_H */
