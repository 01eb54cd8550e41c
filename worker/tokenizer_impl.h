/* tokenizer_impl — the tokenizer's private state, shared by tokenizer.c (encode/decode, the BPE
 * core) and tokenizer_load.c (GGUF and tokenizer.json loaders). Not for use outside those two.
 * Pre-tokenization (how a segment is cut into pieces) is its own module, pretok.h.
 *
 * A loader calls tokenizer_alloc(n_vocab), fills every id with tokenizer_set_token(), adds
 * merges with tokenizer_add_merge() (rank mode), sets the options below, and finally calls
 * tokenizer_finish(), which builds the lookup tables. All memory hangs off the struct and is
 * released by tokenizer_free(). */
#ifndef FREEKV_TOKENIZER_IMPL_H
#define FREEKV_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pretok.h"
#include "tokenizer.h"

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. */
enum tok_type {
	TOKT_NONE = 0,	  /* an id no file defines: never produced, decodes to nothing */
	TOKT_NORMAL = 1,
	TOKT_UNKNOWN = 2,
	TOKT_CONTROL = 3, /* special: matched verbatim, decodes to nothing */
	TOKT_USER = 4,	  /* added, not special: matched verbatim, decodes verbatim */
	TOKT_UNUSED = 5,
	TOKT_BYTE = 6,	  /* <0xNN> byte fallback */
};

/* How the best adjacent pair is chosen. */
enum tok_merge {
	TOK_MERGE_SCORE = 0, /* merged piece in the vocabulary with the highest score (SentencePiece) */
	TOK_MERGE_RANK = 1,  /* pair with the lowest rank in the merges list (HF tokenizers) */
};

#define TOK_MAX_NORM 8
#define TOK_MAX_PAT 16

/* One normalizer step on a text segment: NFC (Unicode canonical composition, utf8proc), or
 * PREPEND `with` (non-empty segments only), or REPLACE every `pat` by `with`. */
struct tok_norm {
	bool nfc;
	bool prepend;
	char pat[TOK_MAX_PAT];
	char with[TOK_MAX_PAT];
};

struct tok_strmap {
	uint32_t mask;	/* capacity - 1, capacity a power of two */
	int32_t *slot;	/* id + 1, 0 = empty */
};

struct tok_pairmap {
	uint32_t mask;
	uint64_t *key;	/* (left id << 32 | right id) + 1, 0 = empty */
	int32_t *rank;
	int32_t *id;	/* the merged token */
};

struct tok_special {
	int id;
	uint32_t len;
	const char *text; /* in the pool */
};

struct fkv_tokenizer {
	enum tok_merge merge;
	bool byte_level;	/* pieces are bytes mapped through the GPT-2 byte table */
	bool byte_fallback;	/* unknown characters become <0xNN> tokens */
	bool ignore_merges;	/* a whole pre-token found in the vocabulary is emitted as is */
	int n_vocab;

	char *pool;		/* token texts, each NUL-terminated */
	size_t pool_len, pool_cap;
	uint32_t *off;		/* per id: offset of its text in pool */
	uint32_t *len;		/* per id: text length in bytes */
	float *score;		/* per id (score mode) */
	uint8_t *type;		/* per id: enum tok_type */

	struct tok_strmap vocab;	/* text -> id, for tokens text can produce */
	struct tok_pairmap merges;	/* rank mode */
	int n_merges;
	int byte_tok[256];		/* id of <0xNN>, -1 when absent */
	uint16_t b2u[256];		/* GPT-2 byte -> code point */
	int16_t u2b[512];		/* code point -> byte, -1 when not in the table */

	int unk, bos, eos;		/* -1 when none */
	bool add_bos;

	/* Normalisation of each text segment between special tokens, then its pre-tokenization
	 * (no stages: the whole segment is one piece). */
	struct tok_norm norm[TOK_MAX_NORM];
	int n_norm;
	struct pretok pre;

	struct tok_special *sp;		/* sorted by first byte, then longest first */
	int n_sp;
	int sp_start[257];		/* sp[sp_start[b] .. sp_start[b+1]) start with byte b */

	/* Decoder. */
	bool dec_bytes;			/* map code points back through the GPT-2 byte table */
	bool dec_byte_fallback;		/* <0xNN> -> the byte */
	char dec_pat[TOK_MAX_PAT];	/* replace dec_pat by dec_with in token texts ("" = none) */
	char dec_with[TOK_MAX_PAT];
	int dec_strip;			/* leading spaces dropped from the decoded text */
};

/* A fresh tokenizer with n_vocab ids of type TOKT_NONE and defaults (score mode, no
 * normalisation). NULL on allocation failure. */
struct fkv_tokenizer *tokenizer_alloc(int n_vocab);
/* Sets id's text (copied), score and type. 0, -EINVAL (id out of range) or -ENOMEM. */
int tokenizer_set_token(struct fkv_tokenizer *t, int id, const char *text, size_t len,
			float score, enum tok_type type);
/* Id of a token text in the vocabulary, or -1. Valid after tokenizer_finish(), or during loading
 * after tokenizer_index_vocab(). */
int tokenizer_lookup(const struct fkv_tokenizer *t, const char *s, size_t len);
/* Builds the text -> id map (done by tokenizer_finish() when not yet done). 0 or -ENOMEM. */
int tokenizer_index_vocab(struct fkv_tokenizer *t);
/* Records merge (left, right) -> merged at the next rank; sizes the table for n_hint merges on
 * the first call. 0, -EEXIST (pair already listed: the first rank is kept) or -ENOMEM. */
int tokenizer_add_merge(struct fkv_tokenizer *t, int left, int right, int merged, int n_hint);
/* Builds the special-token index and byte-fallback table. 0 or -ENOMEM. */
int tokenizer_finish(struct fkv_tokenizer *t);

#endif
