/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the rules as the data path sees them: which rule, if any, matches a
 * trigger of a kind (a response's status, a reset, a request unanswered) from a given server
 * port, a given time after its request, for a given request. Looked up by (port, status) and by
 * status in maps user space writes (rule/maps.rs), the kinds other than a status under their
 * pseudo-status (enum trigger_kind): constant in the number of rules. The rules with request
 * filters of a key are tried first (filter.h), then the others. Each lookup is made in one scope
 * (scope.h): 0, the rules that reach everywhere, in status_rules and port_rules; or a scope of
 * selected rules, whose keys (any port's too) are all in port_rules.
 */
#ifndef MIRROR_RULE_H
#define MIRROR_RULE_H

#include "maps.h"
#include "filter.h"

/* rule_filtered - the action of the rule with filters in rule_filters slot @slot (0: none). */
static __always_inline struct rule_action *rule_filtered(__u32 slot)
{
    struct rule_filter *f = slot ? bpf_map_lookup_elem(&rule_filters, &slot) : NULL;

    return f ? &f->action : NULL;
}

/* rule_unfiltered - the rule of @e without filters that matches a trigger @took ns after its
 * request (0: unknown): an unconditional one, else a timed one. */
static __always_inline struct rule_action *rule_unfiltered(struct rule_entry *e, __u64 took)
{
    if (e->any.rule_id)
        return &e->any;
    if (e->slow.rule_id && took && took >= e->slow.min_latency_ns)
        return &e->slow;
    return NULL;
}

/*
 * rule_pick - the rule of @e that matches a trigger @took ns after its request (0: unknown),
 * for the request @req (may be NULL: rules with filters do not match then), kept under @key,
 * its :authority @host (HTTP/2; NULL: its Host header, from its kept segment).
 */
static __always_inline struct rule_action *rule_pick(struct rule_entry *e, __u64 took,
                                                     const struct http_request *req,
                                                     const struct flow_key *key,
                                                     const struct host_text *host)
{
    if (!e)
        return NULL;
    if (e->filtered[0] && req) {
        struct rule_action *ra = rule_filtered(filter_pick(e, took, req, key, host));
        if (ra)
            return ra;
    }
    return rule_unfiltered(e, took);
}

/*
 * rule_entries - the entries of (@port, @status) in @scope: port-scoped in @scoped (NULL when
 * the port has no rules of its own), any port's returned. The status_rules lookup is made in
 * every scope: were it one branch and the port_rules lookup the other, the compiler could merge
 * the two into one call on either map, which the verifier then cannot inline (a call through
 * the map's operations instead of a few instructions).
 */
static __always_inline struct rule_entry *rule_entries(__u16 port, __u16 status, __u32 scope,
                                                       struct rule_entry **scoped)
{
    __u32 word = port / 64, idx = status;
    __u64 *bits = bpf_map_lookup_elem(&port_rule_bits, &word);

    *scoped = NULL;
    if (bits && (*bits & (1ULL << (port % 64)))) {
        struct port_status_key k = {.port = port, .status = status, .scope = scope};
        *scoped = bpf_map_lookup_elem(&port_rules, &k);
    }
    struct rule_entry *e = bpf_map_lookup_elem(&status_rules, &idx);
    if (scope) {
        struct port_status_key k = {.port = 0, .status = status, .scope = scope};
        e = bpf_map_lookup_elem(&port_rules, &k);
    }
    return e;
}

/*
 * rule_lookup - the rule of @scope (scope.h) matching @status (or a kind's pseudo-status) from
 * server port @port, @took ns after the request @req (may be NULL) kept under @key (its
 * :authority @host for HTTP/2, else NULL). Port-scoped rules win over any port's. Cost: two
 * array lookups (in a scope other than 0, a hash lookup instead of the second), a hash lookup
 * only for ports that have port-scoped rules, and the filters of the key's rules that have any.
 * @return the action, or NULL.
 */
static __always_inline struct rule_action *rule_lookup(__u16 port, __u16 status, __u32 scope,
                                                       __u64 took, const struct http_request *req,
                                                       const struct flow_key *key,
                                                       const struct host_text *host)
{
    struct rule_entry *scoped;
    struct rule_entry *global = rule_entries(port, status, scope, &scoped);

    if (scoped) {
        struct rule_action *ra = rule_pick(scoped, took, req, key, host);
        if (ra)
            return ra;
    }
    return rule_pick(global, took, req, key, host);
}

#endif /* MIRROR_RULE_H */
