/* specache_fetch — see specache_fetch.h. One worker thread; jobs are layers, queued in FIFO
 * order, each with a done flag the compute thread waits on. */
#include "specache_fetch.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "hostkv.h"
#include "log.h"

/* Pages pinned per hostkv_pin_many call: one RECALL ring entry's worth for those not leased. */
#define SFETCH_PIN_BATCH 32

struct sfetch_layer {
	struct sfetch_row *rows; /* (n_kv * k) */
	int n;
	char *stage;		 /* (2, n_kv, k, d) KV dtype */
	/* Under mu: */
	bool pending;		 /* submitted, not yet waited for */
	bool done;
	int err;
	int64_t t_start, t_end;	 /* when the thread ran the job (ns) */
};

struct sfetch {
	struct sfetch_opts o;
	size_t row_bytes;	 /* one K (or V) row: d elements of the KV dtype */
	struct sfetch_layer *L;
	int *queue;		 /* (n_layers) ring of layers */
	int q_head, q_len;
	pthread_mutex_t mu;
	pthread_cond_t work, done;
	bool stop, started;
	pthread_t th;
	int pages[SFETCH_PIN_BATCH]; /* the thread's pin batch */
	const void *blocks[SFETCH_PIN_BATCH];
};

static int by_pos(const void *a, const void *b)
{
	const struct sfetch_row *x = a, *y = b;
	return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Copies the job's rows, page by page, pinning up to SFETCH_PIN_BATCH pages at a time. The
 * block layout is HND (docs/design.md §3): head h's K row t at (2h·p + t)·d elements, its V row
 * at ((2h + 1)·p + t)·d. */
static int run_job(struct sfetch *f, int layer, struct sfetch_layer *L)
{
	const struct kv_geom *g = &f->o.g;
	const size_t rb = f->row_bytes, half = (size_t)g->n_kv * f->o.k * rb;
	char err[256];
	qsort(L->rows, (size_t)L->n, sizeof *L->rows, by_pos);
	for (int i = 0; i < L->n;) {
		int np = 0, j = i;
		/* The rows of the next pages, up to a batch. */
		while (j < L->n) {
			int page = (int)(L->rows[j].pos / g->p);
			if (!np || f->pages[np - 1] != page) {
				if (np == SFETCH_PIN_BATCH)
					break;
				f->pages[np++] = page;
			}
			j++;
		}
		int ret = hostkv_pin_many(f->o.host, layer, f->pages, np, f->blocks, err, sizeof err);
		if (ret) {
			log_error("host KV copy: %s", err);
			return ret;
		}
		for (int b = 0; i < j; i++) {
			const struct sfetch_row *r = &L->rows[i];
			while (f->pages[b] != (int)(r->pos / g->p))
				b++;
			const int t = (int)(r->pos % g->p);
			const char *blk = f->blocks[b];
			char *dst = L->stage + ((size_t)r->head * f->o.k + r->slot) * rb;
			memcpy(dst, blk + ((size_t)(2 * r->head) * g->p + t) * rb, rb);
			memcpy(dst + half, blk + ((size_t)(2 * r->head + 1) * g->p + t) * rb, rb);
		}
		ret = hostkv_unpin_many(f->o.host, layer, f->pages, np, err, sizeof err);
		if (ret) {
			log_error("host KV copy: %s", err);
			return ret;
		}
	}
	return 0;
}

static void *fetch_thread(void *arg)
{
	struct sfetch *f = arg;
	pthread_mutex_lock(&f->mu);
	for (;;) {
		while (!f->q_len && !f->stop)
			pthread_cond_wait(&f->work, &f->mu);
		if (!f->q_len)
			break;
		int layer = f->queue[f->q_head];
		f->q_head = (f->q_head + 1) % f->o.n_layers;
		f->q_len--;
		struct sfetch_layer *L = &f->L[layer];
		pthread_mutex_unlock(&f->mu);
		const int64_t t0 = (int64_t)clock_ns();
		int ret = run_job(f, layer, L);
		const int64_t t1 = (int64_t)clock_ns();
		pthread_mutex_lock(&f->mu);
		L->err = ret;
		L->t_start = t0;
		L->t_end = t1;
		L->done = true;
		pthread_cond_broadcast(&f->done);
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

void sfetch_free(struct sfetch *f)
{
	if (!f)
		return;
	if (f->started) {
		pthread_mutex_lock(&f->mu);
		f->stop = true;
		pthread_cond_signal(&f->work);
		pthread_mutex_unlock(&f->mu);
		pthread_join(f->th, NULL);
	}
	for (int l = 0; f->L && l < f->o.n_layers; l++) {
		free(f->L[l].rows);
		free(f->L[l].stage);
	}
	free(f->L);
	free(f->queue);
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->work);
	pthread_cond_destroy(&f->done);
	free(f);
}

int sfetch_new(const struct sfetch_opts *o, struct sfetch **out)
{
	if (!o->host || o->n_layers <= 0 || o->k <= 0 || o->g.n_kv <= 0 || o->g.d <= 0 ||
	    o->g.p <= 0)
		return -EINVAL;
	struct sfetch *f = calloc(1, sizeof *f);
	if (!f)
		return -ENOMEM;
	f->o = *o;
	f->row_bytes = (size_t)o->g.d * dtype_size(o->g.dtype);
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->work, NULL);
	pthread_cond_init(&f->done, NULL);
	f->L = calloc((size_t)o->n_layers, sizeof *f->L);
	f->queue = calloc((size_t)o->n_layers, sizeof *f->queue);
	int ret = f->L && f->queue ? 0 : -ENOMEM;
	const size_t slots = (size_t)o->g.n_kv * o->k;
	for (int l = 0; l < o->n_layers && !ret; l++) {
		f->L[l].rows = calloc(slots, sizeof *f->L[l].rows);
		f->L[l].stage = calloc(2 * slots, f->row_bytes);
		if (!f->L[l].rows || !f->L[l].stage)
			ret = -ENOMEM;
	}
	if (!ret && (ret = -pthread_create(&f->th, NULL, fetch_thread, f)) == 0)
		f->started = true;
	if (ret) {
		sfetch_free(f);
		return ret;
	}
	*out = f;
	return 0;
}

struct sfetch_row *sfetch_rows(struct sfetch *f, int layer)
{
	return f->L[layer].rows;
}

void *sfetch_stage(struct sfetch *f, int layer)
{
	return f->L[layer].stage;
}

int sfetch_submit(struct sfetch *f, int layer, int n)
{
	if (layer < 0 || layer >= f->o.n_layers || n < 0 || n > f->o.g.n_kv * f->o.k)
		return -EINVAL;
	struct sfetch_layer *L = &f->L[layer];
	pthread_mutex_lock(&f->mu);
	int ret = L->pending ? -EBUSY : 0;
	if (!ret && n) {
		L->n = n;
		L->pending = true;
		L->done = false;
		L->err = 0;
		f->queue[(f->q_head + f->q_len) % f->o.n_layers] = layer;
		f->q_len++;
		pthread_cond_signal(&f->work);
	}
	pthread_mutex_unlock(&f->mu);
	return ret;
}

int sfetch_wait(struct sfetch *f, int layer, struct sfetch_done *done)
{
	struct sfetch_layer *L = &f->L[layer];
	struct sfetch_done dn = { 0 };
	int ret = 0;
	pthread_mutex_lock(&f->mu);
	if (L->pending) {
		const int64_t t0 = (int64_t)clock_ns();
		while (!L->done)
			pthread_cond_wait(&f->done, &f->mu);
		dn.ns_waited = (int64_t)clock_ns() - t0;
		/* The caller blocked from t0 on: the job's time before that ran beside it. */
		const int64_t from = t0 > L->t_start ? t0 : L->t_start;
		dn.ns_hidden = L->t_end - L->t_start - (L->t_end > from ? L->t_end - from : 0);
		dn.rows = L->err ? 0 : L->n;
		dn.bytes = dn.rows * 2 * (int64_t)f->row_bytes;
		ret = L->err;
		L->pending = false;
	}
	pthread_mutex_unlock(&f->mu);
	if (done)
		*done = dn;
	return ret;
}
