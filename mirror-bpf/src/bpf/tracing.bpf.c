// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Tracing programs, off by default and attached per group at run time.
 *
 * Group "stack" (kernel stack latency): a packet entering the node through an attached
 * interface is stamped at netif_receive_skb, keyed by its skb address; the classifier adds its
 * tc ingress time; leaving the node (net_dev_start_xmit) or being read by a local socket
 * (skb_copy_datagram_iovec) closes it into per-stage histograms, aggregated here in the
 * kernel. Freed skbs drop their stamp, since slab addresses are reused at once. Where the
 * kernel allows fexit, clones inherit their parent's stamp; else they are not followed.
 *
 * Group "cpu" (network-stack CPU cost): time in NET_RX/NET_TX softirqs and in send/receive
 * system calls, per CPU. A softirq that runs inside such a system call (on veth, the receive
 * side often does) pauses the call's clock, and so does a context switch, so nothing is
 * counted twice and sleeping is not counted.
 */
#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "include/types.h"
#include "include/scratch.h"
#define MIRROR_TRACING_PROGRAMS /* this object's knobs, not the classifier's */
#include "include/config.h"
#include "include/shared_maps.h"
#include "include/hist.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct net_cpu_time _net_cpu_time = {};

/*
 * Some skbs are freed on paths without a tracepoint (TCP frees consumed ACKs with
 * __kfree_skb), so a stamp can outlive its packet and the address go to another one. A stamp
 * only counts for a packet that entered where it was taken (skb_iif) within this age.
 */
#define STAMP_MAX_AGE_NS (1000ULL * 1000 * 1000)

/* ---- stack ---- */

/* Key: 0. Value: packets seen on this CPU, for the sampling. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} stack_sample_n SEC(".maps");

static __always_inline int stack_sampled(void)
{
    __u32 every = stack_sample, zero = 0;
    __u32 *n = every > 1 ? bpf_map_lookup_elem(&stack_sample_n, &zero) : NULL;

    if (!n)
        return 1;
    return (++*n % every) == 0;
}

static __always_inline void stamp_close(struct sk_buff *skb, __u8 kind_tc, __u8 kind_total)
{
    __u64 key = (__u64)skb;
    struct skb_stamp *st = bpf_map_lookup_elem(&skb_stamps, &key);

    if (!st)
        return;
    __u64 now = bpf_ktime_get_ns();
    if (st->ifindex != skb->skb_iif || now < st->rx_ns || now - st->rx_ns > STAMP_MAX_AGE_NS) {
        bpf_map_delete_elem(&skb_stamps, &key);
        return;
    }
    hist_add(st->ifindex, kind_total, 0, now - st->rx_ns);
    if (st->tc_ns && now >= st->tc_ns) {
        hist_add(st->ifindex, kind_tc, 0, now - st->tc_ns);
        if (st->tc_ns >= st->rx_ns)
            hist_add(st->ifindex, HIST_STACK_RX_TC, 0, st->tc_ns - st->rx_ns);
    }
    bpf_map_delete_elem(&skb_stamps, &key);
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(stack_rx, struct sk_buff *skb)
{
    struct net_device *dev = skb->dev;

    if (!dev || dev->nd_net.net->ns.inum != node_netns || !stack_sampled())
        return 0;
    __u32 ifindex = dev->ifindex;
    if (!bpf_map_lookup_elem(&attached_ifaces, &ifindex))
        return 0;
    __u64 key = (__u64)skb;
    struct skb_stamp st = {.rx_ns = bpf_ktime_get_ns(), .ifindex = ifindex};
    bpf_map_update_elem(&skb_stamps, &key, &st, BPF_ANY);
    return 0;
}

SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(stack_xmit, struct sk_buff *skb, struct net_device *dev)
{
    stamp_close(skb, HIST_STACK_TC_XMIT, HIST_STACK_XMIT);
    return 0;
}

SEC("tp_btf/skb_copy_datagram_iovec")
int BPF_PROG(stack_read, const struct sk_buff *skb, int len)
{
    stamp_close((struct sk_buff *)skb, HIST_STACK_TC_READ, HIST_STACK_READ);
    return 0;
}

static __always_inline void stamp_drop(struct sk_buff *skb)
{
    __u64 key = (__u64)skb;
    bpf_map_delete_elem(&skb_stamps, &key);
}

SEC("tp_btf/consume_skb")
int BPF_PROG(stack_consume, struct sk_buff *skb)
{
    stamp_drop(skb);
    return 0;
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(stack_free, struct sk_buff *skb)
{
    stamp_drop(skb);
    return 0;
}

/* Only loaded where fexit is allowed: the clone carries on its parent's stamp. */
SEC("fexit/skb_clone")
int BPF_PROG(stack_clone, struct sk_buff *skb, gfp_t gfp, struct sk_buff *clone)
{
    __u64 key = (__u64)skb;
    struct skb_stamp *st = bpf_map_lookup_elem(&skb_stamps, &key);

    if (st && clone) {
        __u64 ckey = (__u64)clone;
        struct skb_stamp copy = *st;
        bpf_map_update_elem(&skb_stamps, &ckey, &copy, BPF_ANY);
    }
    return 0;
}

/* ---- cpu ---- */

/* Key: 0. Value: struct net_cpu_time, per CPU. Read every second by user space. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct net_cpu_time);
} net_cpu_time SEC(".maps");

/*
 * A task inside a system call that may be network work. Its CPU time accumulates while it
 * runs (the clock pauses for softirqs and while switched out) and is charged at the exit if
 * the call was on an IP socket: send and recv calls are known to be at entry; read/write and
 * sendfile only once sock_sendmsg/sock_recvmsg report an IP socket (sock_send_length and
 * sock_recv_length), so that file I/O is not counted.
 */
struct net_task {
    __u64 start_ns; /* when the clock (re)started; 0 while paused */
    __u64 ran_ns;   /* CPU time so far */
    __u32 socket;   /* the call works on an IP socket */
    __u32 _pad;
};

/* Key: thread id. Value: struct net_task. Only threads inside such a call have an entry. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, __u32);
    __type(value, struct net_task);
} net_tasks SEC(".maps");

/* The network softirq running on this CPU: since when (0: none), and which. */
struct net_softirq {
    __u64 start_ns;
    __u32 vec;
    __u32 _pad;
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct net_softirq);
} net_softirq SEC(".maps");

/* Softirq vectors (include/linux/interrupt.h). */
#define NET_TX_SOFTIRQ 2
#define NET_RX_SOFTIRQ 3

static __always_inline struct net_cpu_time *cpu_time(void)
{
    __u32 zero = 0;
    return bpf_map_lookup_elem(&net_cpu_time, &zero);
}

/* pause_task - stop the clock of thread @tid (if in a call), keeping what ran. */
static __always_inline void pause_task(__u32 tid, __u64 now)
{
    struct net_task *t = bpf_map_lookup_elem(&net_tasks, &tid);

    if (t && t->start_ns && now >= t->start_ns) {
        t->ran_ns += now - t->start_ns;
        t->start_ns = 0;
    }
}

/* resume_task - restart the clock of thread @tid if it is in a call. */
static __always_inline void resume_task(__u32 tid, __u64 now)
{
    struct net_task *t = bpf_map_lookup_elem(&net_tasks, &tid);

    if (t && !t->start_ns)
        t->start_ns = now;
}

/* The send/receive system calls (1), and read/write/readv/writev/sendfile (2), by architecture. */
static __always_inline int net_syscall(long id)
{
#if defined(__TARGET_ARCH_x86)
    if (id == 44 || id == 45 || id == 46 || id == 47 || id == 299 || id == 307)
        return 1;
    return (id == 0 || id == 1 || id == 19 || id == 20 || id == 40) ? 2 : 0;
#elif defined(__TARGET_ARCH_arm64)
    if (id == 206 || id == 207 || id == 211 || id == 212 || id == 243 || id == 269)
        return 1;
    return (id == 63 || id == 64 || id == 65 || id == 66 || id == 71) ? 2 : 0;
#else
    return 0;
#endif
}

SEC("raw_tp/sys_enter")
int BPF_PROG(cpu_sys_enter, struct pt_regs *regs, long id)
{
    int kind = net_syscall(id);

    if (!kind || (kind == 2 && !sock_length_tps))
        return 0;
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    /* With the tracepoints, every call waits for them: only IP sockets count. */
    struct net_task t = {.start_ns = bpf_ktime_get_ns(), .socket = !sock_length_tps};
    bpf_map_update_elem(&net_tasks, &tid, &t, BPF_ANY);
    return 0;
}

SEC("raw_tp/sys_exit")
int BPF_PROG(cpu_sys_exit, struct pt_regs *regs, long ret)
{
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    struct net_task *t = bpf_map_lookup_elem(&net_tasks, &tid);

    if (!t)
        return 0;
    pause_task(tid, bpf_ktime_get_ns());
    struct net_cpu_time *c = cpu_time();
    if (c && t->socket)
        c->syscall_ns += t->ran_ns;
    bpf_map_delete_elem(&net_tasks, &tid);
    return 0;
}

#define AF_INET 2
#define AF_INET6 10

/* The call in progress reached sock_sendmsg/sock_recvmsg: it counts if the socket is IP. */
static __always_inline void confirm_socket(struct sock *sk)
{
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    struct net_task *t = bpf_map_lookup_elem(&net_tasks, &tid);
    __u16 family = sk ? sk->__sk_common.skc_family : 0;

    if (t && (family == AF_INET || family == AF_INET6))
        t->socket = 1;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(cpu_sock_send, struct sock *sk, int ret, int flags)
{
    confirm_socket(sk);
    return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(cpu_sock_recv, struct sock *sk, int ret, int flags)
{
    confirm_socket(sk);
    return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(cpu_softirq_entry, unsigned int vec)
{
    if (vec != NET_RX_SOFTIRQ && vec != NET_TX_SOFTIRQ)
        return 0;
    __u32 zero = 0;
    struct net_softirq *s = bpf_map_lookup_elem(&net_softirq, &zero);
    if (!s)
        return 0;
    __u64 now = bpf_ktime_get_ns();
    s->start_ns = now;
    s->vec = vec;
    /* Interrupted a send/receive call: its clock stops while the softirq runs. */
    pause_task((__u32)bpf_get_current_pid_tgid(), now);
    return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(cpu_softirq_exit, unsigned int vec)
{
    __u32 zero = 0;
    struct net_softirq *s = bpf_map_lookup_elem(&net_softirq, &zero);
    struct net_cpu_time *c = cpu_time();

    if (!s || !s->start_ns || s->vec != vec || !c)
        return 0;
    __u64 now = bpf_ktime_get_ns();
    if (now >= s->start_ns) {
        if (vec == NET_RX_SOFTIRQ)
            c->softirq_rx_ns += now - s->start_ns;
        else
            c->softirq_tx_ns += now - s->start_ns;
    }
    s->start_ns = 0;
    resume_task((__u32)bpf_get_current_pid_tgid(), now);
    return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(cpu_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
    __u64 now = bpf_ktime_get_ns();

    pause_task(prev->pid, now);
    resume_task(next->pid, now);
    return 0;
}
