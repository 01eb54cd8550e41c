/* tokenizer — lookup tables, the BPE merge loop, encode and decode. Loaders live in
 * tokenizer_load.c; the shared state is described in tokenizer_impl.h. */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer_impl.h"

/* ---- growable buffers ---- */

struct idvec {
	int *v;
	int n, cap;
};

static int idvec_push(struct idvec *a, int id)
{
	if (a->n == a->cap) {
		int cap = a->cap ? a->cap * 2 : 64;
		int *v = realloc(a->v, (size_t)cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		a->v = v;
		a->cap = cap;
	}
	a->v[a->n++] = id;
	return 0;
}

struct strbuf {
	char *s;
	size_t n, cap;
};

static int sb_put(struct strbuf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *p = realloc(b->s, cap);
		if (!p)
			return -ENOMEM;
		b->s = p;
		b->cap = cap;
	}
	memcpy(b->s + b->n, s, n);
	b->n += n;
	b->s[b->n] = '\0';
	return 0;
}

/* Writes code point cp as UTF-8 into out (at least 4 bytes); returns the length. */
static size_t utf8_put(char *out, uint32_t cp)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xE0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (char)(0xF0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* Length of the well-formed UTF-8 character at s (n > 0 bytes available), decoding it into *cp;
 * a malformed or truncated sequence counts as one byte (*cp = that byte | 0x80000000). */
static size_t utf8_next(const char *s, size_t n, uint32_t *cp)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t len;
	uint32_t c, min;
	if (u[0] < 0x80) {
		*cp = u[0];
		return 1;
	} else if ((u[0] & 0xE0) == 0xC0) {
		len = 2, c = u[0] & 0x1F, min = 0x80;
	} else if ((u[0] & 0xF0) == 0xE0) {
		len = 3, c = u[0] & 0x0F, min = 0x800;
	} else if ((u[0] & 0xF8) == 0xF0) {
		len = 4, c = u[0] & 0x07, min = 0x10000;
	} else {
		goto bad;
	}
	if (len > n)
		goto bad;
	for (size_t i = 1; i < len; i++) {
		if ((u[i] & 0xC0) != 0x80)
			goto bad;
		c = (c << 6) | (u[i] & 0x3F);
	}
	if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
		goto bad;
	*cp = c;
	return len;
bad:
	*cp = u[0] | 0x80000000u;
	return 1;
}

/* ---- hash tables ---- */

static uint32_t hash_bytes(const char *s, size_t n)
{
	uint32_t h = 2166136261u; /* FNV-1a */
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 16777619u;
	return h;
}

static uint32_t hash_u64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return (uint32_t)k;
}

static uint32_t pow2_at_least(size_t n)
{
	uint32_t c = 16;
	while (c < n)
		c *= 2;
	return c;
}

/* Ids whose text can come out of merging characters of the input. */
static bool type_in_vocab(uint8_t type)
{
	return type == TOKT_NORMAL || type == TOKT_USER || type == TOKT_BYTE;
}

int tokenizer_index_vocab(struct fkv_tokenizer *t)
{
	free(t->vocab.slot);
	uint32_t cap = pow2_at_least((size_t)t->n_vocab * 2);
	t->vocab.slot = calloc(cap, sizeof *t->vocab.slot);
	if (!t->vocab.slot)
		return -ENOMEM;
	t->vocab.mask = cap - 1;
	for (int id = 0; id < t->n_vocab; id++) {
		if (!type_in_vocab(t->type[id]))
			continue;
		const char *s = t->pool + t->off[id];
		uint32_t h = hash_bytes(s, t->len[id]) & t->vocab.mask;
		for (;; h = (h + 1) & t->vocab.mask) {
			int32_t o = t->vocab.slot[h] - 1;
			if (o < 0) {
				t->vocab.slot[h] = id + 1;
				break;
			}
			/* A duplicate text keeps its first id, as the HF and llama.cpp loaders do. */
			if (t->len[o] == t->len[id] && !memcmp(t->pool + t->off[o], s, t->len[id]))
				break;
		}
	}
	return 0;
}

int tokenizer_lookup(const struct fkv_tokenizer *t, const char *s, size_t len)
{
	if (!t->vocab.slot)
		return -1;
	uint32_t h = hash_bytes(s, len) & t->vocab.mask;
	for (;; h = (h + 1) & t->vocab.mask) {
		int32_t o = t->vocab.slot[h] - 1;
		if (o < 0)
			return -1;
		if (t->len[o] == len && !memcmp(t->pool + t->off[o], s, len))
			return o;
	}
}

static int pairmap_resize(struct tok_pairmap *m, uint32_t cap)
{
	struct tok_pairmap n = { .mask = cap - 1 };
	n.key = calloc(cap, sizeof *n.key);
	n.rank = malloc(cap * sizeof *n.rank);
	n.id = malloc(cap * sizeof *n.id);
	if (!n.key || !n.rank || !n.id) {
		free(n.key);
		free(n.rank);
		free(n.id);
		return -ENOMEM;
	}
	for (uint32_t i = 0; m->key && i <= m->mask; i++) {
		if (!m->key[i])
			continue;
		uint32_t h = hash_u64(m->key[i]) & n.mask;
		while (n.key[h])
			h = (h + 1) & n.mask;
		n.key[h] = m->key[i];
		n.rank[h] = m->rank[i];
		n.id[h] = m->id[i];
	}
	free(m->key);
	free(m->rank);
	free(m->id);
	*m = n;
	return 0;
}

static uint64_t pair_key(int left, int right)
{
	return (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
}

int tokenizer_add_merge(struct fkv_tokenizer *t, int left, int right, int merged, int n_hint)
{
	struct tok_pairmap *m = &t->merges;
	if (!m->key || (uint64_t)(t->n_merges + 1) * 2 > (uint64_t)m->mask + 1) {
		size_t want = (size_t)(t->n_merges + 1 > n_hint ? t->n_merges + 1 : n_hint) * 2;
		int rc = pairmap_resize(m, pow2_at_least(want));
		if (rc)
			return rc;
	}
	uint64_t k = pair_key(left, right);
	uint32_t h = hash_u64(k) & m->mask;
	for (; m->key[h]; h = (h + 1) & m->mask)
		if (m->key[h] == k)
			return -EEXIST;
	m->key[h] = k;
	m->rank[h] = t->n_merges++;
	m->id[h] = merged;
	return 0;
}

/* Rank and merged id of the pair, or -1. */
static int merge_find(const struct fkv_tokenizer *t, int left, int right, int *merged)
{
	const struct tok_pairmap *m = &t->merges;
	if (!m->key)
		return -1;
	uint64_t k = pair_key(left, right);
	for (uint32_t h = hash_u64(k) & m->mask; m->key[h]; h = (h + 1) & m->mask) {
		if (m->key[h] == k) {
			*merged = m->id[h];
			return m->rank[h];
		}
	}
	return -1;
}

/* ---- construction ---- */

struct fkv_tokenizer *tokenizer_alloc(int n_vocab)
{
	if (n_vocab <= 0)
		return NULL;
	struct fkv_tokenizer *t = calloc(1, sizeof *t);
	if (!t)
		return NULL;
	t->n_vocab = n_vocab;
	t->off = calloc((size_t)n_vocab, sizeof *t->off);
	t->len = calloc((size_t)n_vocab, sizeof *t->len);
	t->score = calloc((size_t)n_vocab, sizeof *t->score);
	t->type = calloc((size_t)n_vocab, sizeof *t->type);
	t->pool_cap = 4096;
	t->pool = malloc(t->pool_cap);
	if (!t->off || !t->len || !t->score || !t->type || !t->pool) {
		tokenizer_free(t);
		return NULL;
	}
	t->pool[0] = '\0'; /* offset 0 is the empty text of ids no file defines */
	t->pool_len = 1;
	t->unk = t->bos = t->eos = -1;
	for (int b = 0; b < 256; b++)
		t->byte_tok[b] = -1;
	/* GPT-2's table: printable Latin-1 bytes map to themselves, the rest to 256, 257, ... */
	int extra = 0;
	for (int i = 0; i < 512; i++)
		t->u2b[i] = -1;
	for (int b = 0; b < 256; b++) {
		bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
		t->b2u[b] = (uint16_t)(keep ? b : 256 + extra++);
		t->u2b[t->b2u[b]] = (int16_t)b;
	}
	return t;
}

int tokenizer_set_token(struct fkv_tokenizer *t, int id, const char *text, size_t len,
			float score, enum tok_type type)
{
	if (id < 0 || id >= t->n_vocab || len > UINT32_MAX / 2)
		return -EINVAL;
	if (t->pool_len + len + 1 > t->pool_cap) {
		size_t cap = t->pool_cap;
		while (cap < t->pool_len + len + 1)
			cap *= 2;
		if (cap > UINT32_MAX)
			return -ENOMEM;
		char *p = realloc(t->pool, cap);
		if (!p)
			return -ENOMEM;
		t->pool = p;
		t->pool_cap = cap;
	}
	memcpy(t->pool + t->pool_len, text, len);
	t->pool[t->pool_len + len] = '\0';
	t->off[id] = (uint32_t)t->pool_len;
	t->len[id] = (uint32_t)len;
	t->score[id] = score;
	t->type[id] = (uint8_t)type;
	t->pool_len += len + 1;
	return 0;
}

static int cmp_special(const void *a, const void *b)
{
	const struct tok_special *x = a, *y = b;
	unsigned char bx = (unsigned char)x->text[0], by = (unsigned char)y->text[0];
	if (bx != by)
		return bx < by ? -1 : 1;
	if (x->len != y->len)
		return x->len > y->len ? -1 : 1; /* longest first */
	return x->id - y->id;
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Parses "<0xNN>" into the byte, or -1. */
static int byte_token_value(const char *s, size_t n)
{
	if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
		return -1;
	int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
	return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

int tokenizer_finish(struct fkv_tokenizer *t)
{
	if (!t->vocab.slot) {
		int rc = tokenizer_index_vocab(t);
		if (rc)
			return rc;
	}
	int n_sp = 0;
	for (int id = 0; id < t->n_vocab; id++) {
		uint8_t ty = t->type[id];
		if (ty == TOKT_BYTE) {
			int b = byte_token_value(t->pool + t->off[id], t->len[id]);
			if (b >= 0 && t->byte_tok[b] < 0)
				t->byte_tok[b] = id;
		}
		if ((ty == TOKT_CONTROL || ty == TOKT_USER || ty == TOKT_UNKNOWN) && t->len[id] > 0)
			n_sp++;
	}
	free(t->sp);
	t->sp = calloc((size_t)n_sp + 1, sizeof *t->sp);
	if (!t->sp)
		return -ENOMEM;
	t->n_sp = 0;
	for (int id = 0; id < t->n_vocab; id++) {
		uint8_t ty = t->type[id];
		if ((ty == TOKT_CONTROL || ty == TOKT_USER || ty == TOKT_UNKNOWN) && t->len[id] > 0)
			t->sp[t->n_sp++] = (struct tok_special){ id, t->len[id], t->pool + t->off[id] };
	}
	qsort(t->sp, (size_t)t->n_sp, sizeof *t->sp, cmp_special);
	int k = 0;
	for (int b = 0; b <= 256; b++) {
		while (k < t->n_sp && (unsigned char)t->sp[k].text[0] < b)
			k++;
		t->sp_start[b] = k;
	}
	return 0;
}

void tokenizer_free(struct fkv_tokenizer *t)
{
	if (!t)
		return;
	free(t->pool);
	free(t->off);
	free(t->len);
	free(t->score);
	free(t->type);
	free(t->vocab.slot);
	free(t->merges.key);
	free(t->merges.rank);
	free(t->merges.id);
	free(t->sp);
	pretok_free(&t->pre);
	free(t);
}

/* ---- BPE ---- */

/* A symbol is a span of the word; merged symbols grow to the right and the right one dies. */
struct bpe_sym {
	int prev, next;
	uint32_t off, len; /* len 0: merged away */
	int id;		   /* -1: no token (score mode: resolved by byte fallback at the end) */
};

/* A candidate merge of adjacent symbols left/right, valid while both keep these lengths. */
struct bpe_pair {
	double pri; /* higher merges first: the score, or minus the rank */
	int left, right;
	uint32_t llen, rlen;
	int merged;
};

struct bpe_heap {
	struct bpe_pair *a;
	int n;
};

/* Best first; among equals the leftmost, as SentencePiece and HF tokenizers both do. */
static bool pair_before(const struct bpe_pair *x, const struct bpe_pair *y)
{
	return x->pri > y->pri || (x->pri == y->pri && x->left < y->left);
}

static void heap_push(struct bpe_heap *h, struct bpe_pair p)
{
	int i = h->n++;
	while (i > 0) {
		int up = (i - 1) / 2;
		if (!pair_before(&p, &h->a[up]))
			break;
		h->a[i] = h->a[up];
		i = up;
	}
	h->a[i] = p;
}

static struct bpe_pair heap_pop(struct bpe_heap *h)
{
	struct bpe_pair top = h->a[0], last = h->a[--h->n];
	int i = 0;
	for (;;) {
		int c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && pair_before(&h->a[c + 1], &h->a[c]))
			c++;
		if (!pair_before(&h->a[c], &last))
			break;
		h->a[i] = h->a[c];
		i = c;
	}
	if (h->n > 0)
		h->a[i] = last;
	return top;
}

static void bpe_try_pair(const struct fkv_tokenizer *t, const char *s, const struct bpe_sym *sym,
			 int l, int r, struct bpe_heap *h)
{
	if (l < 0 || r < 0)
		return;
	struct bpe_pair p = { .left = l, .right = r, .llen = sym[l].len, .rlen = sym[r].len };
	if (t->merge == TOK_MERGE_SCORE) {
		p.merged = tokenizer_lookup(t, s + sym[l].off, sym[l].len + sym[r].len);
		if (p.merged < 0 || t->type[p.merged] == TOKT_BYTE)
			return;
		p.pri = t->score[p.merged];
	} else {
		if (sym[l].id < 0 || sym[r].id < 0)
			return;
		int rank = merge_find(t, sym[l].id, sym[r].id, &p.merged);
		if (rank < 0)
			return;
		p.pri = -(double)rank;
	}
	heap_push(h, p);
}

/* Appends the byte-fallback ids of s[0..n) (or the unknown token) to out. */
static int emit_unknown(const struct fkv_tokenizer *t, const char *s, size_t n, struct idvec *out)
{
	bool bytes = t->byte_fallback;
	for (size_t i = 0; bytes && i < n; i++)
		bytes = t->byte_tok[(unsigned char)s[i]] >= 0;
	if (bytes) {
		for (size_t i = 0; i < n; i++)
			if (idvec_push(out, t->byte_tok[(unsigned char)s[i]]))
				return -ENOMEM;
		return 0;
	}
	if (t->unk < 0)
		return -EILSEQ;
	return idvec_push(out, t->unk);
}

/* BPE over one word s[0..n): characters, then best pair first until no pair merges. */
static int bpe_word(const struct fkv_tokenizer *t, const char *s, size_t n, struct idvec *out)
{
	if (n == 0)
		return 0;
	struct bpe_sym *sym = malloc(n * sizeof *sym);
	struct bpe_heap h = { .a = malloc(3 * n * sizeof *h.a) }; /* n-1 pairs + 2 per merge */
	int rc = -ENOMEM, ns = 0;
	if (!sym || !h.a)
		goto out;
	for (size_t pos = 0; pos < n;) {
		uint32_t cp;
		size_t cl = utf8_next(s + pos, n - pos, &cp);
		int id = tokenizer_lookup(t, s + pos, cl);
		if (id < 0 && t->merge == TOK_MERGE_RANK) {
			/* HF resolves unknown characters up front: bytes, else one fused unknown. */
			bool bytes = t->byte_fallback;
			for (size_t i = 0; bytes && i < cl; i++)
				bytes = t->byte_tok[(unsigned char)s[pos + i]] >= 0;
			if (bytes) {
				for (size_t i = 0; i < cl; i++)
					sym[ns++] = (struct bpe_sym){ .off = (uint32_t)(pos + i), .len = 1,
						.id = t->byte_tok[(unsigned char)s[pos + i]] };
				pos += cl;
				continue;
			}
			if (t->unk < 0) {
				rc = -EILSEQ;
				goto out;
			}
			if (ns > 0 && sym[ns - 1].id == t->unk &&
			    tokenizer_lookup(t, s + sym[ns - 1].off, sym[ns - 1].len) < 0) {
				sym[ns - 1].len += (uint32_t)cl;
				pos += cl;
				continue;
			}
			id = t->unk;
		}
		sym[ns++] = (struct bpe_sym){ .off = (uint32_t)pos, .len = (uint32_t)cl, .id = id };
		pos += cl;
	}
	for (int i = 0; i < ns; i++) {
		sym[i].prev = i - 1;
		sym[i].next = i + 1 < ns ? i + 1 : -1;
	}
	for (int i = 0; i + 1 < ns; i++)
		bpe_try_pair(t, s, sym, i, i + 1, &h);
	while (h.n > 0) {
		struct bpe_pair p = heap_pop(&h);
		struct bpe_sym *l = &sym[p.left], *r = &sym[p.right];
		if (l->len != p.llen || r->len != p.rlen || l->next != p.right)
			continue; /* stale: one side merged since */
		l->len += r->len;
		l->id = p.merged;
		l->next = r->next;
		if (r->next >= 0)
			sym[r->next].prev = p.left;
		r->len = 0;
		bpe_try_pair(t, s, sym, l->prev, p.left, &h);
		bpe_try_pair(t, s, sym, p.left, l->next, &h);
		assert(h.n <= 3 * (int)n);
	}
	rc = 0;
	for (int i = 0; i >= 0 && i < ns && rc == 0; i = sym[i].next) {
		if (sym[i].id >= 0)
			rc = idvec_push(out, sym[i].id);
		else
			rc = emit_unknown(t, s + sym[i].off, sym[i].len, out);
	}
out:
	free(sym);
	free(h.a);
	return rc;
}

/* ---- encode ---- */

/* One pre-token: byte-level pieces are first spelled in GPT-2 table code points. */
static int encode_word(const struct fkv_tokenizer *t, const char *s, size_t n, struct idvec *out)
{
	if (!t->byte_level) {
		if (t->ignore_merges) {
			int id = tokenizer_lookup(t, s, n);
			if (id >= 0)
				return idvec_push(out, id);
		}
		return bpe_word(t, s, n, out);
	}
	char *m = malloc(2 * n + 1); /* table code points are below 0x800: 2 bytes each */
	if (!m)
		return -ENOMEM;
	size_t mn = 0;
	m[0] = '\0';
	for (size_t i = 0; i < n; i++)
		mn += utf8_put(m + mn, t->b2u[(unsigned char)s[i]]);
	int rc, id = t->ignore_merges ? tokenizer_lookup(t, m, mn) : -1;
	rc = id >= 0 ? idvec_push(out, id) : bpe_word(t, m, mn, out);
	free(m);
	return rc;
}

struct word_ctx {
	const struct fkv_tokenizer *t;
	struct idvec *out;
};

static int word_cb(void *arg, const char *s, size_t n)
{
	struct word_ctx *c = arg;
	return encode_word(c->t, s, n, c->out);
}

/* Replaces b's text by its NFC form. -EILSEQ when it is not valid UTF-8 (utf8proc refuses it:
 * composition is only defined on code points), -ENOMEM. */
static int nfc(struct strbuf *b)
{
	if (b->n == 0)
		return 0;
	utf8proc_uint8_t *out = NULL;
	utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)b->s, (utf8proc_ssize_t)b->n, &out,
					  UTF8PROC_STABLE | UTF8PROC_COMPOSE);
	if (n < 0)
		return n == UTF8PROC_ERROR_NOMEM ? -ENOMEM : n == UTF8PROC_ERROR_OVERFLOW ? -E2BIG : -EILSEQ;
	free(b->s); /* out is malloc'ed and NUL-terminated: the buffer is taken over as is */
	*b = (struct strbuf){ .s = (char *)out, .n = (size_t)n, .cap = (size_t)n + 1 };
	return 0;
}

/* Applies the normalizer steps to one segment. */
static int normalize(const struct fkv_tokenizer *t, const char *s, size_t n, struct strbuf *b)
{
	int rc = sb_put(b, s, n);
	for (int k = 0; k < t->n_norm && rc == 0; k++) {
		const struct tok_norm *st = &t->norm[k];
		size_t wl = strlen(st->with), pl = strlen(st->pat);
		if (st->nfc) {
			rc = nfc(b);
		} else if (st->prepend) {
			if (b->n == 0)
				continue;
			struct strbuf nb = { 0 };
			rc = sb_put(&nb, st->with, wl);
			if (rc == 0)
				rc = sb_put(&nb, b->s, b->n);
			free(b->s);
			*b = nb;
		} else if (pl > 0) {
			struct strbuf nb = { 0 };
			for (size_t i = 0; i < b->n && rc == 0;) {
				if (i + pl <= b->n && !memcmp(b->s + i, st->pat, pl)) {
					rc = sb_put(&nb, st->with, wl);
					i += pl;
				} else {
					rc = sb_put(&nb, b->s + i, 1);
					i++;
				}
			}
			if (rc == 0 && nb.n == 0)
				rc = sb_put(&nb, "", 0);
			free(b->s);
			*b = nb;
		}
	}
	return rc;
}

/* One run of text between special tokens (at_start: it begins the text). */
static int encode_segment(const struct fkv_tokenizer *t, const char *s, size_t n, bool at_start,
			  struct idvec *out)
{
	struct strbuf b = { 0 };
	struct word_ctx c = { t, out };
	int rc = normalize(t, s, n, &b);
	if (rc == 0 && b.n > 0)
		rc = pretok_run(&t->pre, b.s, b.n, at_start, word_cb, &c);
	free(b.s);
	return rc;
}

int tokenizer_encode(const struct fkv_tokenizer *t, const char *text, bool add_bos, int **ids)
{
	*ids = NULL;
	if (!t || !text)
		return -EINVAL;
	struct idvec out = { 0 };
	int rc = 0;
	size_t n = strlen(text), seg = 0;
	if (n > (1u << 30)) /* symbol offsets are 32-bit; a prompt is far smaller */
		return -E2BIG;
	if (add_bos && t->add_bos && t->bos >= 0)
		rc = idvec_push(&out, t->bos);
	for (size_t i = 0; i < n && rc == 0;) {
		unsigned char c = (unsigned char)text[i];
		const struct tok_special *hit = NULL;
		for (int k = t->sp_start[c]; k < t->sp_start[c + 1]; k++) {
			if (t->sp[k].len <= n - i && !memcmp(text + i, t->sp[k].text, t->sp[k].len)) {
				hit = &t->sp[k];
				break;
			}
		}
		if (!hit) {
			i++;
			continue;
		}
		if (i > seg)
			rc = encode_segment(t, text + seg, i - seg, seg == 0, &out);
		if (rc == 0)
			rc = idvec_push(&out, hit->id);
		i += hit->len;
		seg = i;
	}
	if (rc == 0 && seg < n)
		rc = encode_segment(t, text + seg, n - seg, seg == 0, &out);
	if (rc == 0 && !out.v)
		out.v = malloc(sizeof *out.v);
	if (rc == 0 && !out.v)
		rc = -ENOMEM;
	if (rc < 0) {
		free(out.v);
		return rc;
	}
	*ids = out.v;
	return out.n;
}

/* ---- decode ---- */

/* Appends the bytes token id stands for (no stripping) to b. */
static int append_piece(const struct fkv_tokenizer *t, int id, struct strbuf *b)
{
	const char *s = t->pool + t->off[id];
	size_t n = t->len[id];
	switch (t->type[id]) {
	case TOKT_NONE:
	case TOKT_CONTROL:
	case TOKT_UNUSED:
		return 0;
	case TOKT_UNKNOWN:
		return sb_put(b, "\xEF\xBF\xBD", 3);
	case TOKT_USER:
		return sb_put(b, s, n);
	case TOKT_BYTE:
		if (t->dec_byte_fallback) {
			int v = byte_token_value(s, n);
			if (v >= 0) {
				char c = (char)v;
				return sb_put(b, &c, 1);
			}
		}
		break;
	default:
		break;
	}
	int rc = 0;
	if (t->dec_bytes) {
		for (size_t i = 0; i < n && rc == 0;) {
			uint32_t cp;
			size_t cl = utf8_next(s + i, n - i, &cp);
			if (cp < 512 && t->u2b[cp] >= 0) {
				char c = (char)t->u2b[cp];
				rc = sb_put(b, &c, 1);
			} else {
				rc = sb_put(b, s + i, cl);
			}
			i += cl;
		}
		return rc;
	}
	size_t pl = strlen(t->dec_pat), wl = strlen(t->dec_with);
	for (size_t i = 0; i < n && rc == 0;) {
		if (pl > 0 && i + pl <= n && !memcmp(s + i, t->dec_pat, pl)) {
			rc = sb_put(b, t->dec_with, wl);
			i += pl;
		} else {
			rc = sb_put(b, s + i, 1);
			i++;
		}
	}
	return rc;
}

int tokenizer_decode(const struct fkv_tokenizer *t, const int *ids, int n, char **text)
{
	*text = NULL;
	if (!t || n < 0 || (n > 0 && !ids))
		return -EINVAL;
	struct strbuf b = { 0 };
	int rc = sb_put(&b, "", 0);
	for (int i = 0; i < n && rc == 0; i++)
		rc = ids[i] < 0 || ids[i] >= t->n_vocab ? -EINVAL : append_piece(t, ids[i], &b);
	if (rc < 0) {
		free(b.s);
		return rc;
	}
	size_t skip = 0;
	while ((int)skip < t->dec_strip && skip < b.n && b.s[skip] == ' ')
		skip++;
	memmove(b.s, b.s + skip, b.n - skip + 1);
	*text = b.s;
	return (int)(b.n - skip);
}

int tokenizer_piece(const struct fkv_tokenizer *t, int id, char *buf, size_t len)
{
	if (!t || id < 0 || id >= t->n_vocab)
		return -EINVAL;
	struct strbuf b = { 0 };
	int rc = append_piece(t, id, &b);
	if (rc < 0) {
		free(b.s);
		return rc;
	}
	if (b.n > 0)
		memcpy(buf, b.s, b.n < len ? b.n : len);
	free(b.s);
	return (int)b.n;
}

int tokenizer_bos(const struct fkv_tokenizer *t)
{
	return t->bos;
}

int tokenizer_eos(const struct fkv_tokenizer *t)
{
	return t->eos;
}

bool tokenizer_adds_bos(const struct fkv_tokenizer *t)
{
	return t->add_bos && t->bos >= 0;
}

int tokenizer_vocab_size(const struct fkv_tokenizer *t)
{
	return t->n_vocab;
}

bool tokenizer_is_special(const struct fkv_tokenizer *t, int id)
{
	return id >= 0 && id < t->n_vocab && t->type[id] == TOKT_CONTROL;
}
