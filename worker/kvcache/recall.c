/* recall — see recall.h. One mutex and one condition variable guard the job ring and the two
 * staging buffers; the threads hold the mutex only to hand work over, never while copying. The
 * copy thread pins the blocks of a staging buffer's worth of units together (hostkv_pin_many
 * per layer: the ones not leased under a lease budget come back in one run of the ring), then
 * either copies the units into the buffer and unpins them (staged), or (direct: the backend's
 * recall_direct, docs/design.md "The GPU decode step") only notes where each unit lies: the
 * convert thread has the backend read them there (DMA from the registered pool on CUDA) and
 * unpins them once the op returns. */
#include "recall.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "hostkv.h"

struct recall_job {
	uint64_t ticket;
	struct recall_unit *units;
	int n;
	recall_prepare_fn prepare;
	void *arg;
	void *fence;	/* backend fence the job's recall ops mark (NULL: ordered at once) */
	int err;
	bool in_use; /* submitted and not yet waited for */
	bool done;
	int64_t t_start, t_done; /* first copy begins, last conversion ends (monotonic ns) */
	struct recall_done acc;
};

/* The copy thread's pins of one staging buffer's units, (cap) each. */
struct recall_pins {
	const void **src;	/* the block of each unit */
	int *ord;		/* unit indices grouped by layer */
	int *pages;		/* their pages, in ord's order */
	const void **blocks;	/* their pinned blocks, in ord's order */
	bool *taken;
};

/* A staging buffer: up to cap units of the block dtype and where each one goes. */
struct staging {
	void *buf;		 /* (cap, 2, p, d) block dtype (staged) */
	const void **at;	 /* (cap) where each unit lies, pinned (direct) */
	struct recall_pins pin;	 /* the pins of its units: until copied, or until converted */
	struct recall_unit *dst; /* (cap) */
	void **slots;		 /* (cap) dst[i].slot, for backend recall_units */
	int *heads;		 /* (cap) dst[i].head */
	int n;
	bool full;		 /* written by the copy thread, not yet converted */
	bool last;		 /* converting it completes its job */
	struct recall_job *job;
};

/* Urgent jobs (recall_submit_urgent) in a ring of their own; their tickets carry this bit. */
#define RECALL_URGENT_JOBS 4
#define RECALL_URGENT_BIT ((uint64_t)1 << 62)

struct recall {
	struct recall_opts o;
	size_t unit_bytes;
	int cap;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct recall_job *jobs; /* (n_jobs) ring indexed by ticket % n_jobs */
	int n_jobs;
	uint64_t submitted;	/* last ticket handed out */
	uint64_t copied;	/* last ticket the copy thread took */
	struct recall_job ujobs[RECALL_URGENT_JOBS]; /* ring indexed by urgent seq % its size */
	uint64_t usubmitted, ucopied; /* the same counters for urgent jobs (seq, no bit) */
	struct staging st[2];
	int n_buf;		/* staging buffers in use: 2, or 1 (single_buffer) */
	bool direct;		/* units read where they lie (recall_direct), no host copy */
	bool mapped;		/* ... by the device itself (recall_mapped) */
	bool stop;
	bool copy_exited; /* the copy thread will fill no more buffers */
	bool threads_up;
	pthread_t copy_thr, conv_thr;
};

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Drops the pins pin_units took for the first m entries of pn->ord (units u). */
static int unpin_units(struct recall *r, const struct recall_pins *pn, const struct recall_unit *u,
		       int m)
{
	char err[256];
	int ret = 0;
	for (int c = 0; r->o.host && c < m;) {
		const int l = u[pn->ord[c]].layer;
		int e = c;
		while (e < m && u[pn->ord[e]].layer == l)
			e++;
		int r2 = hostkv_unpin_many(r->o.host, l, pn->pages + c, e - c, err, sizeof err);
		ret = ret ? ret : r2;
		c = e;
	}
	return ret;
}

/* The blocks of units u[0..m) of one staging buffer into pin.src: with a host copy, pinned by
 * one hostkv_pin_many per layer (pin.ord groups the units by layer, in order of first
 * appearance; pin.pages are their pages in that order), all or none; else *got units from the
 * source callback, up to the first that fails. */
static int pin_units(struct recall *r, struct recall_pins *pn, const struct recall_unit *u, int m,
		     int *got)
{
	*got = 0;
	if (!r->o.host) {
		int ret = 0;
		while (*got < m && !(ret = r->o.src(r->o.src_arg, u[*got].layer, u[*got].page,
						    &pn->src[*got])))
			++*got;
		return ret;
	}
	int c = 0;
	memset(pn->taken, 0, (size_t)m * sizeof *pn->taken);
	for (int j = 0; j < m; j++) {
		if (pn->taken[j])
			continue;
		for (int k = j; k < m; k++)
			if (!pn->taken[k] && u[k].layer == u[j].layer) {
				pn->taken[k] = true;
				pn->ord[c] = k;
				pn->pages[c++] = u[k].page;
			}
	}
	char err[256];
	for (c = 0; c < m;) {
		const int l = u[pn->ord[c]].layer;
		int e = c;
		while (e < m && u[pn->ord[e]].layer == l)
			e++;
		int ret = hostkv_pin_many(r->o.host, l, pn->pages + c, e - c, pn->blocks + c, err,
					  sizeof err);
		if (ret) {
			unpin_units(r, pn, u, c);
			return ret;
		}
		for (int k = c; k < e; k++)
			pn->src[pn->ord[k]] = pn->blocks[k];
		c = e;
	}
	*got = m;
	return 0;
}

/* One unit (2, p, d) into a host staging buffer: at once, or (fragmented) a row at a time, as
 * its 2p rows would be gathered from an NHD host layout. */
static void stage_unit(const struct recall *r, char *dst, const char *src)
{
	if (!r->o.fragmented) {
		memcpy(dst, src, r->unit_bytes);
		return;
	}
	const size_t rows = (size_t)2 * r->o.g.p, row = r->unit_bytes / rows;
	for (size_t i = 0; i < rows; i++)
		memcpy(dst + i * row, src + i * row, row);
}

/* Copy thread: takes jobs in order — an urgent one before any other not yet started — runs
 * their prepare step, fills the staging buffers in turn. */
static void *copy_main(void *arg)
{
	struct recall *r = arg;
	int b = 0;
	pthread_mutex_lock(&r->mu);
	for (;;) {
		while (!r->stop && r->copied == r->submitted && r->ucopied == r->usubmitted)
			pthread_cond_wait(&r->cv, &r->mu);
		struct recall_job *job;
		if (r->ucopied != r->usubmitted)
			job = &r->ujobs[++r->ucopied % RECALL_URGENT_JOBS];
		else if (r->copied != r->submitted)
			job = &r->jobs[++r->copied % (uint64_t)r->n_jobs];
		else
			break;
		pthread_mutex_unlock(&r->mu);

		int err = job->prepare ? job->prepare(job->arg, &job->units, &job->n) : 0;
		int64_t t0 = now_ns();
		job->t_start = t0;
		int i = 0;
		bool last = false;
		while (!last) {
			struct staging *s = &r->st[b];
			pthread_mutex_lock(&r->mu);
			while (s->full)
				pthread_cond_wait(&r->cv, &r->mu);
			pthread_mutex_unlock(&r->mu);
			/* The buffer's units: their blocks pinned at once, then copied and
			 * unpinned (staged) or left pinned for the convert thread (direct). */
			const struct recall_unit *u = job->units + i;
			int m = 0, want = job->n - i < r->cap ? job->n - i : r->cap;
			if (!err && want > 0) {
				err = pin_units(r, &s->pin, u, want, &m);
				for (int j = 0; j < m; j++) {
					const char *at = (const char *)s->pin.src[j] +
							 (size_t)u[j].head * r->unit_bytes;
					if (r->direct)
						s->at[j] = at;
					else
						stage_unit(r, (char *)s->buf + (size_t)j * r->unit_bytes,
							   at);
					s->dst[j] = u[j];
				}
				if (!err && !r->direct)
					err = unpin_units(r, &s->pin, u, m);
				i += m;
			}
			last = err || i == job->n;
			int64_t t1 = now_ns();
			pthread_mutex_lock(&r->mu);
			if (err)
				job->err = err;
			job->acc.ns_busy += t1 - t0;
			s->n = m;
			s->last = last;
			s->job = job;
			s->full = true;
			pthread_cond_broadcast(&r->cv);
			pthread_mutex_unlock(&r->mu);
			t0 = t1;
			b = (b + 1) % r->n_buf;
		}
		pthread_mutex_lock(&r->mu);
	}
	r->copy_exited = true;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

/* The units of a full staging buffer into their slots. */
static int scatter(struct recall *r, struct staging *s)
{
	const struct backend *be = r->o.be;
	if (!be) {
		for (int j = 0; j < s->n; j++)
			layout_scatter_unit(&r->o.g, s->dst[j].slot, s->dst[j].head,
					    (const char *)s->buf + (size_t)j * r->unit_bytes);
		return 0;
	}
	if (!s->n)
		return 0;
	for (int j = 0; j < s->n; j++) {
		s->slots[j] = s->dst[j].slot;
		s->heads[j] = s->dst[j].head;
	}
	if (!r->direct)
		return be->ops->recall_units(be->ctx, s->slots, s->heads, s->buf, s->n, r->o.g.p,
					     r->o.g.n_kv, r->o.g.d, r->o.g.dtype, r->o.slot_dt,
					     s->job->fence);
	/* Read where they lie; every source has been read when the op returns. */
	int ret = -EOPNOTSUPP;
	if (r->mapped)
		ret = be->ops->recall_mapped(be->ctx, s->slots, s->heads, s->at, s->n, r->o.g.p,
					     r->o.g.n_kv, r->o.g.d, r->o.g.dtype, r->o.slot_dt,
					     s->job->fence);
	if (ret == -EOPNOTSUPP && r->o.fragmented)
		ret = be->ops->recall_fragmented(be->ctx, s->slots, s->heads, s->at, s->n, r->o.g.p,
						 r->o.g.n_kv, r->o.g.d, r->o.g.dtype, r->o.slot_dt,
						 s->job->fence);
	else if (ret == -EOPNOTSUPP) /* not mapped (or not asked for): DMA */
		ret = be->ops->recall_direct(be->ctx, s->slots, s->heads, s->at, s->n, r->o.g.p,
					     r->o.g.n_kv, r->o.g.d, r->o.g.dtype, r->o.slot_dt,
					     s->job->fence);
	int r2 = unpin_units(r, &s->pin, s->dst, s->n);
	return ret ? ret : r2;
}

/* Convert thread: HND units of a full staging buffer into their NHD slots, then frees it. */
static void *conv_main(void *arg)
{
	struct recall *r = arg;
	int b = 0;
	pthread_mutex_lock(&r->mu);
	for (;;) {
		struct staging *s = &r->st[b];
		while (!r->copy_exited && !s->full)
			pthread_cond_wait(&r->cv, &r->mu);
		if (!s->full)
			break;
		pthread_mutex_unlock(&r->mu);

		int64_t t0 = now_ns();
		int err = scatter(r, s);
		if (r->o.poison && !r->direct)
			memset(s->buf, 0xff, (size_t)s->n * r->unit_bytes);
		int64_t t1 = now_ns();

		pthread_mutex_lock(&r->mu);
		struct recall_job *job = s->job;
		if (err && !job->err)
			job->err = err;
		job->acc.ns_busy += t1 - t0;
		job->acc.units += s->n;
		job->acc.bytes += (int64_t)s->n * (int64_t)r->unit_bytes;
		if (s->last) {
			job->done = true;
			job->t_done = t1;
		}
		s->full = false;
		pthread_cond_broadcast(&r->cv);
		b = (b + 1) % r->n_buf;
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

void recall_free(struct recall *r)
{
	if (!r)
		return;
	if (r->threads_up) {
		pthread_mutex_lock(&r->mu);
		r->stop = true;
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		pthread_join(r->copy_thr, NULL);
		pthread_join(r->conv_thr, NULL);
	}
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	for (int b = 0; b < 2; b++) {
		struct staging *s = &r->st[b];
		free(s->buf);
		free(s->at);
		free(s->dst);
		free(s->slots);
		free(s->heads);
		free(s->pin.src);
		free(s->pin.ord);
		free(s->pin.pages);
		free(s->pin.blocks);
		free(s->pin.taken);
	}
	free(r->jobs);
	free(r);
}

int recall_new(const struct recall_opts *o, struct recall **out)
{
	if (o->g.n_kv <= 0 || o->g.p <= 0 || o->g.d <= 0 || (!o->host && !o->src) ||
	    o->units_per_buffer < 0 || o->max_jobs < 0 || (!o->be && o->slot_dt != FKV_F32))
		return -EINVAL;
	if (o->be && !o->be->ops->recall_units)
		return -EOPNOTSUPP;
	struct recall *r = calloc(1, sizeof *r);
	if (!r)
		return -ENOMEM;
	r->o = *o;
	r->unit_bytes = layout_unit_bytes(&o->g);
	r->cap = o->units_per_buffer ? o->units_per_buffer : 64;
	r->n_jobs = o->max_jobs ? o->max_jobs : 64;
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	const struct backend_ops *bo = o->be ? o->be->ops : NULL;
	r->direct = bo && bo->recall_direct && o->path != RECALL_STAGED;
	r->mapped = r->direct && bo->recall_mapped && o->path == RECALL_MAPPED && !o->fragmented;
	r->n_buf = o->single_buffer ? 1 : 2;
	if (r->direct && o->fragmented && !bo->recall_fragmented) {
		recall_free(r);
		return -EOPNOTSUPP;
	}
	r->jobs = calloc((size_t)r->n_jobs, sizeof *r->jobs);
	if (!r->jobs) {
		recall_free(r);
		return -ENOMEM;
	}
	const size_t cap = (size_t)r->cap;
	for (int b = 0; b < 2; b++) {
		struct staging *s = &r->st[b];
		s->buf = r->direct ? NULL : malloc(cap * r->unit_bytes);
		s->at = calloc(cap, sizeof *s->at);
		s->dst = calloc(cap, sizeof *s->dst);
		s->slots = calloc(cap, sizeof *s->slots);
		s->heads = calloc(cap, sizeof *s->heads);
		s->pin.src = calloc(cap, sizeof *s->pin.src);
		s->pin.ord = calloc(cap, sizeof *s->pin.ord);
		s->pin.pages = calloc(cap, sizeof *s->pin.pages);
		s->pin.blocks = calloc(cap, sizeof *s->pin.blocks);
		s->pin.taken = calloc(cap, sizeof *s->pin.taken);
		if ((!s->buf && !r->direct) || !s->at || !s->dst || !s->slots || !s->heads ||
		    !s->pin.src || !s->pin.ord || !s->pin.pages || !s->pin.blocks ||
		    !s->pin.taken) {
			recall_free(r);
			return -ENOMEM;
		}
	}
	int ret = pthread_create(&r->copy_thr, NULL, copy_main, r);
	if (ret) {
		recall_free(r);
		return -ret;
	}
	ret = pthread_create(&r->conv_thr, NULL, conv_main, r);
	if (ret) {
		pthread_mutex_lock(&r->mu);
		r->stop = true;
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		pthread_join(r->copy_thr, NULL);
		recall_free(r);
		return -ret;
	}
	r->threads_up = true;
	*out = r;
	return 0;
}

int recall_submit(struct recall *r, struct recall_unit *units, int n, recall_prepare_fn prepare,
		  void *arg, uint64_t *ticket)
{
	return recall_submit_fenced(r, units, n, prepare, arg, NULL, ticket);
}

int recall_submit_fenced(struct recall *r, struct recall_unit *units, int n,
			 recall_prepare_fn prepare, void *arg, void *done, uint64_t *ticket)
{
	if (n < 0 || (n && !units) || (done && (!r->o.be || !r->o.be->ops->fence_stream_wait)))
		return -EINVAL;
	pthread_mutex_lock(&r->mu);
	struct recall_job *job = &r->jobs[(r->submitted + 1) % (uint64_t)r->n_jobs];
	while (job->in_use)
		pthread_cond_wait(&r->cv, &r->mu);
	*job = (struct recall_job){
		.ticket = r->submitted + 1, .units = units, .n = n, .prepare = prepare,
		.arg = arg, .fence = done, .in_use = true,
	};
	*ticket = ++r->submitted;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return 0;
}

int recall_wait(struct recall *r, uint64_t ticket, struct recall_done *done)
{
	if (done)
		*done = (struct recall_done){ 0 };
	if (!ticket)
		return 0;
	int64_t t0 = now_ns();
	pthread_mutex_lock(&r->mu);
	const bool urgent = ticket & RECALL_URGENT_BIT;
	const uint64_t seq = ticket & ~RECALL_URGENT_BIT;
	struct recall_job *job = urgent ? &r->ujobs[seq % RECALL_URGENT_JOBS]
					: &r->jobs[ticket % (uint64_t)r->n_jobs];
	if (seq > (urgent ? r->usubmitted : r->submitted) || !job->in_use ||
	    job->ticket != ticket) {
		pthread_mutex_unlock(&r->mu);
		return -EINVAL;
	}
	while (!job->done)
		pthread_cond_wait(&r->cv, &r->mu);
	int err = job->err;
	if (done) {
		int64_t t1 = now_ns();
		*done = job->acc;
		done->ns_waited = t1 - t0;
		int64_t a = job->t_start > t0 ? job->t_start : t0;
		int64_t b = job->t_done < t1 ? job->t_done : t1;
		done->ns_hidden = job->t_done - job->t_start - (b > a ? b - a : 0);
	}
	job->in_use = false;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return err;
}

int recall_submit_urgent(struct recall *r, struct recall_unit *units, int n, uint64_t *ticket)
{
	if (n < 0 || (n && !units))
		return -EINVAL;
	pthread_mutex_lock(&r->mu);
	struct recall_job *job = &r->ujobs[(r->usubmitted + 1) % RECALL_URGENT_JOBS];
	while (job->in_use)
		pthread_cond_wait(&r->cv, &r->mu);
	*job = (struct recall_job){
		.ticket = RECALL_URGENT_BIT | (r->usubmitted + 1), .units = units, .n = n,
		.in_use = true,
	};
	*ticket = job->ticket;
	r->usubmitted++;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return 0;
}
