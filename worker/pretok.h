/* pretok — pre-tokenization: cuts a text segment into the pieces that BPE merges within.
 *
 * A pretok is a list of stages run in order; each stage works on every piece the stages
 * before it produced, never across two pieces (Hugging Face's pre-tokenizer Sequence, and
 * llama.cpp's unicode_regex_split over its regex_exprs, both work this way). Stages:
 *  - SPLIT: a PCRE2 regex (UTF + UCP) or a literal string finds matches in the piece; the
 *    matches and the gaps between them become pieces as one of HF's split behaviours says
 *    (Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous), optionally with
 *    matches and gaps swapped (invert). Empty matches only mark a cut, as in HF.
 *  - REPLACE: every occurrence of a string by another (Metaspace's ' ' -> '▁').
 *  - PREFIX: a string put in front of each piece that does not already start with it
 *    (ByteLevel's add_prefix_space, Metaspace's prepend_scheme).
 * Two sources fill it: the table of GGUF tokenizer.ggml.pre names (pretok_from_gguf), and the
 * tokenizer.json loader, through the pretok_add_* calls that mirror HF's pre-tokenizer types.
 *
 * Ownership: a struct pretok is embedded in its owner (the tokenizer), starts zeroed, owns its
 * compiled regexes and is released with pretok_free(). Once built it is read-only:
 * pretok_run() allocates its own scratch, so any number of threads may run one pretok. */
#ifndef FREEKV_PRETOK_H
#define FREEKV_PRETOK_H

#include <stdbool.h>
#include <stddef.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define PRETOK_MAX_STAGES 16
#define PRETOK_MAX_STR 16

enum pretok_kind {
	PRETOK_SPLIT = 0,
	PRETOK_REPLACE = 1,
	PRETOK_PREFIX = 2,
};

/* HF SplitDelimiterBehavior: what becomes of a match ("delimiter") and the text around it. */
enum pretok_behavior {
	PRETOK_ISOLATED = 0,	  /* a piece of its own */
	PRETOK_REMOVED = 1,	  /* dropped */
	PRETOK_MERGED_PREV = 2,	  /* appended to the piece before it */
	PRETOK_MERGED_NEXT = 3,	  /* prepended to the piece after it */
	PRETOK_CONTIGUOUS = 4,	  /* adjacent matches form one piece */
};

struct pretok_stage {
	enum pretok_kind kind;
	enum pretok_behavior behavior;	/* SPLIT */
	bool invert;			/* SPLIT: gaps are the matches */
	bool first_only;		/* PREFIX: only the piece at the very start of the text */
	pcre2_code *re;			/* SPLIT, for valid UTF-8 */
	pcre2_code *re_any;		/* SPLIT, the same tolerating invalid UTF-8 */
	char pat[PRETOK_MAX_STR];	/* REPLACE: what is replaced */
	char with[PRETOK_MAX_STR];	/* REPLACE: the replacement; PREFIX: the prefix */
};

struct pretok {
	struct pretok_stage st[PRETOK_MAX_STAGES];
	int n;
};

/* What a GGUF pre-tokenizer name implies besides its stages (llama.cpp's per-name flags). */
struct pretok_gguf_flags {
	bool ignore_merges;	/* a piece found whole in the vocabulary is one token */
	bool add_bos;		/* BOS is added unless tokenizer.ggml.add_bos_token says otherwise */
};

/* Appends the stages of GGUF pre-tokenizer `name` (tokenizer.ggml.pre) to p and sets *flags.
 * 0, -ENOTSUP (an unknown name: err lists the known ones), -EINVAL / -ENOMEM (a regex that
 * does not compile, which is a bug in the table) or -E2BIG (p is full). */
int pretok_from_gguf(struct pretok *p, const char *name, struct pretok_gguf_flags *flags,
		     char *err, size_t errlen);
/* The known GGUF names and their regexes (NULL-terminated, static), for listings and tests:
 * i in [0, pretok_gguf_count()), NULL outside. */
int pretok_gguf_count(void);
const char *pretok_gguf_name(int i);
const char *const *pretok_gguf_stages(int i);

/* SPLIT by a PCRE2 regex (compiled with UTF, UCP, invalid UTF-8 tolerated). 0, -EINVAL (does
 * not compile: err names the offset and PCRE2's reason), -E2BIG (p full) or -ENOMEM. */
int pretok_add_regex(struct pretok *p, const char *pattern, enum pretok_behavior behavior,
		     bool invert, char *err, size_t errlen);
/* SPLIT by a literal string (an empty one matches emptily everywhere, cutting the piece into
 * characters, as in HF). Errors as above. */
int pretok_add_literal(struct pretok *p, const char *s, enum pretok_behavior behavior,
		       bool invert, char *err, size_t errlen);
/* REPLACE pat (non-empty) by with; PREFIX with. -EINVAL (pat empty, or a string of
 * PRETOK_MAX_STR bytes or more) or -E2BIG. */
int pretok_add_replace(struct pretok *p, const char *pat, const char *with, char *err,
		       size_t errlen);
int pretok_add_prefix(struct pretok *p, const char *with, bool first_only, char *err,
		      size_t errlen);

/* HF pre-tokenizer types in stage form. ByteLevel: a " " prefix when add_prefix_space, then
 * GPT-2's split regex when use_regex (the byte mapping itself is the tokenizer's). Digits:
 * each \p{N} a piece (individual) or each run of them. Metaspace: ' ' -> replacement, the
 * replacement prepended per scheme ("always", "first" or "never"), and with split a cut
 * before each replacement (MergedWithNext). Errors as the calls above, -EINVAL for a bad
 * scheme. */
int pretok_add_bytelevel(struct pretok *p, bool add_prefix_space, bool use_regex, char *err,
			 size_t errlen);
int pretok_add_digits(struct pretok *p, bool individual, char *err, size_t errlen);
int pretok_add_metaspace(struct pretok *p, const char *replacement, const char *scheme,
			 bool split, char *err, size_t errlen);

/* Called once per final piece, in text order; a non-zero return stops the run and is
 * returned by pretok_run(). The piece is only valid during the call. */
typedef int (*pretok_fn)(void *arg, const char *s, size_t n);

/* Runs the stages over s[0..n) (at_start: s begins the whole text, for first_only) and calls
 * fn on each non-empty piece; with no stages, s itself is the one piece. 0, fn's non-zero
 * return, -ENOMEM, or -E2BIG (PCRE2 gave up within its match or heap limits). */
int pretok_run(const struct pretok *p, const char *s, size_t n, bool at_start, pretok_fn fn,
	       void *arg);

/* Releases the compiled regexes and zeroes p. Safe on a zeroed pretok. */
void pretok_free(struct pretok *p);

#endif
