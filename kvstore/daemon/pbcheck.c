/* pbcheck — NUL and UTF-8 checks of protobuf string fields on the wire. See pbcheck.h. */
#include "pbcheck.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "errmsg.h"

#define MAX_DEPTH 16
#define PATH_MAX_LEN 160

int pbcheck_utf8(const uint8_t *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = s[i];
		size_t len;
		uint32_t cp, min;
		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			len = 2, cp = c & 0x1f, min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			len = 3, cp = c & 0x0f, min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			len = 4, cp = c & 0x07, min = 0x10000;
		} else {
			return 0;
		}
		if (n - i < len)
			return 0;
		for (size_t k = 1; k < len; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (s[i + k] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		i += len;
	}
	return 1;
}

static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64 && *p < end; shift += 7) {
		uint8_t b = *(*p)++;
		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return 0;
	}
	return -EBADMSG;
}

static int walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
		char *path, size_t plen, int depth, char *err, size_t errlen)
{
	if (depth > MAX_DEPTH)
		return errmsg(err, errlen, -EBADMSG, "%s: messages nested too deeply", path);
	while (p < end) {
		uint64_t tag, n;
		if (varint(&p, end, &tag))
			return errmsg(err, errlen, -EBADMSG, "%s: truncated field tag", path);
		switch (tag & 7) {
		case 0:
			if (varint(&p, end, &n))
				return errmsg(err, errlen, -EBADMSG, "%s: truncated varint", path);
			continue;
		case 1:
			n = 8;
			break;
		case 5:
			n = 4;
			break;
		case 2:
			if (varint(&p, end, &n))
				return errmsg(err, errlen, -EBADMSG, "%s: truncated length", path);
			break;
		default:
			return errmsg(err, errlen, -EBADMSG, "%s: wire type %u not used by freekv",
				      path, (unsigned)(tag & 7));
		}
		if (n > (uint64_t)(end - p))
			return errmsg(err, errlen, -EBADMSG, "%s: field longer than the message", path);
		const ProtobufCFieldDescriptor *f =
			(tag >> 3) <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3)) : NULL;
		if ((tag & 7) == 2 && f) {
			size_t at = strlen(path);
			snprintf(path + at, plen - at, "%s%s", at ? "." : "", f->name);
			if (f->type == PROTOBUF_C_TYPE_STRING) {
				const uint8_t *nul = memchr(p, 0, n);
				if (nul)
					return errmsg(err, errlen, -EINVAL, "%s: NUL byte at offset %zu of "
						      "%zu", path, (size_t)(nul - p), (size_t)n);
				if (!pbcheck_utf8(p, n))
					return errmsg(err, errlen, -EINVAL, "%s: not UTF-8", path);
			} else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
				int ret = walk(f->descriptor, p, p + n, path, plen, depth + 1, err, errlen);
				if (ret)
					return ret;
			}
			path[at] = '\0';
		}
		p += n;
	}
	return 0;
}

int pbcheck_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, char *err,
		    size_t errlen)
{
	char path[PATH_MAX_LEN] = "request";
	return walk(d, p, p + len, path, sizeof path, 0, err, errlen);
}
