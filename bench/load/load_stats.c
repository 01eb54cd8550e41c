/* load_stats — histograms, counters and the page content function of kvload. See load.h. */
#include "load.h"

#include <string.h>

#include "clock.h"
#include "crc32c.h"

double load_now_s(void)
{
	return (double)clock_ns() * 1e-9;
}

size_t load_block_bytes(const struct load_cfg *c)
{
	return (size_t)c->geo.n_kv_heads * 2 * c->geo.page_size * c->geo.head_dim *
	       (c->geo.dtype == 1 ? 4 : 2);
}

/* xorshift64* seeded from the block's identity: any process can recompute a block's bytes. */
static uint64_t fill_seed(const char *seq, uint32_t layer, uint32_t page)
{
	uint64_t s = crc32c(0, seq, strlen(seq)) * 0x9e3779b97f4a7c15ull ^
		     ((uint64_t)layer << 32 | page) ^ 0x5bd1e995u;
	return s ? s : 1;
}

static uint64_t fill_next(uint64_t *s)
{
	*s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

void load_fill(uint8_t *p, size_t n, const char *seq, uint32_t layer, uint32_t page)
{
	uint64_t s = fill_seed(seq, layer, page);
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = fill_next(&s);
		memcpy(p + i, &v, n - i < 8 ? n - i : 8);
	}
}

/* The same stream, compared as it is made: no buffer, any block size. */
bool load_check(const uint8_t *p, size_t n, const char *seq, uint32_t layer, uint32_t page)
{
	uint64_t s = fill_seed(seq, layer, page);
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = fill_next(&s);
		if (memcmp(p + i, &v, n - i < 8 ? n - i : 8) != 0)
			return false;
	}
	return true;
}

/* Values below LH_SUB have a bucket each; above, [2^e, 2^(e+1)) splits into LH_SUB buckets
 * of 2^(e - LH_BITS) values, numbered on from (e - LH_BITS + 1) * LH_SUB. */
unsigned hist_bucket(uint64_t v)
{
	if (v < LH_SUB)
		return (unsigned)v;
	unsigned e = 63 - (unsigned)__builtin_clzll(v); /* v in [2^e, 2^(e+1)) */
	unsigned sub = (unsigned)((v >> (e - LH_BITS)) & (LH_SUB - 1));
	unsigned b = (e - LH_BITS + 1) * LH_SUB + sub;
	return b < LH_N ? b : LH_N - 1;
}

uint64_t hist_bucket_top(unsigned b)
{
	if (b < LH_SUB)
		return b;
	unsigned e = b / LH_SUB + LH_BITS - 1, sub = b % LH_SUB;
	return ((uint64_t)(LH_SUB + sub + 1) << (e - LH_BITS)) - 1;
}

void hist_add(struct hist *h, uint64_t ns)
{
	h->b[hist_bucket(ns)]++;
	h->n++;
}

void hist_merge(struct hist *into, const struct hist *h)
{
	for (unsigned i = 0; i < LH_N; i++)
		into->b[i] += h->b[i];
	into->n += h->n;
}

uint64_t hist_pct(const struct hist *h, double q)
{
	if (!h->n)
		return 0;
	uint64_t want = (uint64_t)(q * (double)h->n), seen = 0;
	if (want >= h->n)
		want = h->n - 1;
	for (unsigned i = 0; i < LH_N; i++) {
		seen += h->b[i];
		if (seen > want)
			return hist_bucket_top(i);
	}
	return hist_bucket_top(LH_N - 1);
}

void stats_merge(struct load_stats *into, const struct load_stats *s)
{
	for (int i = 0; i < OP_N; i++) {
		hist_merge(&into->h[i], &s->h[i]);
		into->ops[i] += s->ops[i];
	}
	for (int i = 0; i < PART_N; i++) {
		hist_merge(&into->part[i], &s->part[i]);
		into->slow_ns[i] += s->slow_ns[i];
	}
	into->slow_n += s->slow_n;
	into->bytes_written += s->bytes_written;
	into->bytes_read += s->bytes_read;
	into->pages_verified += s->pages_verified;
	into->mismatches += s->mismatches;
	into->lost += s->lost;
	into->errors += s->errors;
	into->recoveries += s->recoveries;
	into->forged += s->forged;
	into->forged_accepted += s->forged_accepted;
	into->sequences_churned += s->sequences_churned;
	if (!into->first_error && s->first_error) {
		into->first_error = s->first_error;
		memcpy(into->first_error_msg, s->first_error_msg, sizeof into->first_error_msg);
	}
}

void stats_add_ring_parts(struct load_stats *s, const struct kvs *k)
{
	struct kvs_ring_timing t;
	kvs_ring_last_timing(k, &t);
	uint64_t part[PART_N] = { t.queued_ns, t.served_ns, t.woken_ns };
	bool slow = t.round_trip_ns >= LOAD_SLOW_NS;
	for (int i = 0; i < PART_N; i++) {
		hist_add(&s->part[i], part[i]);
		if (slow)
			s->slow_ns[i] += part[i];
	}
	s->slow_n += slow;
}

const char *load_op_name(enum load_op op)
{
	static const char *const names[OP_N] = { "ALLOC", "COMMIT", "RECALL", "RELEASE", "RPC" };
	return op < OP_N ? names[op] : "?";
}

bool load_all_filled(const struct load_cfg *c)
{
	for (unsigned i = 0; i < c->workers; i++)
		if (!c->filled[i])
			return false;
	return true;
}
