/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains every type and constant shared between the BPF programs and Rust.
 * Rust reads them from the skeleton (mirror_bpf::types), never from a hand-kept copy:
 * constants are enums so that they reach BTF, and sizes are asserted on both sides.
 * Fixed-width fields only, explicit padding, ports in host order, addresses in network order.
 * What only the programs use (the per-CPU scratch area, the parsers' state) is in scratch.h.
 */
#ifndef MIRROR_TYPES_H
#define MIRROR_TYPES_H

/* Sizes that shape the maps and buffers. */
enum mirror_limits {
    /* Raw start of an HTTP request kept for events: "OPTIONS " + 64 target bytes + slack. */
    HTTP_REQUEST_HEAD_LEN = 80,
    /* Head bytes an answer copies with its request's time: one word, enough to tell a HEAD
     * (http_no_body); the rest only for a trigger's event (request_head_copy). */
    HTTP_REQUEST_PREFIX = 8,
    /* Requests of one flow awaiting their responses (pipelining), oldest first: a response
     * whose request was pushed out by the HTTP_PIPELINE-th after it names none (timing.h). */
    HTTP_PIPELINE = 8,
    /* First bytes of a message kept when its segment ends before they can be classified. */
    HTTP_PARTIAL_LEN = 16,
    /* Bytes of a message searched for the end of its header block (a power of two). */
    HTTP_SCAN_MAX = 512,
    /* Payload segments of a direction without any message before it is taken for another
     * protocol (TLS, HTTP/2, a database...) and its segments are no longer looked at. */
    HTTP_GIVE_UP = 64,
    /* Messages (or chunk-size lines) looked at in one segment: twice HTTP_PIPELINE, so that a
     * segment of pipelined requests the queue can hold, or of their answers, is read whole. */
    HTTP_SEGMENT_MSGS = 32,
    /* HTTP statuses are below this (100..599). */
    HTTP_STATUS_SLOTS = 600,
    /* A kernel drop reason r (enum skb_drop_reason of the core, r < DROP_REASONS) is the
     * pseudo-status DROP_REASON_BASE + r in the rule maps, above the HTTP statuses. */
    DROP_REASON_BASE = 600,
    DROP_REASONS = 256,
    /* status_rules is indexed by the status code itself: 0..599 (below 100: enum trigger_kind),
     * then the drop reasons. */
    RULE_STATUS_SLOTS = 856,
    /* Drop triggers one rule may make per second (the kernel's drops of a flood would otherwise
     * each mark a flow and send an event): the excess is counted (drop_limited). */
    DROP_TRIGGERS_PER_SEC = 100,
    /* (pod, reason) pairs the drops by pod hold (drop_pods entries): the pods of a node times
     * the few reasons their packets meet; the pairs beyond are counted apart (drop_pods_full). */
    DROP_PODS_MAX = 4096,
    /* Rules with request filters (method=, path=, host=) one (port, status) key may have. */
    RULE_FILTERED_MAX = 8,
    /* Rules with request filters the classifier holds at once (rule_filters entries). */
    RULE_FILTERS_MAX = 1024,
    /* Longest path= prefix and host= name of a filter. */
    RULE_FILTER_TEXT = 64,
    /* Rule hit counters are indexed by rule slot; 0 is never used. */
    RULE_SLOTS = 16384,
    /* Interfaces that may select rules at once (iface_scopes entries). */
    IFACE_SCOPES_MAX = 4096,
    /* port_rule_bits: one bit per port, 64 per word. */
    PORT_BITMAP_WORDS = 65536 / 64,
    /* Latency histogram buckets: 8 per power of two of nanoseconds, up to 2^34 ns (17 s). */
    HIST_SUB_BITS = 3,
    HIST_BUCKETS = 256,
    /* Latency histograms (interface, kind, class) the maps hold. */
    HIST_SLOTS = 4096,
    /* hist_cache: interfaces (a power of two, indexed by ifindex), and histograms of each:
     * 12 used (response classes 0-5, then the 6 other kinds), 14 to fill the 32-byte entry. */
    HIST_CACHE_IFACES = 1024,
    HIST_CACHE_KEYS = 14,
    /* iface_cache slots (a power of two), indexed by ifindex. */
    IFACE_CACHE_SLOTS = 1024,
    /* Bytes of a request's segment kept for its replay, from the frame's start: the headers
     * (up to 128 bytes) and 512 bytes of the request. */
    REPLAY_FRAME_MAX = 640,
    /* A grpc-status code c is the pseudo-status GRPC_STATUS_BASE + c in the rule maps (below
     * 100, beside enum trigger_kind); codes 0..GRPC_STATUS_CODES - 1. */
    GRPC_STATUS_BASE = 32,
    /* A DNS response code r (the header's 4 bits) is the pseudo-status DNS_RCODE_BASE + r in the
     * rule maps (below the gRPC codes); codes 0..DNS_RCODES - 1. */
    DNS_RCODE_BASE = 8,
    DNS_RCODES = 16,
    /* Bytes of a DNS question's name kept, as text ("www.example.com", no final dot): a longer
     * name is cut (and a qname= filter does not match it). */
    DNS_NAME_MAX = 80,
    /* dns_queries entries: DNS queries awaiting their responses, an LRU map (a query pushed out
     * is answered without its time, its kept segment or a noresponse mark). */
    DNS_QUERIES_MAX = 8192,
    /* Server ports a DNS rule follows (settings.dns_ports; 53 unless configured). */
    DNS_PORTS_MAX = 8,
    GRPC_STATUS_CODES = 64,
    /* Dynamic-table entries of one direction of an HTTP/2 connection remembered by value: those
     * naming :status, grpc-status, :method, :path or :authority, the latest inserted. */
    H2_TABLE_ENTRIES = 8,
    /* Bytes kept of a :path or :authority value (a path= prefix or host= name is at most
     * RULE_FILTER_TEXT). */
    H2_TEXT = 64,
    /* Bytes of a header block split across segments kept until its frame ends (larger: lost). */
    H2_BLOCK_MAX = 256,
    /* Frames looked at in one segment (more: the framing is lost, found again at a later
     * segment's start). */
    H2_SEGMENT_FRAMES = 64,
    /* Header fields read in one header block. */
    H2_BLOCK_FIELDS = 32,
    /* Insertions whose field name a direction remembers (a power of two): a table of the default
     * 4,096 bytes holds at most 128 entries (32 bytes of overhead each). */
    H2_TABLE_RING = 128,
    /* Bytes of a Huffman-coded string decoded (enough for H2_TEXT characters but the rarest). */
    H2_HUFFMAN_IN = 128,
    /* h2_conns entries (HTTP/2 connections followed at once: 2 KiB each), an LRU map, so a
     * connection pushed out is followed again from its next block (its earlier table entries
     * then unresolved); h2_streams' buckets of H2_STREAM_WAYS requests awaiting their responses
     * or trailers (1,216 bytes each: h2_streams.h). Their 6.4 MiB are in the agent's fixed
     * memory (capacity.rs). */
    H2_CONNS_MAX = 2048,
    H2_STREAM_WAYS = 4,
    H2_STREAM_BUCKETS = 2048,
    /* The buckets a connection's streams go to in turn, by their ids, before their spill
     * buckets (h2_streams.h): H2_STREAM_RING x H2_STREAM_WAYS streams of one connection. */
    H2_STREAM_RING = 32,
    /* flow_cache slots of each CPU (a power of two): 4096 x 128 bytes, 512 KiB per CPU. */
    FLOW_CACHE_SLOTS = 4096,
    /* Packets of one direction a cached flow counts before its counts are written back to
     * flow_table (which also keeps the flow's LRU entry recent). */
    FLOW_CACHE_WRITEBACK = 1024,
};

/* What a latency histogram measures. */
enum hist_kind {
    HIST_HTTP_RESPONSE = 0, /* first segment of a request to the status line of its response */
    HIST_TCP_HANDSHAKE = 1, /* SYN to the ACK that completes the handshake */
    HIST_STACK_RX_TC = 2,   /* netif_receive_skb to our tc ingress (kernel stack latency) */
    HIST_STACK_TC_XMIT = 3, /* tc ingress to leaving the node (net_dev_start_xmit) */
    HIST_STACK_TC_READ = 4, /* tc ingress to a local socket read (skb_copy_datagram_iovec) */
    HIST_STACK_XMIT = 5,    /* netif_receive_skb to leaving the node */
    HIST_STACK_READ = 6,    /* netif_receive_skb to a local socket read */
    HIST_DNS_RESPONSE = 7,  /* a DNS query to its response (class: 0) */
};

/* Which tc hook a program runs at. */
enum hook_kind {
    HOOK_INGRESS = 0,
    HOOK_EGRESS = 1,
};

/*
 * What marks a flow. A rule's kind is also its pseudo-status in the rule maps: statuses are
 * 100..599, the other kinds sit below 100, so that every kind is found by the same (port,
 * status) lookup.
 */
enum trigger_kind {
    TRIGGER_STATUS = 0,     /* a final response's status (and its response time: latency>) */
    TRIGGER_RESET = 1,      /* a TCP RST in an established HTTP connection */
    TRIGGER_NORESPONSE = 2, /* a request without the start of a response within a time */
    TRIGGER_GRPC = 3, /* a gRPC call's grpc-status (pseudo-statuses GRPC_STATUS_BASE + code) */
    TRIGGER_DNS = 4,  /* a DNS response's rcode (pseudo-statuses DNS_RCODE_BASE + rcode) */
    TRIGGER_DROP = 5, /* the kernel dropped a pod's packet (pseudo-statuses DROP_REASON_BASE +
                       * reason): drop.h */
};

/* The HTTP version of the request behind a trigger. */
enum http_proto {
    HTTP_PROTO_UNKNOWN = 0,
    HTTP_PROTO_1 = 1, /* HTTP/1.x */
    HTTP_PROTO_2 = 2, /* HTTP/2 (cleartext: prior knowledge or Upgrade: h2c) */
    PROTO_DNS = 3,    /* DNS: the question's name in the event's request_head */
};

/* The request behind a trigger, as far as the classifier can name it: never another one. */
enum trigger_request {
    REQUEST_NONE = 0,     /* none was pending (none seen, or all answered before) */
    REQUEST_KEPT = 1,     /* the one answered (reset, noresponse: pending) is named */
    REQUEST_NOT_KEPT = 2, /* it was pending, but not kept: pushed out by later requests, or
                           * which one it is became uncertain when the framing was lost */
};

/* Who sent the packet that triggered, as far as the requests tell. */
enum trigger_side {
    SIDE_UNKNOWN = 0,
    SIDE_CLIENT = 1, /* the side that sent the requests */
    SIDE_SERVER = 2,
};

/* Direction of a packet inside its flow: forward is "lo" endpoint -> "hi" endpoint. */
enum flow_dir {
    FLOW_DIR_FORWARD = 0,
    FLOW_DIR_REVERSE = 1,
    FLOW_DIRS = 2,
};

/*
 * Per-CPU counters, one slot each in struct counters. Their names, metrics and help texts are in
 * one table in Rust (COUNTERS, stats.rs), checked against this enum: a new counter goes there too.
 */
enum stat_idx {
    STAT_PACKETS = 0,          /* every packet the classifier saw */
    STAT_BYTES,                /* skb->len of those */
    STAT_NON_TCP,              /* not IPv4/IPv6 TCP, or a non-first fragment: passed untouched */
    STAT_MALFORMED,            /* truncated or inconsistent headers: passed untouched */
    STAT_DUPLICATE,            /* egress copy of a packet already seen at an attached ingress */
    STAT_HTTP_REQUESTS,        /* TCP payloads that start an HTTP/1.x request */
    STAT_HTTP_RESPONSES,       /* TCP payloads that start an HTTP/1.x status line */
    STAT_TRIGGERS,             /* responses that matched a rule and marked their flow */
    STAT_MIRRORED_PACKETS,     /* packets copied to the mirror interface (or handed to mirred) */
    STAT_MIRRORED_BYTES,       /* their bytes */
    STAT_MIRROR_ERRORS,        /* bpf_clone_redirect() failed */
    STAT_MIRROR_NO_TARGET,     /* a marked packet found no mirror interface configured */
    STAT_MIRROR_ENDED,         /* marks that reached their packet, byte or time limit */
    STAT_FLOWS_CREATED,        /* flow_table inserts (evictions = created - live - deleted) */
    STAT_FLOW_INSERT_FAILED,   /* flow_table insert failed */
    STAT_MARK_INSERT_FAILED,   /* mirror_marks insert failed: the trigger could not mark */
    STAT_TIMING_INSERT_FAILED, /* flow_timing insert failed (request or SYN not timed) */
    STAT_HIST_INSERT_FAILED,   /* latency_hists insert failed (a sample was lost) */
    STAT_RINGBUF_DROPS,        /* trigger events lost because the ring buffer was full */
    STAT_HTTP_UNFRAMED,        /* a message's framing could not be followed (headers longer than
                               * HTTP_SCAN_MAX or a segment, too many messages in a segment, a
                               * gap): its direction is looked at on segment starts until the
                               * next message found there */
    STAT_CT_LOOKUPS,           /* conntrack lookups (new flows, and responses or triggers whose
                               * other tuple was not known yet) */
    STAT_NAT_FLOWS,            /* connections found translated by conntrack: one flow, two tuples */
    STAT_REPLAY_KEPT,          /* request segments kept for a replay */
    STAT_REPLAYED,             /* requests replayed to the mirror ahead of their trigger */
    STAT_REPLAY_MISSED,        /* triggers whose request was not kept (or its slot reused) */
    STAT_REPLAY_FAILED,        /* replays that could not be made (the copy could not be reshaped) */
    STAT_RESET_TRIGGERS,       /* resets that matched a reset rule and marked their flow */
    STAT_NORESPONSE_TRIGGERS,  /* requests unanswered too long that marked their flow */
    STAT_FILTERED_OUT,         /* rules whose condition held but whose request filter did not */
    STAT_NORESPONSE_TICKS,  /* runs of the no-response tick (every 10 ms while such rules exist) */
    STAT_NORESPONSE_FAILED, /* the no-response tick could not be started */
    STAT_H2_CONNECTIONS,    /* directions of a connection found speaking HTTP/2 (preface, first
                             * SETTINGS, or frames found again after a loss or a late start) */
    STAT_H2_REQUESTS,       /* HTTP/2 request header blocks (:method, :path) */
    STAT_H2_RESPONSES,      /* HTTP/2 response header blocks (:status) */
    STAT_H2_TRAILERS,       /* HTTP/2 trailers with a grpc-status */
    STAT_H2_UNRESOLVED,     /* header fields of interest that referred to a dynamic-table entry
                             * not followed (inserted before the agent saw the connection, or
                             * pushed out of the entries kept) */
    STAT_H2_LOST,           /* HTTP/2 framing or header-table state lost (a gap, a frame that
                             * could not be one, a header block too large or cut) */
    STAT_H2_CONTINUATION,   /* header blocks continued in CONTINUATION frames (the fields of the
                             * first frame are read; the table state is lost) */
    STAT_H2_STREAM_MISSED,  /* responses whose stream's request was not found */
    STAT_GRPC_TRIGGERS,     /* grpc-status trailers that matched a rule and marked their flow */
    STAT_REQUEST_NOT_KEPT,  /* answers (or resets) whose request was pending but not kept: pushed
                             * out of the queue by later ones, or after a loss of framing that
                             * leaves which request it answers uncertain (timing.h) */
    STAT_DNS_QUERIES,       /* DNS queries seen (on a DNS port, while some rule is a DNS rule) */
    STAT_DNS_RESPONSES,     /* DNS responses seen */
    STAT_DNS_UNMATCHED,     /* DNS responses whose query was not kept (not seen, or pushed out) */
    STAT_DNS_MALFORMED,     /* DNS messages on a DNS port that could not be read (not DNS, a
                             * question cut or compressed, more than one question) */
    STAT_DNS_TRIGGERS,      /* DNS responses that matched a rule and marked their flow */
    STAT_DROPS,             /* packets of the pods' flows the kernel dropped, for a real reason */
    STAT_DROP_TRIGGERS,     /* such drops that matched a rule and marked their flow */
    STAT_DROP_LIMITED,      /* drop triggers refused by their rule's rate (DROP_TRIGGERS_PER_SEC) */
    STAT_DROP_PODS_FULL,    /* drops not counted by pod: drop_pods full (DROP_PODS_MAX pairs) */
    STAT_MAX,
};

/*
 * Direction-independent flow identity: the two (address, port) endpoints in canonical
 * order ("lo" compares lower), the IP family and the L4 protocol. IPv4 uses word 0.
 */
struct flow_key {
    __u32 addr_lo[4];
    __u32 addr_hi[4];
    __u16 port_lo;
    __u16 port_hi;
    __u8 proto;
    __u8 family; /* 4 or 6 */
    __u8 _pad[2];
};

/* One direction of a connection as conntrack records it (IPv4 uses word 0). */
struct ct_tuple {
    __u32 src[4];
    __u32 dst[4];
    __u16 sport; /* host order */
    __u16 dport;
};

/*
 * flow_nat value: a connection that conntrack translated is seen under two flow keys, one
 * per side of the translation. Each key maps to the other (peer) and both tuples; which side
 * a key is follows from them (the client's key is that of `orig`).
 */
struct flow_nat {
    struct flow_key peer;
    struct ct_tuple orig;  /* client -> service, as sent */
    struct ct_tuple reply; /* server -> client, as answered (after translation) */
    __u8 _pad[8];
};

/* Traffic of one direction of a flow, on one CPU. */
struct flow_dir_stats {
    __u64 packets;
    __u64 bytes;
    __u64 first_seen_ns; /* CLOCK_MONOTONIC ns: packet_time() */
    __u64 last_seen_ns;
    __u8 tcp_flags; /* OR of every TCP flag byte seen */
    /* Whether this direction speaks HTTP/1.x, as far as this CPU saw: enum http_dir_kind
     * (scratch.h). */
    __u8 http_kind;
    /* Payload segments in a row that began no message while no message was known (until
     * HTTP_GIVE_UP: then the direction is taken for another protocol on this CPU). */
    __u8 http_misses;
    __u8 _pad[5];
};

/*
 * The programs the dispatcher tail-calls, each at its index in proto_progs (dispatch.h): the
 * protocol programs, whose bit (1 << index) in protocols_enabled (config.h) says that they
 * were loaded (the protocols: setting), and the rare stages, always loaded.
 */
enum proto_prog {
    PROG_HTTP1 = 0, /* HTTP/1.x messages (http.h), which also finds where HTTP/2 starts */
    PROG_HTTP2 = 1, /* HTTP/2 frames, HPACK and gRPC (h2.h) */
    PROG_DNS = 2,   /* DNS messages over UDP (dns.h) */
    PROG_RESET = 3, /* not a protocol: a TCP RST while some rule is a reset rule (decide.h) */
    PROGS_MAX = 4,
};

/* flow_table value: per CPU, summed in user space. */
struct flow_traffic {
    struct flow_dir_stats dir[FLOW_DIRS];
    /* mark_epoch (always odd) when this CPU last looked the flow up in mirror_marks and found
     * no mark: while no trigger happened since, the flow cannot have been marked and the
     * shared lookup is skipped. 0: marked, or not looked up yet. */
    __u32 mark_seen;
    /* flow_timing slot + 1 of the flow's shared entry, as this CPU last found it (0: none);
     * valid while the slot's owner is the flow (timing.h). */
    __u32 timing_slot;
    __u64 http_time_sum_ns; /* request-to-response times of the responses seen on this CPU */
    __u64 http_time_max_ns;
    __u32 http_timed;   /* how many */
    __u32 handshake_us; /* SYN to completing ACK, when seen on this CPU (0: not) */
};

/* One direction of a cached flow: its bytes since the last write-back, its first packet since
 * the slot was filled, its latest packet. */
struct flow_cache_dir {
    __u64 bytes;
    __u64 first_seen_ns;
    __u64 last_seen_ns;
};

/*
 * One slot of a CPU's exact-match flow cache (flow_cache map), in front of flow_table: what
 * every packet of a cached flow reads and writes, in two cache lines (the map's values are
 * contiguous and page-aligned, so a slot is exactly two lines). Counters hold what this CPU
 * counted since the last write-back to its flow_table entry; the HTTP and mark state is the
 * entry's own while the flow is cached (loaded at fill, stored at write-back). User space adds
 * the slots to flow_table when it reads flows, so what it shows stays exact (flow.rs).
 */
struct flow_cache_slot {
    struct flow_key key;         /* the flow cached here (zero: none) */
    __u32 mark_seen;             /* flow_traffic.mark_seen */
    __u32 timing_slot;           /* flow_traffic.timing_slot */
    __u16 packets[FLOW_DIRS];    /* since the last write-back */
    __u16 http_timed;            /* responses timed since the last write-back */
    __u8 tcp_flags[FLOW_DIRS];   /* OR of the flags seen since the slot was filled */
    __u8 http_kind[FLOW_DIRS];   /* flow_dir_stats.http_kind */
    __u8 http_misses[FLOW_DIRS]; /* flow_dir_stats.http_misses */
    /* Bit d: direction d had more than two packets on this CPU before the counts the slot
     * holds (its handshake, if any, is behind it). */
    __u8 past_handshake;
    __u8 _pad[3];
    struct flow_cache_dir dir[FLOW_DIRS];
    __u64 http_time_sum_ns; /* since the last write-back */
    __u64 http_time_max_ns; /* since the slot was filled */
};
_Static_assert(sizeof(struct flow_cache_slot) == 128, "a cache slot is two cache lines");
_Static_assert(__builtin_offsetof(struct flow_cache_slot, dir) == 64,
               "the key and the state a packet reads first share the first line");

/* What a matching rule does. */
struct rule_action {
    __u32 rule_id;         /* user-visible id; 0 = no rule */
    __u32 slot;            /* index into rule_hits */
    __u64 max_packets;     /* mirror budget per flow; 0 = unlimited */
    __u64 max_bytes;       /* 0 = unlimited */
    __u64 max_duration_ns; /* 0 = unlimited */
    __u64 min_latency_ns;  /* only responses at least this slow (noresponse: the wait); 0 = any */
};

/*
 * The rules of one (port, status) key, written by user space at every key they cover: the
 * unconditional rule with the lowest id, and the slowness rule with the lowest threshold.
 */
struct rule_entry {
    /* Slots (rule_filters keys) of the rules with request filters covering the key, lowest id
     * first; 0 ends the list. Tried before any and slow (filter.h). */
    __u16 filtered[RULE_FILTERED_MAX];
    struct rule_action any;
    struct rule_action slow;
};

/* Which requests a rule applies to (rule_filters value); an empty part matches any. */
struct rule_filter {
    struct rule_action action; /* the rule */
    __u32 methods;             /* bits of enum http_method (0: any) */
    __u8 path_len;             /* bytes of path, a prefix of the target (0: any) */
    __u8 host_len;             /* bytes of host, lower case (0: any) */
    __u8 qname_len;            /* bytes of qname, a suffix of a DNS question's name (0: any) */
    __u8 qname_not;            /* 1: the names NOT under qname pass (qname=!SUFFIX) */
    __u16 qtype;               /* a DNS question's type (0: any) */
    __u16 _pad2;
    __u32 _pad3;
    __u8 path[RULE_FILTER_TEXT];
    __u8 host[RULE_FILTER_TEXT];
    __u8 qname[RULE_FILTER_TEXT]; /* lower case, no final dot */
};

/* Request methods, as bits of rule_filter.methods. */
enum http_method {
    HTTP_METHOD_GET = 1,
    HTTP_METHOD_HEAD = 2,
    HTTP_METHOD_POST = 4,
    HTTP_METHOD_PUT = 8,
    HTTP_METHOD_DELETE = 16,
    HTTP_METHOD_PATCH = 32,
    HTTP_METHOD_OPTIONS = 64,
    HTTP_METHOD_CONNECT = 128,
    HTTP_METHOD_TRACE = 256,
};

/*
 * port_rules key: the rules of a server port, in scope 0 (the rules that reach everywhere); or
 * in a scope of selected rules (scope.h), of a port or of any port (0), the rules that reach
 * everywhere compiled in with them.
 */
struct port_status_key {
    __u16 port;   /* 0: any port (scope > 0 only: scope 0's are in status_rules) */
    __u16 status; /* or a kind's pseudo-status */
    __u32 scope;  /* iface_scopes value of the interfaces it applies on (0: every interface) */
};

/* A flow marked for mirroring, shared by all CPUs. packets/bytes grow atomically. */
struct mirror_mark {
    __u32 rule_id;
    __u32 slot;
    __u64 trigger_ns;
    __u64 deadline_ns; /* 0 = none */
    __u64 max_packets; /* 0 = unlimited */
    __u64 max_bytes;   /* 0 = unlimited */
    __u64 packets;     /* mirrored so far */
    __u64 bytes;
    __u32 ended;          /* a limit was reached: nothing more is mirrored (32 bits for cmpxchg) */
    __u16 status;         /* the status that triggered (0: another kind) */
    __u8 linked;          /* this key is the other tuple of a translated connection: the budget is
                   * the mark of `peer` */
    __u8 kind;            /* enum trigger_kind */
    struct flow_key peer; /* the other tuple of a translated connection (zero: none) */
    /* request_replay slot + 1 of a request still to be replayed, by the first packet of the
     * flow after the mark (a noresponse mark whose event was lost: else the agent replays it);
     * 0: none. */
    __u32 replay_due;
    __u32 replay_req; /* the slot's req that request was kept under (struct replay_slot) */
};

/* One direction's stream state (in struct flow_timing, shared by all CPUs). */
struct http_stream {
    __u32 next_seq;   /* TCP sequence number of the next message (state != HTTP_SCAN) */
    __u8 state;       /* enum http_stream_state (scratch.h) */
    __u8 partial_len; /* valid bytes in partial (HTTP_PARTIAL) */
    __u8 _pad[2];
    __u8 partial[HTTP_PARTIAL_LEN];
};

/* A request awaiting its response. */
struct http_request {
    __u64 ts_ns;      /* its first segment, packet_time() */
    __u32 head_len;   /* valid bytes in head */
    __u32 replay;     /* hand-out number + 1 of the request_replay slot of its segment (0: none;
                     * the slot is number & replay_mask: replay.h) */
    __u32 number;     /* HTTP/1.x: its place among the connection's requests (req_tail when
                     * queued): the entry is that request's while number == the one looked for */
    __u32 replay_req; /* the slot's req when its segment was kept: the slot still holds that
                       * segment while its req says so (struct replay_slot) */
    __u8 head[HTTP_REQUEST_HEAD_LEN]; /* raw "METHOD target HTTP/1.x" prefix */
};

/*
 * Per-flow state that two CPUs may see halves of (shared by all CPUs): the handshake's
 * timestamps, the HTTP message framing of each direction, and the requests awaiting answers.
 * One slot of the flow_timing array, owned by the flow of `key` (timing.h).
 */
struct flow_timing {
    struct flow_key key; /* the flow that owns the slot (zero: free) */
    __u32 ref;           /* used since the allocator last passed (a second chance: timing.h) */
    __u8 h2;             /* bit d: direction d was found speaking HTTP/2 (h2.h) */
    __u8 req_hook;       /* enum hook_kind where the latest request was seen: at HOOK_EGRESS of
                          * req_ifindex it went into the pod behind it, its server (scope.h) */
    __u8 piped;          /* two requests were pending at once: the connection pipelines */
    __u8 _pad0;
    __u64 syn_ns;    /* SYN, until the handshake completes */
    __u64 synack_ns; /* SYN/ACK */
    __u32 req_head;  /* final answers counted so far: the oldest pending is request req_head */
    __u32 req_tail;  /* requests queued so far: request n is in req[n % HTTP_PIPELINE] (timing.h) */
    __u8 syn_dir;    /* enum flow_dir of the SYN */
    __u8 nat_checked;  /* conntrack was asked whether this connection is translated */
    __u8 deep;         /* more requests were pending at once than req holds: every response
                        * is framed (see HTTP_ANSWERED) */
    __u8 req_dir;      /* enum flow_dir of the requests + 1 (0: none seen): the client's side */
    __u32 req_ifindex; /* where the latest request was seen (for a no-response event) */
    __u32 req_gap;     /* a direction's framing was lost: requests numbered from req_gap - 1 on
                        * may not be the ones the responses answer (0: none; timing.h) */
    __u32 req_done;    /* answers handled to their end (decided; replayed, when they triggered):
                        * the latest request's kept segment is taken over only once
                        * req_done == req_tail (replay.h) */
    struct http_stream stream[FLOW_DIRS];
    struct http_request req[HTTP_PIPELINE];
};

/*
 * The segment that carried the latest request of a flow (request_replay map), kept so that
 * the request behind a trigger reaches the mirror ahead of the response (replay.h).
 */
struct replay_slot {
    struct flow_key key; /* the flow that owns the slot */
    __u64 ts_ns;         /* when the request passed */
    __u32 wire_len;      /* the segment's length (more than len: kept truncated) */
    __u16 len;           /* bytes kept in frame */
    __u16 req_off;       /* where the request starts in frame */
    /* Which keep of its flow wrote the slot, as the requests kept in it remember it: the
     * number + 1 of the flow's HTTP/1.x request that kept it (a later request of the flow
     * takes the slot over once that one is answered: replay_keep), 0 for a message kept in a
     * slot of its own (replay_take), REPLAY_WRITING while a keep writes it. */
    __u32 req;
    __u32 _pad;
    __u8 frame[REPLAY_FRAME_MAX]; /* from the Ethernet header on */
};

/* Network-stack CPU time of one CPU (net_cpu_time map). */
struct net_cpu_time {
    __u64 syscall_ns;    /* in send/receive system calls, softirqs inside them excluded */
    __u64 softirq_rx_ns; /* in NET_RX softirqs */
    __u64 softirq_tx_ns; /* in NET_TX softirqs */
};

/* latency_hists key. */
struct hist_key {
    __u32 ifindex; /* where the end of the interval was seen */
    __u8 kind;     /* enum hist_kind */
    __u8 class;    /* HTTP status class (1-5) for HIST_HTTP_RESPONSE, else 0 */
    __u16 _pad;
};

/* A latency histogram, per CPU. Bucket b < 8 holds b ns; above, 8 buckets per power of two. */
struct latency_hist {
    __u64 count;
    __u64 sum_ns;
    __u64 buckets[HIST_BUCKETS];
};

/* Ring-buffer record, one per trigger. */
struct trigger_event {
    struct flow_key key;
    struct flow_key
        nat; /* the connection's other tuple when conntrack translated it (zero: none) */
    __u64 ts_ns;
    /* From the request to the trigger: its response's status line, the reset, or the mark of
     * a request unanswered (the wait); 0 when no request was seen. */
    __u64 request_to_response_ns;
    __u32 rule_id;
    __u32 ifindex;  /* interface the trigger packet was seen on */
    __u16 status;   /* the response's status (0: another kind) */
    __u8 hook;      /* enum hook_kind */
    __u8 dir;       /* enum flow_dir of the packet that triggered (noresponse: of the request) */
    __u8 kind;      /* enum trigger_kind */
    __u8 by;        /* enum trigger_side: who sent the packet that triggered */
    __u8 proto;     /* enum http_proto of the request */
    __u8 request;   /* enum trigger_request */
    __u16 dns_type; /* DNS: the question's type (proto PROTO_DNS) */
    __u16 dns_id;   /* DNS: the message's id */
    __u32 request_head_len;
    /* HTTP/2: "METHOD path", from its HEADERS; DNS: the question's name (DNS_NAME_MAX) */
    __u8 request_head[HTTP_REQUEST_HEAD_LEN];
    __u32 stream;        /* HTTP/2: the stream's id (0: HTTP/1.x) */
    __u32 authority_len; /* HTTP/2: bytes of the request's :authority */
    __u8 authority[H2_TEXT];
    __u64 replay_ts_ns;            /* when the replayed request passed (0: none kept) */
    __u32 replay_wire_len;         /* its segment's length */
    __u32 replay_len;              /* bytes of it in replay (0: none kept) */
    __u8 replay[REPLAY_FRAME_MAX]; /* the request's segment, from the Ethernet header on; a drop:
                                    * the packet dropped (replay_len bytes of replay_wire_len) */
    __u64 location;                /* a drop: where in the kernel (kfree_skb's caller) */
};

/* Timing groups, switched at run time (bits of settings.timing). */
enum timing_group {
    TIMING_HTTP = 1,      /* HTTP response times (needed by latency> rules) */
    TIMING_HANDSHAKE = 2, /* TCP handshake times */
    TIMING_DNS = 4,       /* DNS answer times and response codes (also followed for DNS rules) */
};

/* Runtime settings, one entry in the settings map, changed by user space at any time. */
struct settings {
    __u32 mirror_ifindex; /* 0 = no mirror interface: marked packets are counted, not copied */
    __u32 timing;         /* enum timing_group bits that are on */
    __u32 replay_keep;    /* enum replay_keep: which flows keep their requests */
    __u32 replay_ifindex; /* where the replay program runs (the sink's egress; 0: no replays) */
    __u32 kinds;          /* bit (1 << enum trigger_kind) of each kind some rule has */
    __u32 scoped;         /* some interface selects rules: iface_scopes has entries (scope.h) */
    __u16 dns_ports[DNS_PORTS_MAX]; /* server ports DNS is followed on (0: unused) */
};

/* Which flows keep the segment of their latest request for a replay (settings.replay_keep). */
enum replay_keep {
    REPLAY_OFF = 0,   /* none */
    REPLAY_ALL = 1,   /* every flow: a rule for any server port exists */
    REPLAY_PORTS = 2, /* flows to a server port that has rules of its own */
};

/* DNS responses seen, by response code (one entry in the dns_rcodes map, per CPU). */
struct dns_rcode_counts {
    __u64 v[DNS_RCODES];
};

/* The pods' packets the kernel dropped, by reason (one entry in the drop_counts map, per CPU):
 * entry r for a core reason r < DROP_REASONS, entry 0 for any other (a subsystem's). */
struct drop_counts {
    __u64 v[DROP_REASONS];
};

/* Key of drop_pods: the pod a drop belongs to, by the ifindex of its attached host-side veth
 * (0: none known, the drop counted by its flow alone), and the reason (drop_counts' index). */
struct drop_pod_key {
    __u32 ifindex;
    __u32 reason;
};

/* Per-CPU counters (one entry in the stats map). */
struct counters {
    __u64 v[STAT_MAX];
};

/*
 * The node-wide budget of copies (mirror.budget), this CPU's share of it: the node's rates
 * split evenly over the CPUs, 0 for no limit. Written by user space, read per copy made.
 */
struct budget_config {
    __u64 packets_per_sec; /* copies per second on one CPU (0: no limit) */
    __u64 bytes_per_sec;   /* bytes of copies per second on one CPU (0: no limit) */
};

/* One CPU's token buckets (in 1e-9 packets and 1e-9 bytes) and what it refused. */
struct budget_state {
    __u64 last_ns;         /* last refill (0: never: the buckets start full) */
    __u64 packet_tokens;   /* nano-packets */
    __u64 byte_tokens;     /* nano-bytes */
    __u64 refused_packets; /* copies not made for the budget */
    __u64 refused_bytes;   /* their bytes */
};

#endif /* MIRROR_TYPES_H */
