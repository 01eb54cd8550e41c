/* textout — see textout.h. */
#include "textout.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int tbuf_append(struct tbuf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

void tbuf_free(struct tbuf *b)
{
	free(b->p);
	*b = (struct tbuf){ 0 };
}

/* Length of the valid UTF-8 sequence at s (n bytes left): 1..4, 0 when invalid, -1 when s is
 * a valid but unfinished prefix. */
static int seq_len(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	int len;
	uint32_t min, cp;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf) {
		len = 2, min = 0x80, cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		len = 3, min = 0x800, cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4, min = 0x10000, cp = c & 0x07;
	} else {
		return 0;
	}
	for (int i = 1; i < len; i++) {
		if ((size_t)i >= n)
			return -1;
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
		/* Overlong, surrogate or out of range is known after the second byte. */
		if (i == 1) {
			uint32_t lo = cp << (6 * (len - 2)), hi = lo | ((1u << (6 * (len - 2))) - 1);
			if (hi < min || lo > 0x10ffff || (lo >= 0xd800 && hi <= 0xdfff && len == 3))
				return 0;
		}
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

int utf8_sanitize(const char *s, size_t n, struct tbuf *out)
{
	size_t i = 0, run = 0; /* valid bytes not yet copied start at i - run */
	while (i < n) {
		int l = seq_len((const unsigned char *)s + i, n - i);
		if (l > 0) {
			i += (size_t)l;
			run += (size_t)l;
			continue;
		}
		if (tbuf_append(out, s + i - run, run) || tbuf_append(out, "\xef\xbf\xbd", 3))
			return -ENOMEM;
		run = 0;
		i++;
	}
	return tbuf_append(out, s + n - run, run);
}

void textout_init(struct textout *t, const char *const *stop, int n_stop)
{
	*t = (struct textout){ .stop = stop, .n_stop = n_stop };
}

void textout_free(struct textout *t)
{
	tbuf_free(&t->all);
}

/* Hands out all[emitted..end) and moves emitted. */
static int emit(struct textout *t, size_t end, struct tbuf *out)
{
	int ret = utf8_sanitize(t->all.p + t->emitted, end - t->emitted, out);
	t->emitted = end;
	return ret;
}

static int advance(struct textout *t, bool final, struct tbuf *out)
{
	if (t->stopped || !t->all.p)
		return 0;
	const char *base = t->all.p;
	size_t len = t->all.len, best = len;
	bool found = false;
	/* A stop string can only start at or after `emitted`: anything that could have begun
	 * one earlier was held back. */
	for (int k = 0; k < t->n_stop; k++) {
		size_t sl = strlen(t->stop[k]);
		for (size_t at = t->emitted; sl && at + sl <= len && at < best; at++)
			if (!memcmp(base + at, t->stop[k], sl)) {
				best = at;
				found = true;
				break;
			}
	}
	if (found) {
		t->stopped = true;
		return emit(t, best, out);
	}
	size_t end = len;
	if (!final) {
		/* Hold back the longest tail that a stop string begins with. */
		size_t hold = 0;
		for (int k = 0; k < t->n_stop; k++) {
			size_t sl = strlen(t->stop[k]);
			for (size_t h = sl ? sl - 1 : 0; h > hold; h--)
				if (h <= len - t->emitted && !memcmp(base + len - h, t->stop[k], h)) {
					hold = h;
					break;
				}
		}
		end = len - hold;
		/* And an unfinished character at the end. */
		for (size_t back = 1; back <= 3 && back <= end - t->emitted; back++) {
			const unsigned char *c = (const unsigned char *)base + end - back;
			if ((*c & 0xc0) != 0x80) {
				if (seq_len(c, back) < 0)
					end -= back;
				break;
			}
		}
	}
	return emit(t, end, out);
}

int textout_push(struct textout *t, const char *p, size_t n, struct tbuf *out)
{
	if (t->stopped)
		return 0;
	if (tbuf_append(&t->all, p, n))
		return -ENOMEM;
	return advance(t, false, out);
}

int textout_flush(struct textout *t, struct tbuf *out)
{
	return advance(t, true, out);
}
