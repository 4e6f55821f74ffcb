/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains every map of the classifier but the knobs (config.h), and the counters the
 * programs advance beside the maps they serve. Key/Value and the reason for each type are given
 * per map. User space sizes flow_table, flow_timing, flow_timing_index, flow_nat (flows_max),
 * pending_flows (flows_max / 64),
 * mirror_marks (flows.marks_max), request_replay (replay_requests) and events before load:
 * their sizes here are placeholders, never used.
 */
#ifndef MIRROR_MAPS_H
#define MIRROR_MAPS_H

#include "types.h"
#include "scratch.h"
#include "shared_maps.h"
#include "config.h"

/*
 * Key: struct flow_key. Value: struct flow_traffic, one copy per CPU.
 * Per-CPU LRU: counters are updated without atomics and a flood of new flows evicts the
 * least recently used entries instead of failing. Summed across CPUs in user space.
 */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct flow_key);
    __type(value, struct flow_traffic);
} flow_table SEC(".maps");

/*
 * Key: struct flow_key. Value: struct mirror_mark.
 * Shared (not per-CPU) so that a mark is seen at once by the CPU handling the other
 * direction. Only triggers insert here, so new flows cannot push marks out.
 */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, struct flow_key);
    __type(value, struct mirror_mark);
} mirror_marks SEC(".maps");

/*
 * Key: struct flow_key, the lesser of a connection's keys. Value: when it was claimed (ns).
 * A trigger claims its connection here before it replays the request behind it and frees the
 * claim once the flow is marked (trigger.h): of two CPUs triggering one connection at once,
 * only the holder replays and marks. An entry lives within one program run, so a few per
 * CPU are plenty; when it is full, a trigger goes on unclaimed.
 */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 512);
    __type(key, struct flow_key);
    __type(value, __u64);
} trigger_claims SEC(".maps");

/*
 * Key: slot. Value: struct flow_timing, owned by the flow in its key.
 * Handshake times, each direction's HTTP framing (where the next message starts) and the
 * requests awaiting answers, written in place and read on any CPU. Packets with a payload,
 * SYNs and early ACKs use it; a slot is taken by the first HTTP message or SYN of a flow.
 * An array, not a hash: each CPU's flow entry remembers the slot (flow_traffic.timing_slot),
 * so a packet reaches it by an inlined array lookup, validated by the owner's key, instead of
 * hashing its key a second time (timing.h).
 */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct flow_timing);
} flow_timing SEC(".maps");

/*
 * Key: struct flow_key. Value: its flow_timing slot.
 * Exactly the owners of slots: an entry is added when a flow takes a slot and deleted when the
 * slot passes to another flow, so it never holds more entries than there are slots. Read when
 * a CPU meets a flow the first time, and for the other key of a translated connection.
 */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, struct flow_key);
    __type(value, __u32);
} flow_timing_index SEC(".maps");

/* The allocator's hand: the next flow_timing slot it looks at (modulo flows_max). */
volatile __u32 timing_next SEC(".data") = 0;

/*
 * Key: struct flow_key. Value: struct flow_nat.
 * The two keys of a connection translated by conntrack, each pointing to the other. Written
 * when a flow is created (or a response or trigger needs it), read by responses and triggers.
 */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct flow_key);
    __type(value, struct flow_nat);
} flow_nat SEC(".maps");

/* Key: 0. Value: struct zero_values, the initial values of new flow_table entries and
 * flow_timing slots (too large for the stack). Never written. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct zero_values);
} zero_values SEC(".maps");

/* Key: 0. Value: struct nat_scratch, per CPU: the conntrack lookup's buffers. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct nat_scratch);
} nat_scratch SEC(".maps");

/*
 * Key: struct flow_key. Value: struct h2_conn.
 * The HPACK table state of each direction of an HTTP/2 connection (hpack.h), and a header
 * block split across segments (h2.h). Created when a direction is found speaking HTTP/2; an
 * LRU, so that connections that ended without a word give way.
 */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, H2_CONNS_MAX);
    __type(key, struct flow_key);
    __type(value, struct h2_conn);
} h2_conns SEC(".maps");

/*
 * Key: bucket. Value: struct h2_stream_bucket (H2_STREAM_WAYS streams).
 * The HTTP/2 requests awaiting their responses (and trailers), one per stream, under the key
 * their request was seen with (h2_streams.h): streams of one connection are answered in any
 * order, which the flow's HTTP/1.x queue (flow_timing) cannot say. Freed at the stream's end.
 */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, H2_STREAM_BUCKETS);
    /* Values from a page's start: each bucket's heads in one cache line. */
    __uint(map_flags, BPF_F_MMAPABLE);
    __type(key, __u32);
    __type(value, struct h2_stream_bucket);
} h2_streams SEC(".maps");

/* Key: 0. Value: struct http_scratch, per CPU: the HTTP stage's buffers. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct http_scratch);
} http_scratch SEC(".maps");

/*
 * Key: HTTP status (0..599), or a pseudo-status (the other kinds below 100, the kernel's drop
 * reasons from DROP_REASON_BASE). Value: struct rule_entry of the rules covering it.
 * Indexed by status so that a lookup costs the same with 1 or 10,000 rules.
 */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, RULE_STATUS_SLOTS);
    __type(key, __u32);
    __type(value, struct rule_entry);
} status_rules SEC(".maps");

/*
 * Key: struct port_status_key. Value: struct rule_entry. Rules scoped to a server port; and in
 * each scope of selected rules (scope.h), every key of its rules, any port's too, compiled with
 * the rules that reach everywhere: a lookup in a scope needs no other.
 */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, struct port_status_key);
    __type(value, struct rule_entry);
} port_rules SEC(".maps");

/*
 * Key: port / 64. Value: bit (port % 64) set when port_rules has entries for that port.
 * An inlined array lookup spares the hash lookup for responses from ports without rules.
 */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, PORT_BITMAP_WORDS);
    __type(key, __u32);
    __type(value, __u64);
} port_rule_bits SEC(".maps");

/*
 * Key: ifindex. Value: the scope of the rules the pod behind it selects (scope.h): the
 * port_status_key.scope of its entries in port_rules. No entry: scope 0, the rules that reach
 * everywhere. Read only while settings.scoped says some interface has an entry.
 */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, IFACE_SCOPES_MAX);
    __type(key, __u32);
    __type(value, __u32);
} iface_scopes SEC(".maps");

/*
 * Key: rule slot. Value: struct rule_filter, a rule with request filters (filter.h), listed by
 * the rule_entry of each key it covers. A hash: few rules have filters.
 */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, RULE_FILTERS_MAX);
    __type(key, __u32);
    __type(value, struct rule_filter);
} rule_filters SEC(".maps");

/* Key: rule slot. Value: triggers of that rule, per CPU. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, RULE_SLOTS);
    __type(key, __u32);
    __type(value, __u64);
} rule_hits SEC(".maps");

/* Key: 0. Value: struct counters, per CPU (one lookup serves every counter of a packet). */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct counters);
} stats SEC(".maps");

/*
 * Key: ifindex % IFACE_CACHE_SLOTS. Value: (epoch << 32) | (ifindex << 1) | attached at
 * ingress: what attached_ifaces said of that ifindex when attach_epoch was epoch. Spares the
 * egress of forwarded packets a hash lookup; written by the classifier on a miss only.
 */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, IFACE_CACHE_SLOTS);
    __type(key, __u32);
    __type(value, __u64);
} iface_cache SEC(".maps");

/* Key: 0. Value: changed by user space after each change of attached_ifaces (its only
 * writer), which makes every iface_cache entry stale. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} attach_epoch SEC(".maps");

/* One struct trigger_event per trigger; triggers are rare, 256 KiB holds ~1,300. */
struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 256 * 1024);
} events SEC(".maps");

/*
 * Bumped by 2 by every trigger: odd, so never the 0 a marked flow's entry holds. A flow whose
 * per-CPU entry saw the current value unmarked cannot have been marked since, so most packets
 * skip the shared mirror_marks lookup. User space sets a fresh odd starting value at each
 * load, so that entries adopted from an earlier instance look again.
 */
volatile __u32 mark_epoch SEC(".data") = 1;

/*
 * Key: slot. Value: struct replay_slot, the segment of a flow's latest request (replay.h).
 * replay_requests slots (at least 1); handed out in turn, so a flow keeps its slot until as
 * many flows started requests after it.
 */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 4096);
    __type(key, __u32);
    __type(value, struct replay_slot);
} request_replay SEC(".maps");

/*
 * Key: struct dns_key (the flow as the query was seen, and its id). Value: struct dns_query.
 * LRU: a query never answered ages out instead of filling the map (dns.h).
 */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, DNS_QUERIES_MAX);
    __type(key, struct dns_key);
    __type(value, struct dns_query);
} dns_queries SEC(".maps");

/* Key: 0. Value: DNS responses by response code, per CPU (summed in user space). */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct dns_rcode_counts);
} dns_rcodes SEC(".maps");

/* How many request_replay slots were handed out: the next is replay_next & replay_mask(). User
 * space starts it at a fresh value at each load, so that numbers adopted from an earlier
 * instance are not taken for recent ones. */
volatile __u32 replay_next SEC(".data") = 0;

/*
 * Key: flow_timing slot / 64. Value: bit (slot % 64) set while the flow of the slot may have a
 * request pending, for the no-response tick (noresponse.h). Sized from flows_max (one word per
 * 64 slots); not pinned: a hint the tick rebuilds from the requests that come.
 */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1024);
    __type(key, __u32);
    __type(value, __u64);
} pending_flows SEC(".maps");

/* The no-response tick: one timer for the node. */
struct noresponse_timer {
    struct bpf_timer timer;
    __u32 running; /* started and not stopped (32 bits for cmpxchg) */
    __u32 cursor;  /* the pending_flows word the next tick starts from */
    __u32 ticks;   /* ticks run: DNS queries are looked at every NORESPONSE_DNS_EVERY */
    __u32 _pad;
};

/* Key: 0. Value: struct noresponse_timer. Not pinned: a timer calls back into the programs of
 * the load that started it. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct noresponse_timer);
} noresponse_timer SEC(".maps");

/* Key: 0. Value: struct budget_state. Per CPU: each CPU spends its own share, no shared writes. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct budget_state);
} budget_state SEC(".maps");

#endif /* MIRROR_MAPS_H */
