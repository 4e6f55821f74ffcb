// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The classifier on each container's host-side veth, at ingress and egress.
 *
 * Per packet: parse to a canonical flow key (parse.h); count it in this CPU's flow cache slot
 * (flow.h); follow the HTTP stream where a message can begin (http.h), timing each answer
 * (timing.h) and deciding what it makes of the flow (decide.h: a rule matched marks the flow,
 * trigger.h), or, on HTTP/2 connections, every frame (h2.h) and header block (hpack.h, decided in
 * h2_decide.h), a reset too; DNS over UDP (dns.h, decided in dns_decide.h); then, when the flow
 * is marked (mark.h), copy the packet to the mirror interface (mirror.h), within its budget. A
 * request left unanswered is decided by a timer, not a packet (noresponse.h), a packet the
 * kernel dropped by the kfree_skb tracepoint (drop.h), off the packets' path.
 *
 * Fail-open: every entry point returns "continue" (TC_ACT_UNSPEC / TCX_NEXT, both -1), so
 * the production packet and any filter after ours always go on, whatever happens here.
 * Exactly once: at egress, a packet that came in through an attached ingress was handled there
 * (egress_seen, in the entry program: most packets at a pod's egress are such).
 */
#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>

#include "include/compat.h"
#include "include/types.h"
#include "include/scratch.h"
#include "include/config.h"
#include "include/maps.h"
#include "include/parse.h"
#include "include/clock.h"
#include "include/flow.h"
#include "include/nat.h"
#include "include/timing.h"
#include "include/mark.h"
#include "include/mirror.h"
#include "include/http.h"
#include "include/replay.h"
#include "include/ifaces.h"
#include "include/stream.h"
#include "include/dispatch.h"
#include "include/finish.h"
#include "include/decide.h"
#include "include/dns_decide.h"
#include "include/tick.h"
#include "include/drop.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/*
 * stack_stamp_tc - the packet reached our tc ingress: add the time to the stamp the tracing
 * programs put on it at netif_receive_skb (kernel stack latency, when that group is on).
 */
static __always_inline void stack_stamp_tc(struct __sk_buff *ctx)
{
    struct sk_buff *skb = bpf_cast_to_kern_ctx(ctx);
    __u64 key = (__u64)skb;
    struct skb_stamp *st = bpf_map_lookup_elem(&skb_stamps, &key);

    if (st && !st->tc_ns && st->ifindex == skb->skb_iif)
        st->tc_ns = bpf_ktime_get_ns();
}

/* Force the types that only user space reads into BTF, hence into the skeleton. */
struct trigger_event _trigger_event = {};
struct counters _counters = {};
struct hist_key _hist_key = {};
enum hist_kind _hist_kind = 0;
enum timing_group _timing_group = 0;
enum mirror_limits _mirror_limits = 0;
enum hook_kind _hook_kind = 0;
enum flow_dir _flow_dir = 0;
enum stat_idx _stat_idx = 0;
struct flow_nat _flow_nat = {};
struct replay_slot _replay_slot = {};
enum replay_keep _replay_keep = 0;
enum trigger_kind _trigger_kind = 0;
enum trigger_side _trigger_side = 0;
enum trigger_request _trigger_request = 0;
enum http_method _http_method = 0;
enum proto_prog _proto_prog = 0;
struct rule_filter _rule_filter = {};
enum http_proto _http_proto = 0;
struct dns_rcode_counts _dns_rcode_counts = {};

/*
 * egress_seen - did @skb, at egress, come in through an interface where our ingress runs? Then
 * it was classified there: counted as a duplicate and skipped. Inlined into the egress entry
 * programs, so that a duplicate costs no call into classify.
 */
static __always_inline int egress_seen(struct __sk_buff *skb)
{
    __u32 iif = skb->ingress_ifindex, zero = 0;

    if (!iif || !ingress_attached(iif))
        return 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    if (cnt) {
        cnt->v[STAT_PACKETS]++;
        cnt->v[STAT_BYTES] += skb->len;
        cnt->v[STAT_DUPLICATE]++;
    }
    return 1;
}

/*
 * classify_head - what every packet costs before its payload is followed: count it, parse it
 * (parse.h), account it in this CPU's flow cache slot (flow.h), learn a new flow's other tuple
 * across NAT (nat.h), time a handshake (timing.h), and choose the protocol program that follows
 * its payload, if any (dispatch.h). A global function: verified once per entry program.
 * @hook: enum hook_kind, where the program is attached.
 * @method: enum mirror_method, whether the copy is made here (clone) or by act_mirred.
 * @return enum dispatch_next, or the enum proto_prog to tail call.
 */
static __always_inline int classify_head(struct __sk_buff *skb, __u32 hook, __u32 method)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !cnt)
        return NEXT_SKIP;
    cnt->v[STAT_PACKETS]++;
    cnt->v[STAT_BYTES] += skb->len;
    if (hook == HOOK_INGRESS && stack_stamps)
        stack_stamp_tc(skb);

    struct http_scratch *hs = scratch_get();
    if (!hs)
        return NEXT_SKIP;
    /* Not zeroed: the parser writes every field a packet's stages read (the key's padding
     * too). */
    struct pkt_meta *m = &hs->meta;
    int res = parse_packet(skb, m);
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);
    /* UDP that is not DNS followed costs this much and no more. */
    if (res == PARSE_UDP && !dns_followed(set, m))
        res = PARSE_OTHER;
    if (res != PARSE_TCP && res != PARSE_UDP) {
        cnt->v[res == PARSE_OTHER ? STAT_NON_TCP : STAT_MALFORMED]++;
        return NEXT_SKIP;
    }
    m->hook = hook;
    m->method = method;

    /* One time per packet serves flow times, mark limits and timing: its sender's stamp
     * when it has one, else one clock read (clock.h). */
    __u64 now = m->now = packet_time(skb);
    int created = 0;
    struct flow_cache_slot *fs = flow_account(m, skb->len, now, &created);
    /* DNS: a response finds its query across NAT itself (dns.h), a query needs no lookup.
     * (Asked of the key, not of res: the verifier then walks one path through the above.) */
    if (m->key.proto == IPPROTO_UDP)
        return PROG_DNS;

    /* A new flow: is it one side of a translated connection? Not on a SYN: conntrack has no
     * entry before the SYN has passed the node. */
    if (created && (m->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
        nat_learn(skb, m);

    /* A payload is followed even on marked flows: their response times count too. */
    if (m->payload_len)
        return dispatch_reset(m->tcp_flags, set, dispatch_next(fs, m, set));
    if (handshake_packet(m, fs))
        timing_handshake(skb, m, fs);
    return dispatch_reset(m->tcp_flags, set, NEXT_FINISH);
}

/*
 * classify - an entry program's work: the head, then the protocol program (a tail call: it
 * finishes the packet itself), or, when there is none, the finish here.
 * @return 1 when the packet is to be mirrored (it was not handed to a protocol program).
 */
static __always_inline int classify(struct __sk_buff *skb, __u32 hook, __u32 method)
{
    int next = classify_head(skb, hook, method);

    if (next == NEXT_SKIP)
        return 0;
    dispatch(skb, next);
    struct http_scratch *hs = scratch_get();
    return hs ? packet_finish(skb, hs, slot_get(&hs->meta), counters_get()) : 0;
}

/* clsact + cls_bpf in direct-action mode. */
SEC("tc")
int tc_ingress_mirror(struct __sk_buff *skb)
{
    classify(skb, HOOK_INGRESS, MIRROR_CLONE);
    return TC_ACT_UNSPEC;
}

SEC("tc")
int tc_egress_mirror(struct __sk_buff *skb)
{
    if (!egress_seen(skb))
        classify(skb, HOOK_EGRESS, MIRROR_CLONE);
    return TC_ACT_UNSPEC;
}

/*
 * TCX links (kernel 6.6+), attached at the head of the chain. Loaded as plain tc programs
 * (expected attach type none) and attached as TCX by user space: a program array holds
 * programs of one attach type only, and these share theirs with the tc ones.
 */
SEC("tc")
int tcx_ingress_mirror(struct __sk_buff *skb)
{
    classify(skb, HOOK_INGRESS, MIRROR_CLONE);
    return TCX_NEXT;
}

SEC("tc")
int tcx_egress_mirror(struct __sk_buff *skb)
{
    if (!egress_seen(skb))
        classify(skb, HOOK_EGRESS, MIRROR_CLONE);
    return TCX_NEXT;
}

/*
 * Classic cls_bpf (not direct action) carrying "action mirred egress mirror": a match makes
 * the action copy the packet. The action's control is "continue", so later filters still run.
 */
SEC("tc")
int tc_ingress_mirred(struct __sk_buff *skb)
{
    return classify(skb, HOOK_INGRESS, MIRROR_MIRRED) ? CLS_MATCH : CLS_NO_MATCH;
}

SEC("tc")
int tc_egress_mirred(struct __sk_buff *skb)
{
    if (egress_seen(skb))
        return CLS_NO_MATCH;
    return classify(skb, HOOK_EGRESS, MIRROR_MIRRED) ? CLS_MATCH : CLS_NO_MATCH;
}

/*
 * The protocol programs, tail-called by the entry programs above (dispatch.h) with the packet
 * parsed in the scratch area, each verified on its own. Each ends the packet's path (finish.h)
 * and returns the entry program's verdict.
 */
SEC("tc")
int proto_http1(struct __sk_buff *skb)
{
    struct http_scratch *hs = scratch_get();

    if (!hs)
        return TC_ACT_UNSPEC;
    struct flow_cache_slot *fs = slot_get(&hs->meta);
    struct counters *cnt = counters_get();
    if (MIRROR_PROFILE_STOP != PROFILE_STOP_DISPATCH && http1_stage(skb, hs, fs, cnt) == PROG_HTTP2)
        bpf_tail_call_static(skb, &proto_progs, PROG_HTTP2);
    return verdict(hs->meta.method, packet_finish(skb, hs, fs, cnt));
}

/* The reset stage: a RST decided against the reset rules (decide.h), then finished. */
SEC("tc")
int stage_reset(struct __sk_buff *skb)
{
    struct http_scratch *hs = scratch_get();

    if (!hs)
        return TC_ACT_UNSPEC;
    struct flow_cache_slot *fs = slot_get(&hs->meta);
    decide_reset(skb, hs, fs, hs->meta.hook);
    return verdict(hs->meta.method, packet_finish(skb, hs, fs, counters_get()));
}

SEC("tc")
int proto_http2(struct __sk_buff *skb)
{
    struct http_scratch *hs = scratch_get();

    if (!hs)
        return TC_ACT_UNSPEC;
    struct flow_cache_slot *fs = slot_get(&hs->meta);
    struct counters *cnt = counters_get();
    if (h2_stage(skb, hs, fs, cnt) == PROG_HTTP1)
        bpf_tail_call_static(skb, &proto_progs, PROG_HTTP1);
    return verdict(hs->meta.method, packet_finish(skb, hs, fs, cnt));
}

/* The DNS program: a DNS message over UDP or TCP (dns_decide.h), then finished. */
SEC("tc")
int proto_dns(struct __sk_buff *skb)
{
    struct http_scratch *hs = scratch_get();

    if (!hs)
        return TC_ACT_UNSPEC;
    struct flow_cache_slot *fs = slot_get(&hs->meta);
    int kept = dns_stage(skb, hs, fs) == 2;
    int copied = packet_finish(skb, hs, fs, counters_get());
    if (kept && copied)
        dns_query_copied(hs);
    return verdict(hs->meta.method, copied);
}

/*
 * noresponse_tick_start - starts the no-response tick (noresponse.h) unless it runs: run by
 * user space (BPF_PROG_RUN) when the rules come to include a noresponse rule.
 * @return 1 when started now, 0 when it ran already or could not start (counted).
 */
SEC("syscall")
int noresponse_tick_start(void *ctx)
{
    return noresponse_start();
}

/*
 * The replay program, on the mirror interface's egress: turns the clone the classifier sends
 * it at a trigger into the request kept before it (replay.h); copies pass untouched.
 */
SEC("tc")
int tc_replay(struct __sk_buff *skb)
{
    return replay_reshape(skb);
}

SEC("tcx/egress")
int tcx_replay(struct __sk_buff *skb)
{
    return replay_reshape(skb);
}

/*
 * The kernel dropped a packet (kfree_skb with its reason, 5.17+): a pod's is counted, and marks
 * its flow when a drop rule asks (drop.h). Attached by user space beside the classifier; it
 * shares the classifier's maps, so it lives in its object.
 */
SEC("tp_btf/kfree_skb")
int BPF_PROG(drop_trace, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
    drop_seen(skb, (__u64)location, (__u32)reason);
    return 0;
}
