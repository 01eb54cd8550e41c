/* textout — the text a completion returns, built from the pieces a worker streams: applies the
 * request's `stop` strings (the text ends before the first one, which is not returned, as the
 * OpenAI API specifies) and hands out only valid UTF-8 (JSON strings must be; a token may end
 * inside a multi-byte character, so its tail waits for the next piece, and bytes that never
 * form a character become U+FFFD at the end).
 *
 * What textout_push() hands out never changes afterwards: text that could still be the start
 * of a stop string, or an unfinished character, is held back until the next piece decides.
 *
 * Ownership: struct textout and struct tbuf are the caller's; stop strings are borrowed for the
 * textout's lifetime; the buffers are freed by textout_free / tbuf_free. */
#ifndef FREEKV_TEXTOUT_H
#define FREEKV_TEXTOUT_H

#include <stdbool.h>
#include <stddef.h>

struct tbuf {
	char *p;		/* NUL-terminated when non-NULL */
	size_t len, cap;
};

/* 0 or -ENOMEM. */
int tbuf_append(struct tbuf *b, const char *s, size_t n);
void tbuf_free(struct tbuf *b);

struct textout {
	struct tbuf all;	/* every byte received */
	size_t emitted;		/* bytes of `all` already handed out */
	const char *const *stop;
	int n_stop;
	bool stopped;		/* a stop string was found: nothing more is handed out */
};

void textout_init(struct textout *t, const char *const *stop, int n_stop);
void textout_free(struct textout *t);
/* Takes a piece; appends to out what may be handed out now. 0 or -ENOMEM. */
int textout_push(struct textout *t, const char *p, size_t n, struct tbuf *out);
/* The end of the stream: appends everything still held back (invalid UTF-8 replaced). */
int textout_flush(struct textout *t, struct tbuf *out);

/* Appends s[0..n) to out with every byte that is not part of valid UTF-8 replaced by U+FFFD. */
int utf8_sanitize(const char *s, size_t n, struct tbuf *out);

#endif
