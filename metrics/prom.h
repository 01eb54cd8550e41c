/* prom — the Prometheus text exposition format (version 0.0.4), written by one module for
 * kvstored, `kvworker serve` and kvgate (docs/design.md §6: `freekv_` prefix, base units,
 * `_total` counters, histograms for latencies).
 *
 * A scrape builds the whole page in a struct prom_buf: prom_family() writes a family's # HELP
 * and # TYPE lines, prom_sample() one sample line; prom_hist_write() a histogram series
 * (cumulative `_bucket{le=...}` lines ending in le="+Inf", then `_sum` and `_count`). Label sets
 * are passed as `prom_label` arrays; values are escaped here (backslash, double quote, newline),
 * so callers may pass any bytes a worker endpoint or a command name holds.
 *
 * struct prom_hist is a fixed-bucket histogram that any thread may observe into and any thread
 * may render (its own mutex). struct prom_counter is a relaxed atomic counter for hot paths.
 *
 * Ownership: prom_buf_init/prom_buf_free own the page; the caller owns histograms and counters
 * (prom_hist_init copies the bucket bounds, prom_hist_free releases them). A prom_buf that ran
 * out of memory keeps err = -ENOMEM and ignores further writes. */
#ifndef FREEKV_PROM_H
#define FREEKV_PROM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct prom_buf {
	char *p;
	size_t len, cap;
	int err;		/* 0, or -ENOMEM once a write failed */
};

struct prom_label {
	const char *name, *value;
};

void prom_buf_init(struct prom_buf *b);
void prom_buf_free(struct prom_buf *b);
/* Appends printf-formatted text (no escaping). */
void prom_printf(struct prom_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* # HELP and # TYPE lines; type is "counter", "gauge" or "histogram". */
void prom_family(struct prom_buf *b, const char *name, const char *type, const char *help);
/* One sample: name{labels} value. n_labels may be 0 (labels NULL). */
void prom_sample(struct prom_buf *b, const char *name, const struct prom_label *labels,
		 int n_labels, double v);
/* A family with a single unlabelled sample. */
void prom_one(struct prom_buf *b, const char *name, const char *type, const char *help, double v);

struct prom_hist {
	pthread_mutex_t mu;
	double *bounds;		/* (n,) ascending upper bounds, +Inf implied */
	uint64_t *counts;	/* (n + 1,) per bucket, not cumulative */
	int n;
	double sum;
	uint64_t count;
};

/* Latency buckets in seconds, 100 µs .. 60 s, shared so the three processes agree. */
extern const double prom_latency_buckets[];
extern const int prom_n_latency_buckets;

/* 0, -EINVAL (bounds not strictly ascending, n < 1) or -ENOMEM. */
int prom_hist_init(struct prom_hist *h, const double *bounds, int n);
void prom_hist_free(struct prom_hist *h);
void prom_hist_observe(struct prom_hist *h, double v);
/* One series of the histogram family `name` (the family line is the caller's). */
void prom_hist_write(struct prom_buf *b, const char *name, const struct prom_label *labels,
		     int n_labels, struct prom_hist *h);

struct prom_counter {
	_Atomic uint64_t v;
};

static inline void prom_inc(struct prom_counter *c, uint64_t by)
{
	atomic_fetch_add_explicit(&c->v, by, memory_order_relaxed);
}

static inline uint64_t prom_get(const struct prom_counter *c)
{
	return atomic_load_explicit(&c->v, memory_order_relaxed);
}

#endif
