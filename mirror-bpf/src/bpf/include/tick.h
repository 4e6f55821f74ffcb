/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the no-response tick: the one BPF timer that decides the requests left
 * unanswered, HTTP requests (noresponse.h) and DNS queries (dns_noresponse.h), and its start.
 */
#ifndef MIRROR_TICK_H
#define MIRROR_TICK_H

#include "noresponse.h"
#include "dns_noresponse.h"

/*
 * noresponse_tick - the timer: look at the flows with requests pending from where the last tick
 * stopped (and every few ticks at the DNS queries kept), then run again in NORESPONSE_TICK_NS
 * while some rule is a noresponse rule.
 */
static int noresponse_tick(void *map, __u32 *key, struct noresponse_timer *nt)
{
    __u32 zero = 0;
    struct settings *set = bpf_map_lookup_elem(&settings, &zero);
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);

    if (cnt)
        cnt->v[STAT_NORESPONSE_TICKS]++;
    if (!set || !(set->kinds & (1 << TRIGGER_NORESPONSE))) {
        nt->running = 0;
        return 0;
    }
    struct tick_walk w = {
        .now = bpf_ktime_get_ns(), .word = nt->cursor, .budget = NORESPONSE_TICK_FLOWS};
    __u32 words = (flows_max + 63) / 64;
    bpf_loop(words, tick_word, &w, 0);
    /* The whole bitmap looked at: the next tick starts over. */
    nt->cursor = w.word >= words ? 0 : w.word;
    /* The DNS queries, every few ticks (and again as soon as there is room). */
    if (!w.full && ++nt->ticks >= NORESPONSE_DNS_EVERY) {
        nt->ticks = 0;
        if (dns_noresponse_walk(w.now)) {
            w.full = 1;
            nt->ticks = NORESPONSE_DNS_EVERY;
        }
    }
    /* Stopped for room in the ring buffer: again as soon as the reader can have read. */
    bpf_timer_start(&nt->timer, w.full ? NORESPONSE_WAIT_NS : NORESPONSE_TICK_NS, 0);
    return 0;
}

/*
 * noresponse_start - start the tick, unless it runs. Run by user space (the noresponse_tick_start
 * program) whenever the rules change to include a noresponse rule: the timer's callback, the
 * tick and what it calls, are verified with that program, not with the HTTP program.
 */
static __always_inline int noresponse_start(void)
{
    __u32 zero = 0;
    struct counters *cnt = bpf_map_lookup_elem(&stats, &zero);
    struct noresponse_timer *nt = bpf_map_lookup_elem(&noresponse_timer, &zero);

    if (!cnt || !nt || __sync_val_compare_and_swap(&nt->running, 0, 1))
        return 0;
    long e = bpf_timer_init(&nt->timer, &noresponse_timer, NORESPONSE_CLOCK);
    if ((e && e != -NORESPONSE_EBUSY) || bpf_timer_set_callback(&nt->timer, noresponse_tick) ||
        bpf_timer_start(&nt->timer, NORESPONSE_TICK_NS, 0)) {
        nt->running = 0;
        cnt->v[STAT_NORESPONSE_FAILED]++;
        return 0;
    }
    return 1;
}

#endif /* MIRROR_TICK_H */
