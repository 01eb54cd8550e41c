/* pretok — pre-tokenization stages (see pretok.h): the GGUF tokenizer.ggml.pre table, HF's
 * pre-tokenizer types in stage form, and the run that cuts a segment into pieces. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pretok.h"

/* ---- the GGUF table ----
 *
 * Every tokenizer.ggml.pre name llama.cpp maps to a byte-level BPE pre-tokenizer
 * (src/llama-vocab.cpp: the names in llama_vocab::impl::load, the regex_exprs per pre type in
 * llm_tokenizer_bpe), with llama.cpp's regexes as data. Names whose tokenizer is not
 * byte-level there (gemma4, granite-embed-multi-311m, sarvam-moe: SentencePiece-style BPE on
 * raw UTF-8; whitespace: a word splitter) are not in the table. Two pre types are a custom
 * splitter in llama.cpp rather than a regex; they are written here as the regex their models
 * ship: kimi-k2 (its tiktoken pattern, with "[...&&[^\p{Han}]]" as a lookahead, which PCRE2
 * lacks) and afmoe's digit grouping (a run of digits cut into threes from the right). */

/* GPT-2's split as llama.cpp writes it: no final "|\s+", as whitespace it leaves unmatched is
 * a piece of its own anyway. */
#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* llama.cpp's case-insensitive contractions, spelled out ("(?i:'s|...)" in the originals). */
#define RX_CONTR "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_TAIL "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_LLAMA3                                                                                  \
	RX_CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" RX_TAIL
#define RX_QWEN2                                                                                   \
	RX_CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" RX_TAIL
/* Upper-then-lower words (GPT-4o, Tekken), lookaheads standing in for \p{Lu}-style classes. */
#define RX_UPPER_LOWER(L)                                                                          \
	"[^\\r\\n\\p{L}\\p{N}]?((?=[" L "])([^a-z]))*((?=[" L "])([^A-Z]))+"
#define RX_UPPERS_LOWERS(L)                                                                        \
	"[^\\r\\n\\p{L}\\p{N}]?((?=[" L "])([^a-z]))+((?=[" L "])([^A-Z]))*"
#define RX_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RX_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RX_CASED_WORDS                                                                             \
	"[^\\r\\n\\p{L}\\p{N}]?" RX_UPPER "*" RX_LOWER "+" RX_CONTR                                       \
	"?|[^\\r\\n\\p{L}\\p{N}]?" RX_UPPER "+" RX_LOWER "*" RX_CONTR "?"
#define RX_DS3_WORDS                                                                               \
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
#define RX_CJK_KANA "[一-龥぀-ゟ゠-ヿ]+"
#define RX_NO_PUNCT " ?[^(\\s|.,!?…。，、।۔،)]+"
/* Kimi K2's tiktoken pattern; "(?!\p{Han})" before a class is its "&&[^\p{Han}]". */
#define RX_NOHAN(c) "(?:(?!\\p{Han})[" c "])"
#define RX_KIMI_K2                                                                                 \
	"[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?" RX_NOHAN("\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}") "*"           \
	RX_NOHAN("\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}") "+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?" \
	RX_NOHAN("\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}") "+" RX_NOHAN("\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}")        \
	"*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" RX_TAIL

static const char *const S_DEFAULT[] = { "[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+",
					 "[0-9][0-9][0-9]", NULL };
static const char *const S_GPT2[] = { RX_GPT2, NULL };
static const char *const S_LLAMA3[] = { RX_LLAMA3, NULL };
static const char *const S_QWEN2[] = { RX_QWEN2, NULL };
static const char *const S_JAIS2[] = {
	RX_CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
	"|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)"
	"|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
	NULL
};
static const char *const S_DEEPSEEK_LLM[] = {
	"[\r\n]",
	"\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
	"\\s?[!-/:-~！-／：-～‘-‟　-。]+",
	"\\s+$",
	"[一-龥ࠀ-一가-퟿]+",
	"\\p{N}+",
	NULL
};
static const char *const S_DEEPSEEK3[] = {
	"\\p{N}{1,3}", RX_CJK_KANA,
	RX_DS3_WORDS "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+", NULL
};
static const char *const S_SPARK2_5[] = {
	"\\p{N}{1,3}", RX_CJK_KANA,
	RX_DS3_WORDS "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+", "\\p{N}", NULL
};
static const char *const S_YOUTU[] = {
	"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
	RX_CASED_WORDS "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" RX_TAIL,
	NULL
};
static const char *const S_DEEPSEEK_CODER[] = {
	"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
	"[一-龥ࠀ-一가-퟿]+",
	"\\p{N}",
	NULL
};
static const char *const S_FALCON[] = { "[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]",
					NULL };
static const char *const S_STARCODER[] = { "\\p{N}", RX_GPT2, NULL };
static const char *const S_QWEN35[] = {
	RX_CONTR "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
	RX_TAIL,
	NULL
};
static const char *const S_BLOOM[] = { RX_NO_PUNCT, NULL };
static const char *const S_VIKING[] = { RX_NO_PUNCT, "\\p{N}", NULL };
static const char *const S_TEKKEN[] = {
	RX_UPPER_LOWER("\\p{L}") "|" RX_UPPERS_LOWERS("\\p{L}") "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
	RX_TAIL,
	NULL
};
static const char *const S_CHAMELEON[] = {
	"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
	"[\\p{P}!-/:-@\\[-`{-~]", RX_GPT2, NULL
};
static const char *const S_GPT4O[] = {
	RX_UPPER_LOWER("\\p{L}") RX_CONTR "?|" RX_UPPERS_LOWERS("\\p{L}") RX_CONTR
	"?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" RX_TAIL,
	NULL
};
static const char *const S_GRANITE_EMB_MULTI[] = {
	RX_UPPER_LOWER("\\p{L}\\p{M}") RX_CONTR "?|" RX_UPPERS_LOWERS("\\p{L}\\p{M}") RX_CONTR
	"?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" RX_TAIL,
	NULL
};
static const char *const S_TINY_AYA[] = {
	"\\d{1,3}(?=(?:\\d{3})*\\b)",
	RX_CASED_WORDS "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" RX_TAIL,
	NULL
};
static const char *const S_KIMI_K2[] = { RX_KIMI_K2, NULL };
static const char *const S_SUPERBPE[] = { "\\p{N}+", "(?=(\\d{3})+(?!\\d))", NULL };
static const char *const S_BAILINGMOE[] = {
	"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
	"| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
	NULL
};
static const char *const S_SEED_CODER[] = {
	RX_CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+" RX_TAIL, NULL
};
static const char *const S_UFAKZEKA[] = {
	"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" RX_TAIL, NULL
};
static const char *const S_AFMOE[] = {
	"\\p{N}{1,3}(?=(?:\\p{N}{3})*(?!\\p{N}))",
	"[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
	"| ?[\\p{P}\\p{S}]+[\\r\\n]*" RX_TAIL,
	NULL
};
static const char *const S_LAGUNA[] = { "[^\\n]+|[\\n]+", RX_QWEN2, NULL };
static const char *const S_EXAONE_MOE[] = {
	RX_CONTR "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
	"| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
	NULL
};
static const char *const S_MINICPM5[] = {
	"\\p{N}{1,3}",
	RX_CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" RX_TAIL, NULL
};

#define IGNORE_MERGES 1
#define ADD_BOS 2

static const struct {
	const char *name;
	const char *const *stages;
	int flags;
} gguf_table[] = {
	{ "default", S_DEFAULT, 0 },
	{ "minicpm5", S_MINICPM5, IGNORE_MERGES },
	{ "llama3", S_LLAMA3, IGNORE_MERGES | ADD_BOS },
	{ "llama-v3", S_LLAMA3, IGNORE_MERGES | ADD_BOS },
	{ "llama-bpe", S_LLAMA3, IGNORE_MERGES | ADD_BOS },
	{ "falcon3", S_LLAMA3, IGNORE_MERGES | ADD_BOS },
	{ "falcon-h1", S_LLAMA3, IGNORE_MERGES | ADD_BOS },
	{ "pixtral", S_LLAMA3, IGNORE_MERGES | ADD_BOS },
	{ "midm-2.0", S_LLAMA3, IGNORE_MERGES | ADD_BOS },
	{ "lfm2", S_LLAMA3, IGNORE_MERGES | ADD_BOS },
	{ "jina-v5-nano", S_LLAMA3, IGNORE_MERGES | ADD_BOS },
	{ "deepseek-llm", S_DEEPSEEK_LLM, 0 },
	{ "deepseek-coder", S_DEEPSEEK_CODER, 0 },
	{ "deepseek-v3", S_DEEPSEEK3, 0 },
	{ "spark2_5", S_SPARK2_5, 0 },
	{ "youtu", S_YOUTU, IGNORE_MERGES },
	{ "falcon", S_FALCON, 0 },
	{ "mpt", S_GPT2, 0 },
	{ "starcoder", S_STARCODER, 0 },
	{ "gpt-2", S_GPT2, 0 },
	{ "phi-2", S_GPT2, 0 },
	{ "jina-es", S_GPT2, 0 },
	{ "jina-de", S_GPT2, 0 },
	{ "gigachat", S_GPT2, 0 },
	{ "jina-v2-es", S_GPT2, 0 },
	{ "jina-v2-de", S_GPT2, 0 },
	{ "a.x-4.0", S_GPT2, 0 },
	{ "mellum", S_GPT2, 0 },
	{ "modern-bert", S_GPT2, 0 },
	{ "jais-2", S_JAIS2, 0 },
	/* Encoders that append a separator token in llama.cpp: their pre-tokenizer is GPT-2's. */
	{ "jina-v1-en", S_GPT2, 0 },
	{ "jina-v2-code", S_GPT2, 0 },
	{ "roberta-bpe", S_GPT2, 0 },
	{ "refact", S_STARCODER, 0 },
	{ "command-r", S_STARCODER, 0 },
	{ "qwen2", S_QWEN2, 0 },
	{ "deepseek-r1-qwen", S_QWEN2, 0 },
	{ "kormo", S_QWEN2, 0 },
	{ "f2llmv2", S_QWEN2, 0 },
	{ "qwen35", S_QWEN35, 0 },
	{ "stablelm2", S_QWEN2, 0 },
	{ "olmo", S_GPT2, 0 },
	{ "dbrx", S_LLAMA3, 0 },
	{ "smaug-bpe", S_LLAMA3, 0 },
	{ "poro-chat", S_BLOOM, 0 },
	{ "glm4", S_LLAMA3, IGNORE_MERGES },
	{ "glm5", S_LLAMA3, IGNORE_MERGES },
	{ "chatglm-bpe", S_LLAMA3, 0 },
	{ "viking", S_VIKING, 0 },
	{ "jais", S_GPT2, 0 },
	{ "tekken", S_TEKKEN, IGNORE_MERGES | ADD_BOS },
	{ "smollm", S_STARCODER, 0 },
	{ "codeshell", S_STARCODER, 0 },
	{ "bloom", S_BLOOM, 0 },
	{ "gpt3-finnish", S_BLOOM, 0 },
	{ "exaone", S_STARCODER, 0 },
	{ "exaone4", S_GPT2, 0 },
	{ "exaone-moe", S_EXAONE_MOE, 0 },
	{ "chameleon", S_CHAMELEON, ADD_BOS },
	{ "minerva-7b", S_STARCODER, 0 },
	{ "megrez", S_QWEN2, 0 },
	{ "gpt-4o", S_GPT4O, 0 },
	{ "llama4", S_GPT4O, 0 },
	{ "kanana2", S_GPT4O, 0 },
	{ "talkie", S_GPT4O, 0 },
	{ "granite-embed-multi-97m", S_GRANITE_EMB_MULTI, IGNORE_MERGES },
	{ "tiny_aya", S_TINY_AYA, 0 },
	{ "cohere2moe", S_TINY_AYA, 0 },
	{ "superbpe", S_SUPERBPE, 0 },
	{ "trillion", S_GPT2, 0 },
	{ "granite-docling", S_GPT2, 0 },
	{ "bailingmoe", S_BAILINGMOE, 0 },
	{ "bailingmoe2", S_BAILINGMOE, 0 },
	{ "llada-moe", S_BAILINGMOE, 0 },
	{ "seed-coder", S_SEED_CODER, 0 },
	{ "hunyuan", S_QWEN2, 0 },
	{ "hunyuan-dense", S_DEEPSEEK3, 0 },
	{ "hy_v4", S_DEEPSEEK3, 0 },
	{ "joyai-llm", S_DEEPSEEK3, 0 },
	{ "kimi-k2", S_KIMI_K2, 0 },
	{ "ufakzeka", S_UFAKZEKA, 0 },
	{ "grok-2", S_QWEN2, 0 },
	{ "afmoe", S_AFMOE, 0 },
	{ "laguna", S_LAGUNA, 0 },
	{ "minimax-m2", S_GPT4O, 0 },
	{ "solar-open", S_QWEN2, 0 },
	{ "mellum2", S_STARCODER, 0 },
};

#define N_GGUF ((int)(sizeof gguf_table / sizeof gguf_table[0]))

int pretok_gguf_count(void)
{
	return N_GGUF;
}

const char *pretok_gguf_name(int i)
{
	return i >= 0 && i < N_GGUF ? gguf_table[i].name : NULL;
}

const char *const *pretok_gguf_stages(int i)
{
	return i >= 0 && i < N_GGUF ? gguf_table[i].stages : NULL;
}

int pretok_from_gguf(struct pretok *p, const char *name, struct pretok_gguf_flags *flags,
		     char *err, size_t errlen)
{
	int k = 0;
	while (k < N_GGUF && strcmp(gguf_table[k].name, name) != 0)
		k++;
	if (k == N_GGUF) {
		size_t at = (size_t)snprintf(err, errlen, "tokenizer.ggml.pre \"%s\" is not supported; "
					     "known:", name);
		for (int i = 0; i < N_GGUF && at < errlen; i++)
			at += (size_t)snprintf(err + at, errlen - at, " %s", gguf_table[i].name);
		return -ENOTSUP;
	}
	for (const char *const *re = gguf_table[k].stages; *re; re++) {
		int rc = pretok_add_regex(p, *re, PRETOK_ISOLATED, false, err, errlen);
		if (rc)
			return rc;
	}
	flags->ignore_merges = gguf_table[k].flags & IGNORE_MERGES;
	flags->add_bos = gguf_table[k].flags & ADD_BOS;
	return 0;
}

/* ---- building ---- */

/* HF ByteLevel's split: GPT-2's, ending in "\s+". */
static const char RX_BYTELEVEL[] = RX_GPT2 "|\\s+";

static struct pretok_stage *new_stage(struct pretok *p, enum pretok_kind kind, char *err,
				      size_t errlen)
{
	if (p->n == PRETOK_MAX_STAGES) {
		snprintf(err, errlen, "pre-tokenizer: more than %d stages", PRETOK_MAX_STAGES);
		return NULL;
	}
	struct pretok_stage *st = &p->st[p->n];
	memset(st, 0, sizeof *st);
	st->kind = kind;
	return st;
}

/* Whether PCRE2 knows name (len bytes, no braces) as a script: "\p{sc:name}" compiles. */
static bool is_script(const char *name, size_t len)
{
	char probe[80];
	int code;
	PCRE2_SIZE at;
	if (len == 0 || len > 60 || memchr(name, ':', len) || memchr(name, '=', len))
		return false;
	snprintf(probe, sizeof probe, "\\p{sc:%.*s}", (int)len, name);
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)probe, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
				       &code, &at, NULL);
	pcre2_code_free(re);
	return re != NULL;
}

/* PCRE2 (10.40 on) reads a script property \p{Han} as Script_Extensions, under which "。" is
 * Han too; Oniguruma (HF tokenizers) and Rust's regex (tiktoken) read it as Script. So each
 * \p{X} and \P{X} naming a script becomes \p{sc:X}. Returns a malloc'ed pattern, or NULL. */
static char *scripts_as_sc(const char *pat)
{
	size_t n = strlen(pat), o = 0;
	char *out = malloc(2 * n + 1); /* "\p{X}" is at least 5 bytes and grows by 3 */
	if (!out)
		return NULL;
	for (size_t i = 0; i < n;) {
		if (pat[i] != '\\' || i + 1 == n) {
			out[o++] = pat[i++];
			continue;
		}
		const char *close = strchr(pat + i, '}');
		size_t neg = pat[i + 2] == '{' && pat[i + 3] == '^';
		if ((pat[i + 1] == 'p' || pat[i + 1] == 'P') && pat[i + 2] == '{' && close &&
		    is_script(pat + i + 3 + neg, (size_t)(close - pat) - i - 3 - neg)) {
			memcpy(out + o, pat + i, 3 + neg);
			memcpy(out + o + 3 + neg, "sc:", 3);
			o += 6 + neg;
			i += 3 + neg;
			continue;
		}
		out[o++] = pat[i++]; /* an escape: its character is never a property opener */
		out[o++] = pat[i++];
	}
	out[o] = '\0';
	return out;
}

static int compile(struct pretok *p, const char *pattern, uint32_t opts, enum pretok_behavior b,
		   bool invert, char *err, size_t errlen)
{
	struct pretok_stage *st = new_stage(p, PRETOK_SPLIT, err, errlen);
	if (!st)
		return -E2BIG;
	char *pat = opts & PCRE2_LITERAL ? strdup(pattern) : scripts_as_sc(pattern);
	if (!pat)
		return -ENOMEM;
	int code;
	PCRE2_SIZE at;
	st->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts | PCRE2_UTF, &code, &at,
			       NULL);
	if (st->re)
		st->re_any = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
					   opts | PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
	free(pat);
	if (!st->re || !st->re_any) {
		char msg[256];
		pcre2_code_free(st->re);
		st->re = NULL;
		pcre2_get_error_message(code, (PCRE2_UCHAR *)msg, sizeof msg);
		snprintf(err, errlen, "pre-tokenizer regex \"%.80s\": %s at offset %zu", pattern, msg,
			 (size_t)at);
		return code == PCRE2_ERROR_HEAP_FAILED ? -ENOMEM : -EINVAL;
	}
	st->behavior = b;
	st->invert = invert;
	p->n++;
	return 0;
}

int pretok_add_regex(struct pretok *p, const char *pattern, enum pretok_behavior behavior,
		     bool invert, char *err, size_t errlen)
{
	return compile(p, pattern, PCRE2_UCP, behavior, invert, err, errlen);
}

int pretok_add_literal(struct pretok *p, const char *s, enum pretok_behavior behavior,
		       bool invert, char *err, size_t errlen)
{
	/* PCRE2_LITERAL takes no UCP. An empty string matches (emptily) everywhere: HF escapes the
	 * string into a regex, so it cuts between every two characters. */
	return compile(p, s, PCRE2_LITERAL, behavior, invert, err, errlen);
}

static int copy_str(char *dst, const char *src, char *err, size_t errlen)
{
	if (strlen(src) >= PRETOK_MAX_STR) {
		snprintf(err, errlen, "pre-tokenizer: \"%s\" is longer than %d bytes", src,
			 PRETOK_MAX_STR - 1);
		return -EINVAL;
	}
	strcpy(dst, src);
	return 0;
}

int pretok_add_replace(struct pretok *p, const char *pat, const char *with, char *err,
		       size_t errlen)
{
	struct pretok_stage *st = new_stage(p, PRETOK_REPLACE, err, errlen);
	if (!st)
		return -E2BIG;
	if (!*pat) {
		snprintf(err, errlen, "pre-tokenizer: empty string to replace");
		return -EINVAL;
	}
	int rc = copy_str(st->pat, pat, err, errlen);
	if (rc == 0)
		rc = copy_str(st->with, with, err, errlen);
	if (rc == 0)
		p->n++;
	return rc;
}

int pretok_add_prefix(struct pretok *p, const char *with, bool first_only, char *err,
		      size_t errlen)
{
	struct pretok_stage *st = new_stage(p, PRETOK_PREFIX, err, errlen);
	if (!st)
		return -E2BIG;
	int rc = copy_str(st->with, with, err, errlen);
	if (rc == 0) {
		st->first_only = first_only;
		p->n++;
	}
	return rc;
}

int pretok_add_bytelevel(struct pretok *p, bool add_prefix_space, bool use_regex, char *err,
			 size_t errlen)
{
	int rc = add_prefix_space ? pretok_add_prefix(p, " ", false, err, errlen) : 0;
	if (rc == 0 && use_regex)
		rc = pretok_add_regex(p, RX_BYTELEVEL, PRETOK_ISOLATED, false, err, errlen);
	return rc;
}

int pretok_add_digits(struct pretok *p, bool individual, char *err, size_t errlen)
{
	/* HF splits on char::is_numeric, the categories Nd, Nl and No: \p{N}. */
	return pretok_add_regex(p, "\\p{N}", individual ? PRETOK_ISOLATED : PRETOK_CONTIGUOUS, false,
				err, errlen);
}

int pretok_add_metaspace(struct pretok *p, const char *replacement, const char *scheme,
			 bool split, char *err, size_t errlen)
{
	bool always = !strcmp(scheme, "always"), first = !strcmp(scheme, "first");
	if (!always && !first && strcmp(scheme, "never") != 0) {
		snprintf(err, errlen, "Metaspace: prepend_scheme \"%s\" (always, first, never)", scheme);
		return -EINVAL;
	}
	if (!*replacement) {
		snprintf(err, errlen, "Metaspace: empty replacement");
		return -EINVAL;
	}
	int rc = pretok_add_replace(p, " ", replacement, err, errlen);
	if (rc == 0 && (always || first))
		rc = pretok_add_prefix(p, replacement, first, err, errlen);
	if (rc == 0 && split)
		rc = pretok_add_literal(p, replacement, PRETOK_MERGED_NEXT, false, err, errlen);
	return rc;
}

void pretok_free(struct pretok *p)
{
	for (int i = 0; i < p->n; i++) {
		pcre2_code_free(p->st[i].re);
		pcre2_code_free(p->st[i].re_any);
	}
	memset(p, 0, sizeof *p);
}

/* ---- running ---- */

struct piece {
	size_t off, len;
	bool at_start;	/* begins at offset 0 of a segment that begins the text */
};

struct plist {
	struct piece *v;
	size_t n, cap;
};

/* A match (m) or the gap between two, as HF's find_matches lists them. */
struct span {
	size_t a, b;
	bool m;
};

struct slist {
	struct span *v;
	size_t n, cap;
};

static int grow(void **v, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	size_t cap2 = *cap ? *cap * 2 : 64;
	while (cap2 < need)
		cap2 *= 2;
	void *nv = realloc(*v, cap2 * size);
	if (!nv)
		return -ENOMEM;
	*v = nv;
	*cap = cap2;
	return 0;
}

static int piece_push(struct plist *l, size_t off, size_t len, bool at_start)
{
	if (len == 0) /* HF drops empty pieces */
		return 0;
	if (grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v))
		return -ENOMEM;
	l->v[l->n++] = (struct piece){ off, len, at_start };
	return 0;
}

static int span_push(struct slist *l, size_t a, size_t b, bool m)
{
	if (grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v))
		return -ENOMEM;
	l->v[l->n++] = (struct span){ a, b, m };
	return 0;
}

/* Byte length of the UTF-8 character at s (n > 0 bytes left); a malformed one counts 1. */
static size_t utf8_len(const char *s, size_t n)
{
	unsigned char c = (unsigned char)s[0];
	size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 :
		     (c & 0xF8) == 0xF0 ? 4 : 1;
	if (len > n)
		return 1;
	for (size_t i = 1; i < len; i++)
		if (((unsigned char)s[i] & 0xC0) != 0x80)
			return 1;
	return len;
}

/* Whether s[0..n) is well-formed UTF-8 as PCRE2 defines it (no overlongs, surrogates or code
 * points past U+10FFFF). */
static bool utf8_valid(const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	for (size_t i = 0; i < n;) {
		if (u[i] < 0x80) {
			i++;
			continue;
		}
		size_t len = utf8_len(s + i, n - i);
		if (len == 1)
			return false;
		uint32_t c = u[i] & (0xFF >> (len + 1));
		for (size_t k = 1; k < len; k++)
			c = (c << 6) | (u[i + k] & 0x3F);
		static const uint32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
		if (c < min[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
			return false;
		i += len;
	}
	return true;
}

/* Matches and gaps of the stage's regex over s[0..n), the way HF iterates an Oniguruma regex:
 * an empty match right where the previous match ended is skipped by one character. With
 * valid UTF-8 the fast code runs without PCRE2's per-call UTF check, which scans the whole
 * subject each time (quadratic on a long piece); else the code that tolerates bad bytes. */
static int find_matches(const struct pretok_stage *st, bool valid, const char *s, size_t n,
			pcre2_match_data *md, struct slist *out)
{
	const pcre2_code *re = valid ? st->re : st->re_any;
	uint32_t opts = valid ? PCRE2_NO_UTF_CHECK : 0;
	size_t pos = 0, prev = 0;
	bool matched = false;
	out->n = 0;
	while (pos <= n) {
		int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, opts, md, NULL);
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0)
			return rc == PCRE2_ERROR_NOMEMORY ? -ENOMEM : -E2BIG;
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
		size_t a = ov[0], b = ov[1];
		if (a == b && matched && b == prev) {
			if (b >= n)
				break;
			pos = b + utf8_len(s + b, n - b);
			continue;
		}
		if ((a > prev && span_push(out, prev, a, false)) || span_push(out, a, b, true))
			return -ENOMEM;
		prev = pos = b;
		matched = true;
	}
	if (prev < n && span_push(out, prev, n, false))
		return -ENOMEM;
	return 0;
}

/* Folds the spans of one piece into pieces per the behaviour (HF NormalizedString::split). */
static int split_piece(const struct pretok_stage *st, const struct piece *pc, struct slist *sp,
		       struct plist *out)
{
	struct span *v = sp->v;
	size_t k = 0;
	bool prev_m = false; /* the unmerged neighbour's kind, as HF's folds track it */
	if (st->invert)
		for (size_t i = 0; i < sp->n; i++)
			v[i].m = !v[i].m;
	switch (st->behavior) {
	case PRETOK_ISOLATED:
		k = sp->n;
		break;
	case PRETOK_REMOVED:
		for (size_t i = 0; i < sp->n; i++)
			if (!v[i].m)
				v[k++] = v[i];
		break;
	case PRETOK_CONTIGUOUS:
		for (size_t i = 0; i < sp->n; i++) {
			bool m = v[i].m;
			if (k > 0 && m == prev_m)
				v[k - 1].b = v[i].b;
			else
				v[k++] = v[i];
			prev_m = m;
		}
		break;
	case PRETOK_MERGED_PREV:
		for (size_t i = 0; i < sp->n; i++) {
			bool m = v[i].m;
			if (k > 0 && m && !prev_m)
				v[k - 1].b = v[i].b;
			else
				v[k++] = v[i];
			prev_m = m;
		}
		break;
	case PRETOK_MERGED_NEXT:
		/* Right to left, a match joins the piece after it; the result fills v[k..n). */
		k = sp->n;
		for (size_t i = sp->n; i-- > 0;) {
			bool m = v[i].m;
			if (k < sp->n && m && !prev_m)
				v[k].a = v[i].a;
			else
				v[--k] = v[i];
			prev_m = m;
		}
		memmove(v, v + k, (sp->n - k) * sizeof *v);
		k = sp->n - k;
		break;
	}
	for (size_t i = 0; i < k; i++)
		if (piece_push(out, pc->off + v[i].a, v[i].b - v[i].a, pc->at_start && v[i].a == 0))
			return -ENOMEM;
	return 0;
}

struct buf {
	char *s;
	size_t n, cap;
};

static int buf_put(struct buf *b, const char *s, size_t n)
{
	if (grow((void **)&b->s, &b->cap, b->n + n, 1))
		return -ENOMEM;
	memcpy(b->s + b->n, s, n);
	b->n += n;
	return 0;
}

/* REPLACE or PREFIX on every piece, into a new text. */
static int rewrite(const struct pretok_stage *st, const char *base, const struct plist *in,
		   struct buf *nb, struct plist *out)
{
	size_t pl = strlen(st->pat), wl = strlen(st->with);
	for (size_t i = 0; i < in->n; i++) {
		const char *s = base + in->v[i].off;
		size_t n = in->v[i].len, start = nb->n;
		int rc = 0;
		if (st->kind == PRETOK_PREFIX) {
			bool want = (!st->first_only || in->v[i].at_start) &&
				    !(n >= wl && !memcmp(s, st->with, wl));
			if (want)
				rc = buf_put(nb, st->with, wl);
			if (rc == 0)
				rc = buf_put(nb, s, n);
		} else {
			for (size_t j = 0; j < n && rc == 0;) {
				if (j + pl <= n && !memcmp(s + j, st->pat, pl)) {
					rc = buf_put(nb, st->with, wl);
					j += pl;
				} else {
					rc = buf_put(nb, s + j, 1);
					j++;
				}
			}
		}
		if (rc || piece_push(out, start, nb->n - start, in->v[i].at_start))
			return -ENOMEM;
	}
	return 0;
}

int pretok_run(const struct pretok *p, const char *s, size_t n, bool at_start, pretok_fn fn,
	       void *arg)
{
	if (n == 0)
		return 0;
	if (p->n == 0)
		return fn(arg, s, n);
	struct plist cur = { 0 }, nxt = { 0 };
	struct slist sp = { 0 };
	struct buf own = { 0 };
	const char *base = s;
	/* One ovector pair is enough: only the whole match is read (rc 0 means "pairs truncated"). */
	pcre2_match_data *md = pcre2_match_data_create(1, NULL);
	int rc = md ? piece_push(&cur, 0, n, at_start) : -ENOMEM;
	bool valid = utf8_valid(s, n);
	for (int k = 0; k < p->n && rc == 0; k++) {
		const struct pretok_stage *st = &p->st[k];
		nxt.n = 0;
		if (st->kind == PRETOK_SPLIT) {
			for (size_t i = 0; i < cur.n && rc == 0; i++) {
				rc = find_matches(st, valid, base + cur.v[i].off, cur.v[i].len, md, &sp);
				if (rc == 0)
					rc = split_piece(st, &cur.v[i], &sp, &nxt);
			}
		} else {
			struct buf nb = { 0 };
			rc = rewrite(st, base, &cur, &nb, &nxt);
			free(own.s);
			own = nb;
			base = own.s;
			valid = valid && utf8_valid(st->with, strlen(st->with));
		}
		struct plist t = cur;
		cur = nxt;
		nxt = t;
	}
	for (size_t i = 0; i < cur.n && rc == 0; i++)
		rc = fn(arg, base + cur.v[i].off, cur.v[i].len);
	pcre2_match_data_free(md);
	free(cur.v);
	free(nxt.v);
	free(sp.v);
	free(own.s);
	return rc;
}
