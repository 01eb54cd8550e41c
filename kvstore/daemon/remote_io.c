/* remote_io — the remote tier's I/O thread. See remote_io.h. */
#include "remote_io.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "errmsg.h"

struct rio_req {
	struct remote_tier_op op;
	uint64_t cookie;
};

struct rio {
	struct remote *remote;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	int efd;
	/* Rings of requests: queued (todo) and finished (done); in flight between them. */
	struct rio_req *todo, *done, *scratch;	/* scratch: rio_reap's copy of done */
	size_t todo_head, n_todo, n_done, in_flight;
	struct remote_stats st;	/* copied from the connection after each batch */
};

static void *run(void *arg)
{
	struct rio *r = arg;
	struct rio_req batch[REMOTE_WINDOW];
	struct remote_tier_op ops[REMOTE_WINDOW];
	pthread_mutex_lock(&r->mu);
	for (;;) {
		while (!r->stop && !r->n_todo)
			pthread_cond_wait(&r->cv, &r->mu);
		if (r->stop)
			break;
		size_t n = r->n_todo < REMOTE_WINDOW ? r->n_todo : REMOTE_WINDOW;
		for (size_t i = 0; i < n; i++) {
			batch[i] = r->todo[(r->todo_head + i) % RIO_MAX_QUEUE];
			ops[i] = batch[i].op;
		}
		r->todo_head = (r->todo_head + n) % RIO_MAX_QUEUE;
		r->n_todo -= n;
		r->in_flight += n;
		pthread_mutex_unlock(&r->mu);

		remote_tier_batch(r->remote, ops, n);

		pthread_mutex_lock(&r->mu);
		remote_stats(r->remote, &r->st);
		for (size_t i = 0; i < n; i++) {
			batch[i].op.status = ops[i].status;
			memcpy(batch[i].op.err, ops[i].err, sizeof ops[i].err);
			r->done[r->n_done++] = batch[i];
		}
		r->in_flight -= n;
		uint64_t one = 1;
		if (write(r->efd, &one, sizeof one) < 0) {
			/* the counter is only a doorbell: a full one still wakes the reaper */
		}
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

/* Frees what rio_start made (the thread is not running). */
static void rio_free(struct rio *r)
{
	remote_close(r->remote);
	if (r->efd >= 0)
		close(r->efd);
	free(r->todo);
	free(r->done);
	free(r->scratch);
	free(r);
}

int rio_start(const struct remote_config *c, struct rio **out, char *err, size_t errlen)
{
	struct rio *r = calloc(1, sizeof *r);
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	r->efd = -1;
	r->todo = calloc(RIO_MAX_QUEUE, sizeof *r->todo);
	r->done = calloc(RIO_MAX_QUEUE, sizeof *r->done);
	r->scratch = calloc(RIO_MAX_QUEUE, sizeof *r->scratch);
	int ret = !r->todo || !r->done || !r->scratch ? errmsg(err, errlen, -ENOMEM, "out of memory")
						      : 0;
	if (!ret)
		ret = remote_open(c, &r->remote, err, errlen);
	if (!ret && (r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
		ret = errmsg(err, errlen, -errno, "eventfd: %s", strerror(errno));
	if (ret) {
		rio_free(r);
		return ret;
	}
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	if ((ret = pthread_create(&r->thread, NULL, run, r))) {
		pthread_mutex_destroy(&r->mu);
		pthread_cond_destroy(&r->cv);
		rio_free(r);
		return errmsg(err, errlen, -ret, "cannot start the remote tier's thread");
	}
	*out = r;
	return 0;
}

void rio_stop(struct rio *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	r->stop = true;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
	pthread_join(r->thread, NULL);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
	rio_free(r);
}

int rio_eventfd(const struct rio *r)
{
	return r->efd;
}

void rio_prefix_key(struct rio *r, const uint8_t key[32], uint32_t layer, char *out, size_t len)
{
	remote_prefix_key(r->remote, key, layer, out, len);
}

void rio_published_key(struct rio *r, const char *name, uint64_t gen, uint32_t layer,
		       uint32_t page, char *key, size_t len)
{
	remote_published_key(r->remote, name, gen, layer, page, key, len);
}

int rio_submit(struct rio *r, uint8_t kind, uint64_t id, const char *key, uint32_t ttl_s,
	       void *buf, uint32_t len, uint32_t crc, uint64_t cookie)
{
	pthread_mutex_lock(&r->mu);
	if (r->n_todo + r->in_flight + r->n_done >= RIO_MAX_QUEUE) {
		pthread_mutex_unlock(&r->mu);
		return -EBUSY;
	}
	struct rio_req *q = &r->todo[(r->todo_head + r->n_todo) % RIO_MAX_QUEUE];
	memset(q, 0, sizeof *q);
	q->op.kind = kind;
	q->op.id = id;
	if (key)
		snprintf(q->op.key, sizeof q->op.key, "%s", key);
	q->op.ttl_s = ttl_s;
	q->op.buf = buf;
	q->op.len = len;
	q->op.crc = crc;
	q->cookie = cookie;
	r->n_todo++;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return 0;
}

int rio_reap(struct rio *r, void (*fn)(void *ctx, const struct rio_result *res), void *ctx)
{
	uint64_t v;
	if (read(r->efd, &v, sizeof v) < 0) {
		/* nothing signalled: there may still be completions from before the last read */
	}
	struct rio_req *got = r->scratch;
	pthread_mutex_lock(&r->mu);
	size_t n = r->n_done;
	memcpy(got, r->done, n * sizeof *got);
	r->n_done = 0;
	pthread_mutex_unlock(&r->mu);
	for (size_t i = 0; i < n; i++) {
		struct rio_result res = { .cookie = got[i].cookie, .kind = got[i].op.kind,
					  .status = got[i].op.status, .buf = got[i].op.buf };
		memcpy(res.err, got[i].op.err, sizeof res.err);
		fn(ctx, &res);
	}
	return (int)n;
}

size_t rio_pending(struct rio *r)
{
	pthread_mutex_lock(&r->mu);
	size_t n = r->n_todo + r->in_flight + r->n_done;
	pthread_mutex_unlock(&r->mu);
	return n;
}

void rio_drain(struct rio *r, int timeout_ms, void (*fn)(void *ctx, const struct rio_result *res),
	       void *ctx)
{
	uint64_t end = clock_ms() + (uint64_t)timeout_ms;
	while (rio_pending(r) && clock_ms() < end) {
		rio_reap(r, fn, ctx);
		struct timespec ts = { 0, 2000000 };
		nanosleep(&ts, NULL);
	}
	rio_reap(r, fn, ctx);
}

void rio_stats(struct rio *r, struct remote_stats *st)
{
	pthread_mutex_lock(&r->mu);
	*st = r->st;
	pthread_mutex_unlock(&r->mu);
}
