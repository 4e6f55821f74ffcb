/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains HTTP/1.x recognition at the start of a TCP payload: a status line
 * ("HTTP/1.0 " or "HTTP/1.1 " and three digits) or a request line (a known method token and
 * a space). Only the first bytes are read, with bpf_skb_load_bytes() so that a payload
 * outside the linear area is found too. A status line split across segments is not joined.
 */
#ifndef MIRROR_HTTP_H
#define MIRROR_HTTP_H

#include "parse.h"

/* Bytes read to classify a payload; the shortest status line "HTTP/1.1 200" has 12. */
#define HTTP_PEEK_LEN 16
#define HTTP_STATUS_LINE_MIN 12

enum http_kind {
    HTTP_NONE = 0,
    HTTP_REQUEST,
    HTTP_RESPONSE,
};

/* Little-endian words of the ASCII prefixes we compare against. */
#define HTTP_WORD(a, b, c, d) ((__u32)(a) | (__u32)(b) << 8 | (__u32)(c) << 16 | (__u32)(d) << 24)

static __always_inline int is_digit(__u8 ch)
{
    return ch >= '0' && ch <= '9';
}

/*
 * http_status - parse a status line in @p (at least HTTP_STATUS_LINE_MIN bytes valid).
 * @len: valid bytes in @p.
 * @return the status (100..599), or 0 when @p is not a status line.
 */
static __always_inline __u16 http_status(const __u8 *p, __u32 len)
{
    if (*(__u32 *)p != HTTP_WORD('H', 'T', 'T', 'P') || p[4] != '/' || p[5] != '1' ||
        p[6] != '.' || (p[7] != '0' && p[7] != '1') || p[8] != ' ')
        return 0;
    if (!is_digit(p[9]) || !is_digit(p[10]) || !is_digit(p[11]))
        return 0;
    /* The code must end there: "HTTP/1.1 5000" is not a status line. */
    if (len > 12 && p[12] != ' ' && p[12] != '\r')
        return 0;
    __u16 status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    return status >= 100 && status < HTTP_STATUS_SLOTS ? status : 0;
}

/*
 * http_is_request - does @p start with a request method followed by a space?
 * @return the length of "METHOD " (0 when not a request).
 */
static __always_inline __u32 http_is_request(const __u8 *p)
{
    switch (*(__u32 *)p) {
    case HTTP_WORD('G', 'E', 'T', ' '):
    case HTTP_WORD('P', 'U', 'T', ' '):
        return 4;
    case HTTP_WORD('P', 'O', 'S', 'T'):
    case HTTP_WORD('H', 'E', 'A', 'D'):
        return p[4] == ' ' ? 5 : 0;
    case HTTP_WORD('P', 'A', 'T', 'C'):
        return p[4] == 'H' && p[5] == ' ' ? 6 : 0;
    case HTTP_WORD('T', 'R', 'A', 'C'):
        return p[4] == 'E' && p[5] == ' ' ? 6 : 0;
    case HTTP_WORD('D', 'E', 'L', 'E'):
        return p[4] == 'T' && p[5] == 'E' && p[6] == ' ' ? 7 : 0;
    case HTTP_WORD('O', 'P', 'T', 'I'):
        return p[4] == 'O' && p[5] == 'N' && p[6] == 'S' && p[7] == ' ' ? 8 : 0;
    case HTTP_WORD('C', 'O', 'N', 'N'):
        return p[4] == 'E' && p[5] == 'C' && p[6] == 'T' && p[7] == ' ' ? 8 : 0;
    default:
        return 0;
    }
}

/*
 * http_classify - read the start of the payload of @skb and classify it.
 * @status: set for HTTP_RESPONSE.
 * @return enum http_kind.
 */
static __always_inline int http_classify(struct __sk_buff *skb, const struct pkt_meta *m,
                                         __u16 *status)
{
    __u8 p[HTTP_PEEK_LEN] = {};
    __u32 len = HTTP_PEEK_LEN;

    if (m->payload_len < HTTP_STATUS_LINE_MIN)
        return HTTP_NONE;
    if (m->payload_len < HTTP_PEEK_LEN) {
        len = HTTP_STATUS_LINE_MIN;
        if (bpf_skb_load_bytes(skb, m->payload_off, p, HTTP_STATUS_LINE_MIN))
            return HTTP_NONE;
    } else if (bpf_skb_load_bytes(skb, m->payload_off, p, HTTP_PEEK_LEN)) {
        return HTTP_NONE;
    }

    *status = http_status(p, len);
    if (*status)
        return HTTP_RESPONSE;
    return http_is_request(p) ? HTTP_REQUEST : HTTP_NONE;
}

#endif /* MIRROR_HTTP_H */
