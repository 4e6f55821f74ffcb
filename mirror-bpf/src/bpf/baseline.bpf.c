// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* An empty tc program: the baseline every per-packet cost is compared with. */
#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tc")
int tc_empty(struct __sk_buff *skb)
{
    return -1; /* TC_ACT_UNSPEC */
}

/* The same, on TCX links: the real-traffic baseline beside the classifier on the same hooks. */
SEC("tcx/ingress")
int tcx_empty_ingress(struct __sk_buff *skb)
{
    return -1; /* TCX_NEXT */
}

SEC("tcx/egress")
int tcx_empty_egress(struct __sk_buff *skb)
{
    return -1; /* TCX_NEXT */
}
