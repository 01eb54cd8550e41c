/* Shared by the tokenizer tests (test_tokenizer.c, test_tokenizer_bytelevel.c): encode a text
 * and compare the ids, the decode round trip, and random text that hits the tokenizers' edges.
 * Header-only; include after test_util.h. */
#ifndef FREEKV_TEST_TOKENIZER_H
#define FREEKV_TEST_TOKENIZER_H

#include <stdbool.h>
#include <string.h>

#include "tokenizer.h"

#define MAX_IDS 64

static inline void expect_ids(const struct fkv_tokenizer *t, const char *text, bool bos,
			      const int *want, int n_want)
{
	int *ids = NULL;
	int n = tokenizer_encode(t, text, bos, &ids);
	if (n != n_want || (n > 0 && memcmp(ids, want, (size_t)n * sizeof *ids) != 0)) {
		fprintf(stderr, "text \"%s\": got", text);
		for (int i = 0; i < n; i++)
			fprintf(stderr, " %d", ids[i]);
		fprintf(stderr, " (n=%d), want %d ids\n", n, n_want);
		fail();
	}
	free(ids);
}

static inline void expect_roundtrip(const struct fkv_tokenizer *t, const char *text)
{
	int *ids = NULL;
	char *back = NULL;
	int n = tokenizer_encode(t, text, true, &ids);
	assert_true(n >= 0);
	int len = tokenizer_decode(t, ids, n, &back);
	assert_int_equal(len, (int)strlen(text));
	assert_string_equal(back, text);
	free(ids);
	free(back);
}

/* Random text from fragments chosen to hit merges, spaces, newlines, tabs, accents, CJK, emoji,
 * control bytes, invalid UTF-8 and (with_specials) special-token texts. */
static inline void random_text(uint64_t *rng, char *out, size_t cap, bool with_specials)
{
	static const char *frag[] = {
		"Once", " upon", " a", " time", " there", " was", " little", " girl", " Lily", " the",
		" and", " Max", ".", ",", "!", "?", "\"", "'", " ", "  ", "   ", "\n", "\n\n", "\t",
		"a", "e", "th", "ing", "1", "23", "456", "caf\xc3\xa9", "na\xc3\xafve",
		"\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x98\x80", "\xc3\xb1", "e\xcc\x81", "\x01",
		"\x7f", "\xff", "\xc3", "\xe2\x80\x94", "Hello", "world", " he", "said",
	};
	static const char *sp[] = { "<s>", "</s>", "<unk>", "<", ">" };
	size_t n = 0, nf = sizeof frag / sizeof frag[0];
	int parts = (int)(test_rand(rng) % 16);
	for (int i = 0; i < parts; i++) {
		const char *f = with_specials && test_rand(rng) % 8 == 0 ? sp[test_rand(rng) % 5] :
									   frag[test_rand(rng) % nf];
		size_t fl = strlen(f);
		if (n + fl + 1 > cap)
			break;
		memcpy(out + n, f, fl);
		n += fl;
	}
	out[n] = '\0';
}

#endif
