/* pbcheck — what protobuf-c does not check in a request: string fields arrive as C strings, so a
 * NUL byte inside one silently cuts it ("a/b\0c" would be stored as "a/b"), and protobuf-c does
 * not validate UTF-8. pbcheck walks the wire bytes of a message with its descriptor and refuses
 * any string field holding a NUL or bytes that are not UTF-8, naming the field by its path
 * (e.g. "open_sequence.name"). Nested messages are walked; unknown fields and non-string fields
 * are skipped. Run it on bytes protobuf-c has already decoded (so the framing is known good). */
#ifndef FREEKV_PBCHECK_H
#define FREEKV_PBCHECK_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* 0, or -EINVAL (a bad string) / -EBADMSG (framing) with the field's path in err. */
int pbcheck_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, char *err,
		    size_t errlen);

/* Whether s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF). */
int pbcheck_utf8(const uint8_t *s, size_t n);

#endif
