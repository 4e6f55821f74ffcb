/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains where rules apply. A rule reaches every interface, or only the host-side
 * veths whose pod selects it, and there only the flows whose server is that pod. Interfaces
 * that select the same rules share a scope (iface_scopes: ifindex -> scope); the rule maps hold,
 * for each scope other than 0, the rules that reach everywhere compiled together with its
 * selected ones (port_rules keyed by scope, rule.h), so a lookup in a scope needs no other.
 * Scope 0 is the rules that reach everywhere alone: what every trigger looks up while no
 * interface selects rules (settings.scoped), and wherever the pod is not the flow's server.
 *
 * Decided per trigger, never per packet. Which side the pod behind the veth stands on follows
 * from the hook and from who sent the packet: tc ingress of its host-side veth sees what the
 * pod sends, egress what it receives.
 *
 * Known limitation: a request between two pods of the node is classified once, at the
 * client's veth ingress (the server's veth egress skips a packet classified already,
 * ifaces.h). A request left unanswered, or a reset the client sends, on such a flow is
 * therefore seen from the client's side only, where the server's selected rules do not apply.
 * The server's own packets (its responses, its resets) are seen at its veth's ingress.
 */
#ifndef MIRROR_SCOPE_H
#define MIRROR_SCOPE_H

#include "maps.h"

/*
 * rule_scope - the scope whose rules a trigger looks up, its packet sent by @side (enum
 * trigger_side) and seen at @hook (enum hook_kind) of @ifindex: the interface's scope when
 * the pod behind it is the flow's server (it sent the server's packet, at ingress, or received
 * the client's, at egress) and some interface selects rules; else 0. Cost while no interface
 * selects rules: one inlined array lookup.
 */
static __always_inline __u32 rule_scope(__u32 ifindex, __u32 hook, __u32 side)
{
    __u32 zero = 0;

    if (side == SIDE_SERVER ? hook != HOOK_INGRESS : side != SIDE_CLIENT || hook != HOOK_EGRESS)
        return 0;
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);
    if (!set || !set->scoped)
        return 0;
    __u32 *scope = bpf_map_lookup_elem(&iface_scopes, &ifindex);
    return scope ? *scope : 0;
}

/*
 * reset_scope - rule_scope of a reset, whose sender was found at run time. A global function:
 * the caller does not branch on the sender, whose every value would then be verified apart
 * through the rest of the decision.
 */
__noinline __u32 reset_scope(__u32 ifindex, __u32 hook, __u32 side)
{
    return rule_scope(ifindex, hook, side);
}

#endif /* MIRROR_SCOPE_H */
