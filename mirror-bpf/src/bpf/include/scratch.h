/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the programs' own state, never read by user space: the per-CPU scratch
 * area (struct http_scratch and what it holds), the parsers' state of each flow and connection
 * (stream states, HTTP/2 connections and streams) and the values of the maps only the programs
 * use. None of it reaches Rust, so none of it is asserted there: what user space reads is in
 * types.h, on which these types build.
 */
#ifndef MIRROR_SCRATCH_H
#define MIRROR_SCRATCH_H

#include "types.h"

/* How a triggered packet reaches the mirror interface. */
enum mirror_method {
    /* bpf_clone_redirect() from the program itself (direct action). */
    MIRROR_CLONE = 0,
    /* The program only classifies; an act_mirred action on the classic filter copies. */
    MIRROR_MIRRED = 1,
};

/* What a direction of a flow is, for the dispatcher (dispatch.h). */
enum http_dir_kind {
    HTTP_DIR_UNKNOWN = 0,
    HTTP_DIR_SEEN = 1,  /* a request or status line was seen: always looked at */
    HTTP_DIR_OTHER = 2, /* not followed: HTTP_GIVE_UP segments and never a message, or TLS */
    HTTP_DIR_H2 = 3,    /* HTTP/2 frames: dispatched straight to the HTTP/2 program */
    HTTP_DIR_DNS = 4,   /* DNS over TCP: dispatched straight to the DNS program */
};

/* Where one direction of a flow stands in its stream of HTTP/1.x messages. */
enum http_stream_state {
    HTTP_SCAN = 0,     /* framing unknown: a message is looked for at segment starts */
    HTTP_AT = 1,       /* the next message starts at next_seq */
    HTTP_CHUNK = 2,    /* a chunk-size line of a chunked body starts at next_seq */
    HTTP_PARTIAL = 3,  /* a message starts at next_seq; its first partial_len bytes are kept */
    HTTP_CLOSE = 4,    /* the body runs until the connection closes: no further message */
    HTTP_ANSWERED = 5, /* responses only, their framing not followed: the last one answered the
                        * only request pending. A segment that starts with a status line is the
                        * next response when a request is pending again (the client sends the
                        * next one only after this answer ended), body otherwise. Followed
                        * by sequence number all the same (stream_begin): a segment seen
                        * already starts nothing, one past a gap loses the framing */
    HTTP2_FRAME = 6,   /* HTTP/2: the next frame header starts at next_seq */
    HTTP2_PARTIAL = 7, /* HTTP/2: a frame header starts at next_seq, its first partial_len bytes
                        * kept (partial) */
    HTTP2_BLOCK = 8,   /* HTTP/2: a header block's frame continues at next_seq, its first bytes
                        * kept in the connection's h2_dir (h2_conns) */
};

/* What the header block of a message says about its body. */
struct http_framing {
    __u32 hdr_len;        /* bytes to the end of the blank line (0: not within the scan) */
    __u32 content_length; /* when has_length */
    __u8 has_length;
    __u8 chunked;
    __u8 unframed; /* a length too large to follow */
    __u8 _pad;
};

/* A request's Host (HTTP/1.x) or :authority (HTTP/2), lower case, without a port. */
struct host_text {
    __u32 len;
    __u32 _pad;
    __u8 text[H2_TEXT];
};

/* Header fields an HTTP/2 header block is read for (the names of struct h2_entry). */
enum h2_field {
    H2_FIELD_NONE = 0,
    H2_FIELD_STATUS = 1,      /* :status */
    H2_FIELD_GRPC_STATUS = 2, /* grpc-status */
    H2_FIELD_METHOD = 3,      /* :method */
    H2_FIELD_PATH = 4,        /* :path */
    H2_FIELD_AUTHORITY = 5,   /* :authority */
};

/* What the HTTP/2 frame loop does after a frame (h2.h). */
enum h2_ready {
    H2_READY_NONE = 0,
    H2_READY_BLOCK = 1,  /* read the header block described in h2_scratch */
    H2_READY_DECIDE = 2, /* decide what the HEADERS block just read says */
};

/* A dynamic-table entry of interest, remembered by value (struct h2_dir). */
struct h2_entry {
    __u32 ins;  /* the entry's insertion number in its direction + 1 (0: free) */
    __u8 field; /* enum h2_field of its name (H2_FIELD_NONE with a value: none of ours) */
    __u8 len;   /* bytes of text */
    __u16 code; /* the :status or grpc-status value (0xffff: not a number) */
    __u8 text[H2_TEXT];
};

/*
 * One direction of an HTTP/2 connection, as its receiver's HPACK decoder must see it: how many
 * entries the sender inserted in the dynamic table since it was followed (an index resolves to
 * the insertion it names without knowing evictions: a peer never names an evicted entry), the
 * latest entries of interest, and a header block whose frame runs past its segment.
 */
struct h2_dir {
    __u32 inserted;     /* insertions counted since the table was followed (or lost) */
    __u32 block_stream; /* HTTP2_BLOCK: the block's stream */
    __u16 block_len;    /* HTTP2_BLOCK: bytes kept in block */
    __u16 block_total;  /* HTTP2_BLOCK: bytes of the block in all (frame payload) */
    __u8 block_type;    /* HTTP2_BLOCK: the frame's type */
    __u8 block_flags;   /* HTTP2_BLOCK: the frame's flags */
    __u8 next_entry;    /* the ent slot the next entry of interest takes */
    __u8 _pad;
    __u8 kinds[H2_TABLE_RING]; /* enum h2_field of insertion n at n % H2_TABLE_RING */
    struct h2_entry ent[H2_TABLE_ENTRIES];
    __u8 block[H2_BLOCK_MAX];
};

/* h2_conns value: both directions of an HTTP/2 connection under one flow key. */
struct h2_conn {
    struct h2_dir dir[FLOW_DIRS];
};

/* Zeroed initial values of new map entries (too large for the stack). Never written. */
struct zero_values {
    struct flow_timing timing;
    struct flow_traffic traffic;
    struct h2_conn h2;
};

/* A stream of an HTTP/2 connection, under the key its request was seen with. */
struct h2_stream_key {
    struct flow_key key;
    __u32 stream;
    __u32 _pad;
};

/* A request awaiting its response (and, for gRPC, its trailers). */
struct h2_stream {
    struct http_request req;    /* head: "METHOD path"; ts_ns; replay: its segment's slot */
    struct host_text authority; /* its :authority */
    __u8 dir;                   /* enum flow_dir of the request */
    __u8 _pad[7];
};

/* What the stream table looks at first of a way (h2_streams.h): a bucket's four in one line. */
struct h2_way_head {
    __u32 seq;    /* even: as written; odd: being written (a sequence lock) */
    __u32 stream; /* the stream's id (0: the way is free) */
    __u64 ts_ns;  /* its request's time: the oldest request's way is taken when none is free */
};

/* The rest of a way. */
struct h2_way {
    struct flow_key key; /* the key its request was seen with */
    struct h2_stream st;
};

/* h2_streams value: a bucket of the stream table (h2_streams.h), a whole number of lines. */
struct h2_stream_bucket {
    struct h2_way_head head[H2_STREAM_WAYS];
    struct h2_way way[H2_STREAM_WAYS];
    __u8 _pad[(64 - sizeof(struct h2_way) * H2_STREAM_WAYS % 64) % 64];
};

/* Per-CPU scratch space of the HTTP/2 stage: what a header block says, as it is read. */
struct h2_scratch {
    struct h2_stream stream;  /* the request being read: its authority; then what is stored */
    struct h2_stream_key key; /* a stream's key, looked up (in the scratch area: off the stack) */
    __u32 at;                 /* the next field's offset in the block (http_scratch.buf) */
    __u32 end;                /* the block's end there */
    __u32 status;             /* :status found (0: none) */
    __u32 grpc_status;        /* grpc-status + 1 found (0: none) */
    __u32 fields;             /* bit (1 << enum h2_field) of each field found */
    __u32 method_len;         /* bytes of the :method value in method */
    __u32 path_len;           /* bytes of the :path value in path */
    __u32 text_len;           /* bytes of the string in text */
    __u32 huff_at;            /* Huffman decoding: the input's offset in buf */
    __u32 huff_state;         /* its decoder state (hpack_huffman.h) */
    __u32 huff_flags;         /* its last entry's flags (HUFFMAN_ACCEPT, HUFFMAN_FAIL) */
    __u32 block_n;            /* bytes of the frame's payload in buf */
    __u32 block_at;           /* where in buf they start (within the window when read with the
                               * frame's header, else 0) */
    __u32 win_off;            /* the window of the segment in buf (h2.h): its payload offset */
    __u32 win_len;            /* and its bytes (0: buf holds something else) */
    __u32 win_far;            /* the last frame ran past a window's size: read little next */
    __u32 frame_len;          /* the frame carrying the block: its payload's length */
    __u32 frame_stream;       /* its stream */
    __u8 frame_type;          /* its type */
    __u8 frame_flags;         /* its flags */
    __u8 ready;               /* what the frame loop does next: enum h2_ready */
    __u8 _pad;
    __s32 field_result; /* hpack_field's last result (0: a field read, 1: the end) */
    __u16 rule_status;  /* h2_decide: a :status some rule covers (0: none) */
    __u16 rule_grpc;    /* h2_decide: a grpc-status pseudo-status some rule covers (0: none) */
    __u32 rule_scope;   /* h2_decide: the scope whose rules h2_rule looks up (scope.h) */
    /* h2_decide: the stream whose answer's HEADERS this segment carried, left open for its
     * DATA to end (0: none), and where: its bucket, its way, the way's count when found. */
    __u32 open_stream;
    __u32 open_bucket;
    __u32 open_way;
    __u32 open_seq;
    __u8 hdr[24]; /* a frame header: bytes kept from earlier segments, then these */
    __u8 method[16];
    __u8 path[H2_TEXT];
    __u8 text[H2_TEXT + 8]; /* a string decoded (Huffman) or copied */
};

/* What a trigger reports besides the flow and rule. */
struct trigger_info {
    __u64 took;    /* from the request to the trigger (0: unknown) */
    __u32 status;  /* the response's status (0: another kind) */
    __u32 hook;    /* enum hook_kind */
    __u32 kind;    /* enum trigger_kind */
    __u32 by;      /* enum trigger_side */
    __u32 replay;  /* request_replay hand-out number + 1 of the request's segment (0: none) */
    __u32 proto;   /* enum http_proto of the request (HTTP/2: its :authority in s->h2.stream) */
    __u32 stream;  /* HTTP/2: the stream's id */
    __u32 request; /* enum trigger_request: what is known of the request behind it */
    struct flow_key replay_key; /* the key it was kept under (the other one across NAT) */
    __u16 dns_type;             /* DNS (proto PROTO_DNS): the question's type */
    __u16 dns_id;               /* DNS: the message's id */
    __u32 replay_req;           /* the slot's req it was kept under (struct replay_slot) */
};

/* A DNS query, by its flow and id (dns_queries key). */
struct dns_key {
    struct flow_key key;
    __u16 id;
    __u16 _pad[3];
};

/* Where a kept DNS query stands. */
enum dns_query_state {
    DNS_QUERY_PENDING = 0,  /* awaiting its response */
    DNS_QUERY_MARKED = 1,   /* unanswered, its flow marked by a noresponse rule: the tick looks
                             * no more, its late response is still timed */
    DNS_QUERY_ANSWERED = 2, /* answered: gone (the entry left to the LRU, not deleted) */
};

/* A DNS query awaiting its response (dns_queries value; dns.h). */
struct dns_query {
    __u64 ts_ns;             /* when it passed, packet_time() */
    __u32 replay;            /* request_replay hand-out number + 1 of its segment (0: not kept) */
    __u32 ifindex;           /* where it was seen */
    __u16 qtype;             /* its question's type */
    __u16 server;            /* the server's port */
    __u8 name_len;           /* bytes of name */
    __u8 dir;                /* enum flow_dir of the query */
    __u8 hook;               /* enum hook_kind where it was seen */
    __u8 state;              /* enum dns_query_state */
    __u8 name[DNS_NAME_MAX]; /* its question's name, as text, lower case */
};

/* The header and question of a DNS message (dns.h); its name's text in http_scratch.req.head. */
struct dns_msg {
    __u16 id;
    __u16 flags;   /* the header's second word: QR, opcode, ..., rcode */
    __u16 qtype;   /* 0 when the name was cut */
    __u8 name_len; /* bytes of the name's text */
    __u8 cut;      /* the name is longer than DNS_NAME_MAX: its text is its start */
};

/* What the classifier needs from one packet. */
struct pkt_meta {
    struct flow_key key;
    __u32 payload_off; /* from the start of the frame */
    __u32 payload_len; /* TCP payload length per the IP header */
    __u32 seq;         /* TCP sequence number, host order */
    __u16 src_port;    /* host order */
    __u16 dst_port;    /* host order */
    __u8 dir;          /* enum flow_dir */
    __u8 tcp_flags;
    __u8 hook;   /* enum hook_kind of the entry program (dispatch.h) */
    __u8 method; /* enum mirror_method of the entry program: its verdict's kind */
    __u32 slot;  /* this CPU's flow_cache index of the flow (flow_cache.h) */
    __u64 now;   /* packet_time(), read once per packet (set by classify_head) */
};

/* Where the HTTP stage stands in one segment (carried from one http_message() to the next). */
struct http_pos {
    __u32 off;        /* payload offset of the next message or chunk-size line */
    __u32 state;      /* enum http_stream_state of the direction at off */
    __u32 hook;       /* enum hook_kind, for events */
    __u8 partial;     /* the message at off continues the bytes kept in the stream state */
    __u8 triggered;   /* a response of this segment marked the flow */
    __u8 unframed;    /* the framing was lost */
    __u8 stop;        /* nothing more to look at in this segment */
    __u8 kept;        /* the stream state was written here (kept bytes): leave it */
    __u8 created;     /* the flow's shared entry was created here */
    __u8 seen;        /* a request or status line was found */
    __u8 answered;    /* the response at off answered the only request pending */
    __u32 replay;     /* the request_replay slot number + 1 this segment was kept in (0: none):
                     * the other requests it carries share it */
    __u32 replay_req; /* that slot's req (struct replay_slot) */
    __u8 was;         /* the direction's state before this segment (stream.h) */
    __u8 handed;      /* set up by the program that tail-called this one (stream.h) */
    __u8 tls;         /* the segment starts a TLS record: the direction is not followed */
    __u8 _pad;
};

/* Per-CPU scratch space of a conntrack lookup (too large for the stack). */
struct nat_scratch {
    struct flow_nat nat;
    struct flow_key orig;  /* the key of the client's tuple */
    struct flow_key reply; /* the key of the server's tuple */
    __u8 tuple[40];        /* struct bpf_sock_tuple (36 bytes) */
    __u8 opts[16];         /* struct bpf_ct_opts */
};

/*
 * Per-CPU scratch space of the HTTP stage (too large for the stack). What every packet with a
 * payload touches comes first, in three cache lines: the packet, the position, the framing, the
 * first bytes of the message and the time and first word of the request answered; then what
 * only triggers, NAT and split first lines use; the header block last.
 */
struct http_scratch {
    struct pkt_meta meta;            /* the packet (classify: its frame is on the deepest call
                                      * chain, and nothing reads it after the copy is made) */
    struct http_pos pos;             /* where the HTTP stage stands in the segment */
    struct http_framing framing;     /* what a header block says of the message's body */
    __u8 peek[2 * HTTP_PARTIAL_LEN]; /* kept partial bytes followed by the segment's first */
    struct http_request req;         /* the request a response answers (head: see request_pop) */
    struct trigger_info trigger;     /* a response that matched a rule */
    __u32 replay_arm;                /* request_replay slot + 1 to replay: set around the clone
                                      * sent to the replay program (replay.h), on this CPU */
    __u32 replay_arm_req;            /* the req the slot is replayed under (struct replay_slot) */
    struct flow_key peer;            /* the other key of a translated connection */
    struct mirror_mark mark;         /* a new mark, before its insert */
    struct host_text host;           /* the Host or :authority a host= filter compares (filter.h) */
    struct dns_msg dns;              /* the DNS message of the packet (dns.h) */
    struct dns_key dns_key;          /* its query's dns_queries key */
    struct dns_query dns_query;      /* a query, before its insert */
    struct h2_scratch h2;            /* the HTTP/2 header block being read (h2.h, hpack.h) */
    __u8 buf[HTTP_SCAN_MAX + 64];    /* a message's header block (slack for 8-byte reads) */
};
_Static_assert(__builtin_offsetof(struct http_scratch, req.head) + HTTP_REQUEST_PREFIX <= 192,
               "what every packet touches fits the scratch area's first three cache lines");
_Static_assert(__builtin_offsetof(struct http_scratch, buf) % 8 == 0,
               "the header block is read a 64-bit word at a time");

/* When a packet entered the node and reached the classifier (kernel stack latency). */
struct skb_stamp {
    __u64 rx_ns;   /* netif_receive_skb on an attached interface */
    __u64 tc_ns;   /* tc ingress (0: not seen) */
    __u32 ifindex; /* where it entered: skb_iif of the packet, unlike a recycled sk_buff's */
    __u32 _pad;
};

/* Histograms of one interface whose latency_hists slots a CPU found (hist_cache map). */
struct hist_cache_entry {
    __u32 ifindex;
    __u16 slot[HIST_CACHE_KEYS]; /* slot + 1 (0: not found yet), by hist_cache_index() */
};

#endif /* MIRROR_SCRATCH_H */
