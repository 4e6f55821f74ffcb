/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * This file contains the request methods of HTTP/1.x: which one a request line starts with.
 * The HTTP stage asks it of every message start (http.h), the request filters of the one a
 * trigger concerns (filter.h).
 */
#ifndef MIRROR_METHOD_H
#define MIRROR_METHOD_H

#include "types.h"

/* Little-endian words of the ASCII prefixes we compare against. */
#define HTTP_WORD(a, b, c, d) ((__u32)(a) | (__u32)(b) << 8 | (__u32)(c) << 16 | (__u32)(d) << 24)
#define HTTP_WORD8(a, b, c, d, e, f, g, h) \
    ((__u64)HTTP_WORD(a, b, c, d) | (__u64)HTTP_WORD(e, f, g, h) << 32)

/*
 * http_method - the method @p starts with, followed by a space: its bit (enum http_method),
 * the length of "METHOD " in @len; 0 when @p starts no known method (at least 8 bytes readable).
 */
static __always_inline __u32 http_method(const __u8 *p, __u32 *len)
{
    switch (*(const __u32 *)p) {
    case HTTP_WORD('G', 'E', 'T', ' '):
        *len = 4;
        return HTTP_METHOD_GET;
    case HTTP_WORD('P', 'U', 'T', ' '):
        *len = 4;
        return HTTP_METHOD_PUT;
    case HTTP_WORD('P', 'O', 'S', 'T'):
        *len = 5;
        return p[4] == ' ' ? HTTP_METHOD_POST : 0;
    case HTTP_WORD('H', 'E', 'A', 'D'):
        *len = 5;
        return p[4] == ' ' ? HTTP_METHOD_HEAD : 0;
    case HTTP_WORD('P', 'A', 'T', 'C'):
        *len = 6;
        return p[4] == 'H' && p[5] == ' ' ? HTTP_METHOD_PATCH : 0;
    case HTTP_WORD('T', 'R', 'A', 'C'):
        *len = 6;
        return p[4] == 'E' && p[5] == ' ' ? HTTP_METHOD_TRACE : 0;
    case HTTP_WORD('D', 'E', 'L', 'E'):
        *len = 7;
        return p[4] == 'T' && p[5] == 'E' && p[6] == ' ' ? HTTP_METHOD_DELETE : 0;
    case HTTP_WORD('O', 'P', 'T', 'I'):
        *len = 8;
        return p[4] == 'O' && p[5] == 'N' && p[6] == 'S' && p[7] == ' ' ? HTTP_METHOD_OPTIONS : 0;
    case HTTP_WORD('C', 'O', 'N', 'N'):
        *len = 8;
        return p[4] == 'E' && p[5] == 'C' && p[6] == 'T' && p[7] == ' ' ? HTTP_METHOD_CONNECT : 0;
    default:
        return 0;
    }
}

#endif /* MIRROR_METHOD_H */
