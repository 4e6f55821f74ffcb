/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the request behind a trigger. The segment that carried each flow's latest
 * request is kept (its first REPLAY_FRAME_MAX bytes, in the flow's request_replay slot) for the
 * flows a rule could trigger on. When a response of the flow triggers, that segment reaches the
 * mirror ahead of the response: the classifier sends one more clone of the response to the
 * replay program on the sink's egress, which reshapes it into the kept segment (its Ethernet
 * source set to REPLAY_MAC, so a reader can tell it from a copy) and hands it on the way copies
 * go. Both run on this CPU in one call chain, before the response's own copy is made: readers
 * see the request first. The production packet is only read (cloned), never changed.
 */
#ifndef MIRROR_REPLAY_H
#define MIRROR_REPLAY_H

#include "maps.h"
#include "parse.h"
#include "nat.h"
#include "budget.h"

/* Ethernet source of a replayed request: 02:72:65:70:6c:79, locally administered ("\2reply"). */
#define REPLAY_MAC_0 0x02
#define REPLAY_MAC_1 0x72
#define REPLAY_MAC_2 0x65
#define REPLAY_MAC_3 0x70
#define REPLAY_MAC_4 0x6c
#define REPLAY_MAC_5 0x79

/* skb->mark of a replay the agent writes to the sink (its packet socket's SO_MARK): "rply". */
#define REPLAY_AGENT_MARK 0x72706c79

/* A slot's req while a keep writes it: no request was kept under it. */
#define REPLAY_WRITING 0xffffffffU

/*
 * replay_fence - the slot's req and its other fields stay in the order written and read around
 * it. A compiler barrier: x86 keeps stores in order, and loads in order (see replay_intact).
 */
#define replay_fence() asm volatile("" ::: "memory")

/*
 * replay_mask - the slot of hand-out number n is n & replay_mask(): replay_requests is a power
 * of two. With none (0), every lookup misses: nothing is kept then (settings.replay_keep).
 */
static __always_inline __u32 replay_mask(void)
{
    return replay_requests - 1;
}

/* replay_wanted - does a rule cover @m's server port (its destination, @m being a request)? */
static __always_inline int replay_wanted(const struct settings *set, const struct pkt_meta *m)
{
    if (set->replay_keep == REPLAY_ALL)
        return 1;
    if (set->replay_keep != REPLAY_PORTS)
        return 0;
    __u32 word = m->dst_port / 64;
    __u64 *bits = bpf_map_lookup_elem(&port_rule_bits, &word);
    return bits && (*bits & (1ULL << (m->dst_port % 64)));
}

/*
 * replay_held - is the slot of hand-out number @n - 1 (@n: a request's replay field, 0: none)
 * still its request's? Slots are handed out in turn (replay_next counts them): it is while
 * fewer than all the slots were handed out after it. Known from the counters alone.
 */
static __always_inline int replay_held(__u32 n)
{
    return n && replay_next - (n - 1) <= replay_requests;
}

/*
 * replay_slot_of - the slot of hand-out number @n - 1, kept under @key by the keep whose req
 * was @req (struct replay_slot); NULL when it is no longer that request's: handed out again,
 * or taken over by a later request of the flow (whose answer may have come while a timer was
 * reading this one's: noresponse.h).
 */
static __always_inline struct replay_slot *replay_slot_of(__u32 n, const struct flow_key *key,
                                                          __u32 req)
{
    if (!replay_held(n))
        return NULL;
    __u32 idx = (n - 1) & replay_mask();
    struct replay_slot *r = bpf_map_lookup_elem(&request_replay, &idx);
    /* Its owner wrote its key with the segment: a racing newer owner is caught here. */
    if (!r || !flow_key_eq(&r->key, key) || r->req != req)
        return NULL;
    replay_fence();
    return r;
}

/*
 * replay_intact - after reading slot @r, found by replay_slot_of for @req: was it left
 * alone meanwhile? A keep marks the slot REPLAY_WRITING before it writes, and gives it its
 * req after: whatever was read between the two reads of req is that request's.
 */
static __always_inline int replay_intact(const struct replay_slot *r, __u32 req)
{
    replay_fence();
    return *(volatile const __u32 *)&r->req == req;
}

/*
 * replay_from_scratch - the segment of a request that starts its payload, into @r: the headers
 * from the packet's linear area (loads from the packet), the payload from the @n bytes the HTTP stage
 * read already (s->buf): the payload, in the page fragments TCP hands the veth, is not read a
 * second time. Whole words are copied (up to 7 bytes past @n, never counted in r->len).
 * @return the bytes kept (0: not possible here, the caller reads the frame instead).
 */
static __always_inline __u32 replay_from_scratch(struct __sk_buff *skb, struct replay_slot *r,
                                                 const struct http_scratch *s, __u32 hdr, __u32 n)
{
    __u64 h = hdr;

    /* Opaque to the compiler, so that the bound below stays for the verifier. */
    asm volatile("" : "+r"(h));
    if (h < 1 || h > REPLAY_FRAME_MAX - HTTP_SCAN_MAX || n < 1 || n > HTTP_SCAN_MAX)
        return 0;
    /* The headers, parsed in the linear area: loads from the packet, no helper call. Whole
     * words, then the last bytes one by one (the linear area may end with the headers). */
    const __u8 *data = (const __u8 *)(long)skb->data, *end = (const __u8 *)(long)skb->data_end;
#pragma unroll
    for (int i = 0; i < (REPLAY_FRAME_MAX - HTTP_SCAN_MAX) / 8; i++) {
        if (i * 8 + 8 > h)
            break;
        if (data + i * 8 + 8 > end)
            return 0;
        *(__u64 *)(r->frame + i * 8) = *(const __u64 *)(data + i * 8);
    }
    __u32 tail = h & ~7ULL;
#pragma unroll
    for (int i = 0; i < 7; i++) {
        __u32 at = (tail + i) & (REPLAY_FRAME_MAX - HTTP_SCAN_MAX - 1);
        if (tail + i >= h)
            break;
        if (data + at + 1 > end)
            return 0;
        r->frame[at] = data[at];
    }
    __u8 *dst = r->frame + h;
    const __u64 *src = __builtin_assume_aligned(s->buf, 8);
#pragma unroll
    for (int i = 0; i < HTTP_SCAN_MAX / 8; i++) {
        if (i * 8 >= n)
            break;
        *(__u64 *)(dst + i * 8) = src[i];
    }
    return h + n;
}

/*
 * replay_load - read @skb's frame into @r from its start, up to REPLAY_FRAME_MAX bytes.
 * @return the bytes read (0: none could be).
 */
static __always_inline __u32 replay_load(struct __sk_buff *skb, struct replay_slot *r)
{
    __u64 len = skb->len < REPLAY_FRAME_MAX ? skb->len : REPLAY_FRAME_MAX;

    /* A no-op the compiler cannot drop: it bounds the register for the verifier. */
    asm volatile("%0 &= 0x3ff" : "+r"(len));
    if (len < 1 || len > REPLAY_FRAME_MAX || bpf_skb_load_bytes(skb, 0, r->frame, len))
        return 0;
    return len;
}

/*
 * replay_take - keep the whole frame of @m's packet (up to REPLAY_FRAME_MAX bytes), its
 * message at payload offset 0, in the next slot: for a message that is a packet of its own (a
 * DNS query). A global function: verified once.
 * @return the slot's hand-out number + 1 (0: not kept).
 */
__noinline __u32 replay_take(struct __sk_buff *skb, const struct pkt_meta *m)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !m || !cnt)
        return 0;
    __u32 number = __sync_fetch_and_add(&replay_next, 1);
    __u32 idx = number & replay_mask();
    struct replay_slot *r = bpf_map_lookup_elem(&request_replay, &idx);
    if (!r)
        return 0;
    r->key = m->key;
    r->req = REPLAY_WRITING;
    replay_fence();
    __u32 len = replay_load(skb, r);
    r->len = len;
    if (!len)
        return 0;
    r->req_off = m->payload_off;
    r->wire_len = skb->len;
    r->ts_ns = m->now;
    replay_fence();
    r->req = 0; /* a slot of its own: never taken over */
    cnt->v[STAT_REPLAY_KEPT]++;
    return number + 1;
}

/*
 * replay_keep - a request starts at payload offset @off of @m's segment: keep the segment (from
 * its Ethernet header, up to REPLAY_FRAME_MAX bytes; when the request starts the payload, its
 * headers and the first HTTP_SCAN_MAX bytes of the payload) for a replay. Each request pending
 * at once has a slot of its own, so that a trigger replays the very request it concerns
 * (pipelining); a request sent when none is pending takes over the slot of the flow's latest
 * (one slot per flow, as long as its requests come one at a time); the requests of one segment
 * share its slot (the segment is kept once). Inlined into its two callers (http_message,
 * h2_request), each a global function verified once: as a call of its own from a program that
 * tail-calls, it cost 20-40 ns more per request.
 * @s: the scratch area, the request's first @loaded bytes in s->buf (0: s->buf holds something
 * else, the segment is read from the packet).
 * @return the slot's hand-out number + 1, for the request's entry (0: not kept).
 */
static __always_inline __u32 replay_keep(struct __sk_buff *skb, struct http_scratch *s,
                                         struct flow_timing *t, __u32 off, __u32 loaded)
{
    __u32 zero = 0;
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (!skb || !s || !t || !set || !cnt)
        return 0;
    struct pkt_meta *m = &s->meta;
    /* A request after another in the same segment: the segment is kept already. */
    if (s->pos.replay && replay_held(s->pos.replay))
        return s->pos.replay;
    if (!replay_wanted(set, m))
        return 0;
    __u32 latest = t->req_tail ? t->req[(t->req_tail - 1) % HTTP_PIPELINE].replay : 0;
    __u32 number;
    /* Only an HTTP/1.x request takes over its queue's latest slot: after an h2c upgrade, the
     * upgrade request (answered in that queue by the 101) is still stream 1's request. And only
     * once the latest request's answer was handled to its end (req_done): until then another
     * CPU may be replaying that slot for it (this request crossed the answer on its way). */
    if (t->req_head == t->req_tail && t->req_done == t->req_tail && replay_held(latest) &&
        !(t->h2 & (1 << (m->dir & 1))))
        number = latest - 1;
    else
        number = __sync_fetch_and_add(&replay_next, 1);
    __u32 idx = number & replay_mask();
    struct replay_slot *r = bpf_map_lookup_elem(&request_replay, &idx);
    if (!r)
        return 0;
    /* Written, never read here: the slot's lines are not loaded before they are overwritten. */
    r->key = m->key;
    r->req = REPLAY_WRITING;
    replay_fence();
    __u32 len = off || !loaded ? 0 : replay_from_scratch(skb, r, s, m->payload_off, loaded);
    if (!len)
        len = replay_load(skb, r);
    if (!len) {
        r->len = 0;
        return 0;
    }
    r->len = len;
    r->req_off = m->payload_off + off;
    r->wire_len = skb->len;
    r->ts_ns = m->now;
    /* This keep's mark: the number this request takes in its flow's queue (timing_request). */
    __u32 req = t->req_tail + 1;
    replay_fence();
    r->req = req;
    cnt->v[STAT_REPLAY_KEPT]++;
    s->pos.replay = number + 1;
    s->pos.replay_req = req;
    return number + 1;
}

/*
 * replay_send - send the request kept in slot @idx under @req (struct replay_slot) to the
 * mirror, through the replay program: one clone of @skb, which the program reshapes into it.
 * Within the node-wide budget.
 */
static __always_inline void replay_send(struct __sk_buff *skb, struct http_scratch *s,
                                        const struct settings *set, const struct replay_slot *r,
                                        __u32 idx, __u32 req, struct counters *cnt)
{
    if (!set->replay_ifindex || !set->mirror_ifindex || !budget_admit(r->len))
        return;
    s->replay_arm = idx + 1;
    s->replay_arm_req = req;
    if (bpf_clone_redirect(skb, set->replay_ifindex, 0))
        cnt->v[STAT_REPLAY_FAILED]++;
    /* Still armed: no replay program ran (the clone went out unchanged). */
    else if (s->replay_arm)
        cnt->v[STAT_REPLAY_FAILED]++;
    s->replay_arm = 0;
}

/*
 * replay_trigger - the flow was just marked by a packet of it (the production packet, @skb):
 * send the request behind the trigger (ti->replay, kept under ti->replay_key: the other key
 * of a translated connection when its requests pass there) to the mirror ahead of the packet.
 * Triggers only: a clone is paid once per mark.
 * @return the request's slot (for the event), NULL when it was not kept.
 */
static __always_inline struct replay_slot *replay_trigger(struct __sk_buff *skb,
                                                          struct http_scratch *s,
                                                          const struct trigger_info *ti,
                                                          struct counters *cnt)
{
    __u32 zero = 0;
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);

    if (!set || set->replay_keep == REPLAY_OFF)
        return NULL;
    struct replay_slot *r = replay_slot_of(ti->replay, &ti->replay_key, ti->replay_req);
    if (!r || !r->len) {
        cnt->v[STAT_REPLAY_MISSED]++;
        return NULL;
    }
    /* A replay is a copy: within the node-wide budget (refusals counted there). */
    replay_send(skb, s, set, r, (ti->replay - 1) & replay_mask(), ti->replay_req, cnt);
    return r;
}

/*
 * replay_due - the flow of the mark @mk was marked without a packet (noresponse.h) and its
 * event, whose request the agent replays, was lost: the first packet after the mark, @skb,
 * sends the request behind it ahead of its own copy. Taken once, from the mark holding the
 * budget (the other key's mark of a translated connection only points to it). A global
 * function: verified once, run for that first packet only.
 */
__noinline int replay_due(struct __sk_buff *skb, struct mirror_mark *mk)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct http_scratch *s = bpf_map_lookup_elem(&http_scratch, &zero);
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);

    if (!skb || !mk || !cnt || !s || !set)
        return 0;
    struct mirror_mark *owner = mk;
    if (mk->linked) {
        mk->replay_due = 0; /* a hint only: the owner's says */
        owner = bpf_map_lookup_elem(&mirror_marks, &mk->peer);
        if (!owner)
            return 0;
    }
    __u32 n = owner->replay_due;
    if (!n || __sync_val_compare_and_swap(&owner->replay_due, n, 0) != n)
        return 0;
    __u32 idx = (n - 1) & replay_mask();
    struct replay_slot *r = bpf_map_lookup_elem(&request_replay, &idx);
    if (!r || !r->len || !replay_held(n) || r->req != owner->replay_req) {
        cnt->v[STAT_REPLAY_MISSED]++;
        return 0;
    }
    replay_send(skb, s, set, r, idx, owner->replay_req, cnt);
    return 1;
}

/*
 * replay_fix_length - the kept segment was cut at @len bytes: make its IP header say so (the
 * TCP checksum is left as it was; see docs/operations.md on checksums of copies).
 * @return 0 on success.
 */
static __always_inline int replay_fix_length(struct __sk_buff *skb, const struct replay_slot *r,
                                             __u32 len)
{
    __u32 l3 = 14;
    __u16 proto = (__u16)r->frame[12] << 8 | r->frame[13];

    if (proto == ETH_P_8021Q || proto == ETH_P_8021AD) {
        proto = (__u16)r->frame[16] << 8 | r->frame[17];
        l3 = 18;
        if (proto == ETH_P_8021Q || proto == ETH_P_8021AD) {
            proto = (__u16)r->frame[20] << 8 | r->frame[21];
            l3 = 22;
        }
    }
    if (proto == ETH_P_IP) {
        __u16 old = (__u16)r->frame[l3 + 2] | (__u16)r->frame[l3 + 3] << 8;
        __u16 now = bpf_htons(len - l3);
        if (bpf_skb_store_bytes(skb, l3 + 2, &now, 2, 0))
            return -1;
        return bpf_l3_csum_replace(skb, l3 + 10, old, now, 2);
    }
    if (proto == ETH_P_IPV6) {
        __u16 now = bpf_htons(len - l3 - 40);
        return bpf_skb_store_bytes(skb, l3 + 4, &now, 2, 0);
    }
    return -1;
}

/* replay_deliver - a replay on the sink's egress goes on to the mirror the way copies go. */
static __always_inline int replay_deliver(struct __sk_buff *skb, const struct settings *set)
{
    __u32 flags = mirror_deliver & BPF_F_INGRESS;

    /* Copies are transmitted by this interface: so is the replay, from here. */
    if (set->mirror_ifindex == skb->ifindex && !flags)
        return TC_ACT_UNSPEC;
    return bpf_redirect(set->mirror_ifindex, flags);
}

/*
 * replay_reshape - the replay program, on the sink's egress: a clone sent by replay_send
 * becomes the kept request and goes on to the mirror the way copies go; so does a replay the
 * agent wrote to the sink (REPLAY_AGENT_MARK: the request behind a noresponse mark, reshaped
 * by the agent), within the node-wide budget; any other packet (a copy passing) goes on
 * untouched. A global function: verified once.
 * @return a tc verdict: TC_ACT_UNSPEC (go on), TC_ACT_REDIRECT, or TC_ACT_SHOT for a replay
 * that could not be made (the clone is ours: nothing of production is dropped).
 */
__noinline int replay_reshape(struct __sk_buff *skb)
{
    __u32 zero = 0;
    struct http_scratch *s = bpf_map_lookup_elem(&http_scratch, &zero);
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);

    if (!skb || !s || !cnt || !set)
        return TC_ACT_UNSPEC;
    if (!s->replay_arm) {
        if (skb->mark != REPLAY_AGENT_MARK)
            return TC_ACT_UNSPEC;
        /* The agent's: counted by it (a refusal by the budget, there). */
        if (!set->mirror_ifindex || !budget_admit(skb->len))
            return TC_ACT_SHOT;
        return replay_deliver(skb, set);
    }
    __u32 idx = s->replay_arm - 1;
    s->replay_arm = 0;
    struct replay_slot *r = bpf_map_lookup_elem(&request_replay, &idx);
    __u32 req = s->replay_arm_req;
    if (!r || r->req != req)
        goto fail;
    replay_fence();
    __u64 len = r->len;
    asm volatile("%0 &= 0x3ff" : "+r"(len));
    if (len < 54 || len > REPLAY_FRAME_MAX)
        goto fail;
    if (bpf_skb_change_tail(skb, len, 0) || bpf_skb_store_bytes(skb, 0, r->frame, len, 0))
        goto fail;
    /* Taken over while it was copied (a keep on another CPU): not this request's any more. */
    if (!replay_intact(r, req))
        goto fail;
    __u8 mac[6] = {REPLAY_MAC_0, REPLAY_MAC_1, REPLAY_MAC_2,
                   REPLAY_MAC_3, REPLAY_MAC_4, REPLAY_MAC_5};
    if (bpf_skb_store_bytes(skb, 6, mac, sizeof(mac), 0))
        goto fail;
    if (r->wire_len > len && replay_fix_length(skb, r, len))
        goto fail;
    cnt->v[STAT_REPLAYED]++;
    return replay_deliver(skb, set);
fail:
    cnt->v[STAT_REPLAY_FAILED]++;
    return TC_ACT_SHOT;
}

#endif /* MIRROR_REPLAY_H */
