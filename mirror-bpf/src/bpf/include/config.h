/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains every knob user space sets, in one place: the globals it writes (through
 * the mmapped .data, or .rodata before load) and the maps of settings it writes. Each knob is
 * named as its configuration key, and says which key it is and who sets it.
 *
 * The values written here are placeholders, not defaults: user space sets every global at
 * load, before a packet is seen. The defaults live in mirror-bpf (DatapathOptions, Tracing,
 * TimingGroup), where the agent's configuration takes them from. Each placeholder is 0, which
 * for flows_max and replay_requests switches their feature off rather than passing for a size.
 *
 * The maps are pinned with the others: an agent started again adopts their values, then sets
 * its own. The globals are not pinned: each load starts them afresh.
 *
 * Not here: what the programs advance themselves (mark_epoch, timing_next, replay_next:
 * counters user space only starts), the rules (status_rules, port_rules, port_rule_bits, and
 * iface_scopes: which interfaces select which rules) and the attached interfaces
 * (attached_ifaces, attach_epoch), beside the maps they belong to in maps.h and shared_maps.h. Map sizes are set before load too (maps.h says which), two of
 * them from the knobs below: flows_max and replay_requests.
 *
 * The classifier and the tracing programs are two objects: each gets the globals of its own
 * section, the tracing programs' where MIRROR_TRACING_PROGRAMS is defined (tracing.bpf.c).
 */
#ifndef MIRROR_CONFIG_H
#define MIRROR_CONFIG_H

#include "types.h"

#ifndef MIRROR_TRACING_PROGRAMS

/* ---- the classifier ---- */

/* flows.max (auto resolved), set at load: entries of flow_table, flow_timing (the slots the
 * timing.h hand goes round), flow_timing_index and flow_nat. */
volatile __u32 flows_max SEC(".data") = 0;

/* mirror.replay_requests, set at load: slots of request_replay, a power of two (0: none is kept,
 * settings.replay_keep stays REPLAY_OFF). replay.h masks slot numbers with replay_mask(). */
volatile __u32 replay_requests SEC(".data") = 0;

/* mirror.deliver as the agent resolves it for the sink, set at load (0) and by
 * set_mirror_target: the flags of bpf_clone_redirect for a copy, 0 (transmitted by the mirror
 * interface) or BPF_F_INGRESS (received by it). Changed before settings.mirror_ifindex. */
volatile __u32 mirror_deliver SEC(".data") = 0;

/* latency.stack, set at load (0) and when the stack group is switched: whether packets are
 * stamped at tc ingress for the kernel stack latency (a plain load per packet). */
volatile __u32 stack_stamps SEC(".data") = 0;

/* protocols, set before load (a .rodata constant: the verifier drops what a protocol left out
 * would run): bit (1 << enum proto_prog) of each protocol program loaded. */
const volatile __u32 protocols_enabled = 0;

/* A fact of this host, set before load: the node's network namespace (inode), where the
 * classifier's interfaces are. The drop program (drop.h) sees every namespace's drops, and an
 * ifindex means an attached interface only in this one. */
const volatile __u32 node_netns = 0;

/* Key: 0. Value: struct settings (types.h): mirror_ifindex (the sink of mirror.interface),
 * timing (latency.http, latency.handshake), replay_keep (from the rules, when
 * mirror.replay_requests keeps any), replay_ifindex (where replays run), kinds and scoped (from
 * the rules and the interfaces that select some). Read per packet, changed by user space at
 * any time. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct settings);
} settings SEC(".maps");

/* Key: 0. Value: struct budget_config, this CPU's share of mirror.budget (the same on every
 * CPU), written by user space at start. Read only when a copy is about to be made. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct budget_config);
} budget_config SEC(".maps");

#else /* MIRROR_TRACING_PROGRAMS */

/* ---- the tracing programs ---- */

/* latency.stack_sample, set at load and by set_stack_sample: 1 in stack_sample packets received
 * in the node is stamped (0 or 1: every packet). Stamping costs a hash insert and delete per
 * packet; a sample gives the same per-stage distributions for a fraction of that. */
volatile __u32 stack_sample SEC(".data") = 0;

/* Not settings, facts of this host that user space writes before load: */

/* The node's network namespace (inode): ifindexes are only unique within one. */
const volatile __u32 node_netns = 0;

/* Whether the kernel has the sock_send_length and sock_recv_length tracepoints (6.3+). Without
 * them only the send and recv calls count. */
const volatile __u32 sock_length_tps = 0;

#endif /* MIRROR_TRACING_PROGRAMS */

/* ---- profiling builds: not a knob ---- */

/* MIRROR_PROFILE_STOP, from MIRROR_BPF_PROFILE_STOP at build time (build.rs): a build for the
 * benchmark's ladder whose HTTP/1 program stops at a stage, to measure what each part of a
 * message's work costs (docs/benchmarks.md). Such a build follows no message. */
#ifndef MIRROR_PROFILE_STOP
#define MIRROR_PROFILE_STOP 0
#endif
#define PROFILE_STOP_DISPATCH 1 /* the HTTP/1 program is entered, reads nothing, finishes */
#define PROFILE_STOP_SEGMENT 2  /* it reads where the stream stands and a message's first bytes */

#endif /* MIRROR_CONFIG_H */
