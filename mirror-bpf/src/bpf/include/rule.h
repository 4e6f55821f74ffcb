/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the rules as the data path sees them: which rule, if any, matches a
 * response of a given status from a given server port in a given time. Looked up by (port,
 * status) and by status in maps user space writes (rule_maps.rs): constant in the number of
 * rules.
 */
#ifndef MIRROR_RULE_H
#define MIRROR_RULE_H

#include "maps.h"

/* rule_pick - the rule of @e that matches a response that took @took ns (0: unknown). */
static __always_inline struct rule_action *rule_pick(struct rule_entry *e, __u64 took)
{
    if (!e)
        return NULL;
    if (e->any.rule_id)
        return &e->any;
    if (e->slow.rule_id && took && took >= e->slow.min_latency_ns)
        return &e->slow;
    return NULL;
}

/*
 * rule_lookup - the rule matching @status answered from server port @port in @took ns.
 * Port-scoped rules win over global ones. Cost: two array lookups, and a hash lookup only for
 * ports that have port-scoped rules.
 * @return the action, or NULL.
 */
static __always_inline struct rule_action *rule_lookup(__u16 port, __u16 status, __u64 took)
{
    __u32 word = port / 64;
    __u64 *bits = bpf_map_lookup_elem(&port_rule_bits, &word);

    if (bits && (*bits & (1ULL << (port % 64)))) {
        struct port_status_key k = {.port = port, .status = status};
        struct rule_action *ra = rule_pick(bpf_map_lookup_elem(&port_rules, &k), took);
        if (ra)
            return ra;
    }
    __u32 idx = status;
    return rule_pick(bpf_map_lookup_elem(&status_rules, &idx), took);
}

#endif /* MIRROR_RULE_H */
