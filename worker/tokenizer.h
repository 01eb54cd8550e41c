/* tokenizer — text <-> token ids for the models kvworker runs.
 *
 * Two families, both BPE:
 *  - SentencePiece style (Llama 2, stories260K): text is normalised ("▁" prepended, ' ' -> "▁"),
 *    split into UTF-8 characters, characters missing from the vocabulary become byte-fallback
 *    tokens <0xNN>, and adjacent symbols are merged best pair first — by the merged piece's
 *    score (GGUF tokenizer.ggml.model "llama") or by merge rank (tokenizer.json "merges").
 *  - Byte-level (GPT-2, Llama 3, Qwen2, SmolLM2, ...): text is cut by the model's
 *    pre-tokenizer (pretok.h: one or more PCRE2 regex stages), each piece's bytes are mapped
 *    through the GPT-2 byte-to-unicode table and merged by rank. Sources: tokenizer.json, or
 *    GGUF "gpt2" (tokens + merges, stages chosen by tokenizer.ggml.pre among every byte-level
 *    name llama.cpp knows).
 * Added / special tokens (tokenizer.json added_tokens, GGUF control and user-defined tokens) are
 * matched verbatim, longest first, before normalisation. Merging uses a linked list of symbols
 * and a binary heap of candidate pairs: O(n log n) in the input length.
 *
 * Limits (clear errors at load time, never silent): normalizers Prepend / Replace (string
 * patterns) / Sequence / NFC (Unicode canonical composition, with utf8proc, as Qwen2 ships it);
 * pre-tokenizers Split (every behaviour, invert, Regex or String) / Digits / ByteLevel (last) /
 * Metaspace / Sequence; decoders Replace / ByteFallback / Fuse / Strip / ByteLevel / Metaspace /
 * Sequence. Added tokens are matched on
 * the raw text (their lstrip/rstrip/normalized flags are not applied). GGUF vocabularies carry
 * no normalizer: NFC is not applied to them.
 *
 * Ownership: tokenizer_load*() allocate a struct fkv_tokenizer that owns copies of everything it
 * needs (the model, GGUF context or JSON can be freed afterwards); tokenizer_free() releases it.
 * A loaded tokenizer is immutable: any number of threads may encode/decode concurrently.
 * Arrays and strings returned through out-parameters are malloc'ed and owned by the caller. */
#ifndef FREEKV_TOKENIZER_H
#define FREEKV_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>

struct fkv_model;
struct gguf_ctx;
struct fkv_tokenizer;

/* From a loaded model: its GGUF vocabulary (model_gguf(m) != NULL), else <m->path>/tokenizer.json
 * (with tokenizer_config.json and config.json beside it for BOS/EOS). Returns 0 or a negative
 * errno with a message in err. */
int tokenizer_load(const struct fkv_model *m, struct fkv_tokenizer **out, char *err, size_t errlen);
/* From a parsed GGUF file (borrowed for the call only). */
int tokenizer_load_gguf(const struct gguf_ctx *g, struct fkv_tokenizer **out, char *err,
			size_t errlen);
/* From a tokenizer.json file; tokenizer_config.json and config.json in the same folder are read
 * when present for bos_token / eos_token / add_bos_token and bos/eos ids. */
int tokenizer_load_json(const char *path, struct fkv_tokenizer **out, char *err, size_t errlen);
/* Safe on NULL. */
void tokenizer_free(struct fkv_tokenizer *t);

/* UTF-8 text -> ids. Invalid UTF-8 is tolerated (such bytes are single symbols) unless the
 * tokenizer normalises to NFC, which is defined on code points only: then it is -EILSEQ.
 * *ids is malloc'ed (caller frees; non-NULL even for a count of 0). BOS is prepended when
 * add_bos is true and the model's tokenizer adds one (tokenizer_adds_bos()). Returns the count,
 * or -ENOMEM, -EINVAL (NULL text), -E2BIG (over 1 GiB, or a piece PCRE2 gave up on within its
 * match limits), -EILSEQ (invalid UTF-8 under NFC, or a symbol with no token and no byte/unk
 * fallback). */
int tokenizer_encode(const struct fkv_tokenizer *t, const char *text, bool add_bos, int **ids);
/* ids -> NUL-terminated text (caller frees). Byte-fallback tokens become raw bytes (joined into
 * UTF-8; invalid sequences are passed through as bytes), "▁" -> ' ' with the first leading space
 * dropped as SentencePiece does, byte-level tokens are mapped back through the GPT-2 byte
 * table. Special (control) tokens produce no text; the unknown token produces U+FFFD. Returns
 * the byte length or -EINVAL (an id out of range) / -ENOMEM. */
int tokenizer_decode(const struct fkv_tokenizer *t, const int *ids, int n, char **text);
/* The raw bytes one token contributes when printed after others (no leading-space stripping):
 * for streaming output. Writes at most len bytes to buf (not NUL-terminated) and returns the
 * full byte count (which may exceed len), or -EINVAL for an id out of range. */
int tokenizer_piece(const struct fkv_tokenizer *t, int id, char *buf, size_t len);

int tokenizer_bos(const struct fkv_tokenizer *t); /* -1 when none */
int tokenizer_eos(const struct fkv_tokenizer *t); /* -1 when none */
bool tokenizer_adds_bos(const struct fkv_tokenizer *t);
/* Number of ids (highest id + 1, added tokens included). */
int tokenizer_vocab_size(const struct fkv_tokenizer *t);
/* True for control / special tokens (BOS, EOS, <|eot_id|>, ...), which decode to nothing. */
bool tokenizer_is_special(const struct fkv_tokenizer *t, int id);

#endif
