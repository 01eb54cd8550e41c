/* load_worker — one kvload worker process, the hostile client and the final verifier. See
 * load.h. A worker talks to kvstored only through the client library, as kvworker does; every
 * block it writes has content load_fill() can recompute, and every block it reads is checked. */
#include "load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

#define CHUNK 32u		/* pages per ring op */
#define RECONNECT_S 30.0	/* how long a worker keeps trying to get back to the daemon */

static const uint8_t FP[16] = { 'k', 'v', 'l', 'o', 'a', 'd' };

struct wseq {
	char name[40];
	uint64_t id;
	uint32_t pages;		/* full pages committed (every layer) */
	bool attached;
};

struct wstate {
	const struct load_cfg *c;
	unsigned wi;
	struct kvs *k;
	uint8_t *base;
	size_t bb;
	struct wseq *s;
	unsigned n;
	uint64_t rng;
	double last_hb;		/* when idle_until last sent a heartbeat */
	struct load_stats st;
};

static uint64_t rnd(struct wstate *w)
{
	w->rng ^= w->rng >> 12, w->rng ^= w->rng << 25, w->rng ^= w->rng >> 27;
	return w->rng * 2685821657736338717ull;
}

/* Errors that mean "the connection or this registration is gone", which a worker recovers from
 * (reconnect, re-attach, verify); anything else from a RECALL of a committed block is loss. */
static bool transient(int ret)
{
	return ret == -EPERM || ret == -ECONNRESET || ret == -ECONNREFUSED || ret == -ETIMEDOUT ||
	       ret == -ESHUTDOWN || ret == -ENOTCONN || ret == -EAGAIN || ret == -EHOSTUNREACH ||
	       ret == -EACCES || ret == -EBUSY;
}

static int note(struct wstate *w, int ret, const char *what)
{
	if (!ret)
		return 0;
	w->st.errors++;
	if (!w->st.first_error) {
		w->st.first_error = ret;
		snprintf(w->st.first_error_msg, sizeof w->st.first_error_msg, "worker %u: %s: %s", w->wi,
			 what, w->k ? kvs_error(w->k) : strerror(-ret));
	}
	return ret;
}

#define TIMED(w, op, call)                                                                        \
	({                                                                                        \
		uint64_t t0_ = clock_ns();                                                        \
		int r_ = (call);                                                                  \
		hist_add(&(w)->st.h[op], clock_ns() - t0_);                                       \
		(w)->st.ops[op]++;                                                                \
		if ((op) != OP_RPC && r_ == 0)                                                    \
			stats_add_ring_parts(&(w)->st, (w)->k);                                   \
		r_;                                                                               \
	})

static int connect_worker(struct wstate *w)
{
	char name[32];
	snprintf(name, sizeof name, "load-%u", w->wi);
	int ret = kvs_connect(w->c->endpoint, 10000, &w->k);
	if (ret)
		return ret;
	ret = TIMED(w, OP_RPC, kvs_hello(w->k, KVS_ROLE_WORKER, name));
	if (ret) {
		note(w, ret, "hello");
		kvs_close(w->k);
		w->k = NULL;
		return ret;
	}
	w->base = kvs_pool_base(w->k);
	return 0;
}

/* Opens (creating) and attaches sequence j; learns how many full pages it holds. */
static int attach_one(struct wstate *w, struct wseq *q)
{
	Freekv__Reply *r = NULL;
	int ret = TIMED(w, OP_RPC, kvs_open_sequence(w->k, q->name, FP, sizeof FP, &w->c->geo, NULL,
						      0, true, &q->id));
	if (!ret)
		ret = TIMED(w, OP_RPC, kvs_attach(w->k, q->id, &r));
	if (ret)
		return note(w, ret, "open/attach");
	q->pages = (uint32_t)(r->sequence->committed_tokens / w->c->geo.page_size);
	q->attached = true;
	kvs_reply_free(r);
	return 0;
}

/* RECALLs pages [first, first + n) of `layer` and checks them; releases the leases. */
static int read_pages(struct wstate *w, struct wseq *q, uint32_t layer, uint32_t first, uint32_t n)
{
	uint64_t mask = (1ull << w->c->geo.n_kv_heads) - 1;
	for (uint32_t p0 = first; p0 < first + n; p0 += CHUNK) {
		uint32_t m = first + n - p0 < CHUNK ? first + n - p0 : CHUNK, pages[CHUNK];
		uint64_t masks[CHUNK], off[CHUNK], leases[CHUNK];
		for (uint32_t i = 0; i < m; i++)
			pages[i] = p0 + i, masks[i] = mask;
		int ret = TIMED(w, OP_RECALL, kvs_recall(w->k, q->id, layer, pages, masks, m, off, leases));
		if (ret) {
			note(w, ret, "recall");
			if (!transient(ret)) {
				w->st.lost += m; /* committed blocks that do not come back */
				continue;
			}
			return ret;
		}
		for (uint32_t i = 0; i < m; i++) {
			if (!load_check(w->base + off[i], w->bb, q->name, layer, p0 + i)) {
				w->st.mismatches++;
				if (!w->st.first_error) {
					w->st.first_error = -EILSEQ;
					snprintf(w->st.first_error_msg, sizeof w->st.first_error_msg,
						 "%s layer %u page %u: wrong bytes", q->name, layer, p0 + i);
				}
			}
			w->st.pages_verified++;
		}
		w->st.bytes_read += (uint64_t)m * w->bb;
		ret = TIMED(w, OP_RELEASE, kvs_release(w->k, leases, m));
		if (ret)
			return note(w, ret, "release");
	}
	return 0;
}

static int verify_seq(struct wstate *w, struct wseq *q)
{
	for (uint32_t l = 0; l < w->c->geo.n_layers; l++) {
		int ret = read_pages(w, q, l, 0, q->pages);
		if (ret)
			return ret;
	}
	return 0;
}

/* Appends full pages until q holds `upto`. A batch's earlier layers commit without moving the
 * committed length; the last layer moves it, so the length never counts a page that some
 * layer lacks (what a kill -9 between the two commits would otherwise leave). */
static int write_pages(struct wstate *w, struct wseq *q, uint32_t upto)
{
	uint32_t p = w->c->geo.page_size, L = w->c->geo.n_layers;
	while (q->pages < upto) {
		uint32_t p0 = q->pages, m = upto - p0 < CHUNK ? upto - p0 : CHUNK;
		uint64_t off[CHUNK];
		for (uint32_t l = 0; l < L; l++) {
			int ret = TIMED(w, OP_ALLOC, kvs_alloc(w->k, q->id, l, p0, m, off));
			if (ret == -EEXIST && l + 1 < L) {
				/* A worker killed between this batch's commits left its earlier layers
				 * committed (the length did not move): check them and go on. */
				ret = read_pages(w, q, l, p0, m);
				if (ret)
					return ret;
				continue;
			}
			if (ret)
				return note(w, ret, "alloc");
			for (uint32_t i = 0; i < m; i++)
				load_fill(w->base + off[i], w->bb, q->name, l, p0 + i);
			uint64_t committed = (uint64_t)(l + 1 == L ? p0 + m : p0) * p;
			ret = TIMED(w, OP_COMMIT, kvs_commit(w->k, q->id, committed, off, m));
			if (ret)
				return note(w, ret, "commit");
			w->st.bytes_written += (uint64_t)m * w->bb;
		}
		q->pages = p0 + m;
	}
	return 0;
}

/* After an error: a new connection, every sequence attached again and checked whole. */
static int recover(struct wstate *w, double deadline)
{
	double give_up = load_now_s() + RECONNECT_S;
	w->st.recoveries++;
	for (;;) {
		if (w->k)
			kvs_close(w->k);
		w->k = NULL;
		int ret = connect_worker(w);
		for (unsigned j = 0; !ret && j < w->n; j++) {
			w->s[j].attached = false;
			ret = attach_one(w, &w->s[j]);
			if (!ret)
				ret = verify_seq(w, &w->s[j]);
		}
		if (!ret)
			return 0;
		if (load_now_s() > give_up || load_now_s() > deadline + RECONNECT_S)
			return ret;
		usleep(200 * 1000);
	}
}

static int steady_op(struct wstate *w)
{
	struct wseq *q = &w->s[rnd(w) % w->n];
	unsigned r = (unsigned)(rnd(w) % 100);
	int ret;
	if (r < 55) { /* recall a few pages of one layer and check them */
		if (!q->pages)
			return 0;
		uint32_t n = 1 + (uint32_t)(rnd(w) % 8);
		n = n < q->pages ? n : q->pages;
		uint32_t first = (uint32_t)(rnd(w) % (q->pages - n + 1));
		return read_pages(w, q, (uint32_t)(rnd(w) % w->c->geo.n_layers), first, n);
	}
	if (r < 70) { /* detach and resume: the pages must all still be there */
		ret = TIMED(w, OP_RPC, kvs_detach(w->k, q->id));
		if (ret)
			return note(w, ret, "detach");
		uint32_t had = q->pages;
		if ((ret = attach_one(w, q)))
			return ret;
		if (q->pages != had) {
			w->st.lost += (uint64_t)(had > q->pages ? had - q->pages : 0) * w->c->geo.n_layers;
			return note(w, -EIO, "resume: committed length changed");
		}
		return q->pages ? read_pages(w, q, 0, q->pages - 1, 1) : 0;
	}
	if (r < 78) { /* churn: drop the sequence and write it again */
		ret = TIMED(w, OP_RPC, kvs_close_sequence(w->k, q->id, true));
		if (ret)
			return note(w, ret, "close");
		w->st.sequences_churned++;
		q->attached = false;
		if ((ret = attach_one(w, q)))
			return ret;
		return write_pages(w, q, w->c->pages);
	}
	Freekv__Reply *rep = NULL;
	ret = TIMED(w, OP_RPC, kvs_show_sequence(w->k, q->id, NULL, false, &rep));
	kvs_reply_free(rep);
	return note(w, ret, "show");
}

/* Sleeps until t (load_now_s), sending the heartbeats that fall due meanwhile: an idle worker
 * is still alive, and kvstored fences one that stays silent. */
static int idle_until(struct wstate *w, double t)
{
	if (!w->k)
		return -ENOTCONN;
	double hb = kvs_heartbeat_ms(w->k) / 1e3;
	if (hb <= 0)
		hb = 1.0; /* the daemon named no period */
	for (;;) {
		double now = load_now_s();
		if (now - w->last_hb >= hb) {
			int ret = TIMED(w, OP_RPC, kvs_heartbeat(w->k));
			if (ret)
				return note(w, ret, "heartbeat");
			w->last_hb = now;
		}
		if (now >= t)
			return 0;
		double d = t - now < hb ? t - now : hb;
		usleep((useconds_t)(d * 1e6) + 1);
	}
}

int load_worker_run(const struct load_cfg *cfg, unsigned wi, double deadline_s, int out_fd)
{
	struct wstate w = { .c = cfg, .wi = wi, .bb = load_block_bytes(cfg) };
	w.rng = (cfg->seed + wi) * 0x9e3779b97f4a7c15ull | 1;
	for (unsigned j = wi; j < cfg->sequences; j += cfg->workers)
		w.n++;
	w.s = calloc(w.n ? w.n : 1, sizeof *w.s);
	if (!w.s)
		return 3;
	for (unsigned j = wi, i = 0; j < cfg->sequences; j += cfg->workers, i++)
		snprintf(w.s[i].name, sizeof w.s[i].name, "w%u-s%u", wi, j);
	int ret = connect_worker(&w);
	/* Start: what is already there (a replacement for a killed worker) is checked whole. */
	for (unsigned j = 0; !ret && j < w.n; j++) {
		ret = attach_one(&w, &w.s[j]);
		if (!ret)
			ret = verify_seq(&w, &w.s[j]);
		if (!ret)
			ret = write_pages(&w, &w.s[j], cfg->pages);
		if (ret && transient(ret) && !(ret = recover(&w, deadline_s)))
			j = (unsigned)-1; /* start over: everything re-attached and checked */
	}
	/* The fill's figures apart from the steady phase's: latencies under a fill as fast as
	 * every worker can go say nothing about the load at the target rate. */
	struct load_stats fill = w.st;
	memset(&w.st, 0, sizeof w.st);
	struct load_slot *slot = cfg->slots ? &cfg->slots[wi] : NULL;
	if (slot) {
		slot->fill = fill;
		atomic_store_explicit(&slot->fill_done, true, memory_order_release);
	}
	double next_copy = load_now_s() + LOAD_SLOT_PERIOD_S;
	if (!ret && cfg->filled) {
		/* Every worker starts its steady phase when the last one has filled. */
		cfg->filled[wi] = 1;
		while (!ret && !load_all_filled(cfg) && load_now_s() < deadline_s) {
			ret = idle_until(&w, load_now_s() + 0.01);
			if (ret && transient(ret))
				ret = recover(&w, deadline_s);
		}
	}
	if (cfg->steady_s > 0 && load_now_s() + cfg->steady_s < deadline_s)
		deadline_s = load_now_s() + cfg->steady_s;
	double gap = cfg->rate > 0 ? cfg->workers / cfg->rate : 0, next = load_now_s();
	while (!ret && w.n && load_now_s() < deadline_s) {
		if (gap > 0) {
			next += gap;
			ret = idle_until(&w, next);
		}
		if (!ret)
			ret = steady_op(&w);
		if (ret && transient(ret))
			ret = recover(&w, deadline_s);
		else if (ret == -EIO)
			ret = 0; /* counted as loss, not a reason to stop */
		if (slot && load_now_s() >= next_copy) {
			unsigned n = atomic_load_explicit(&slot->seq, memory_order_relaxed);
			slot->steady[n & 1] = w.st;
			atomic_store_explicit(&slot->seq, n + 1, memory_order_release);
			next_copy = load_now_s() + LOAD_SLOT_PERIOD_S;
		}
	}
	/* Leave every sequence detached and kept, as a worker that ends does. */
	for (unsigned j = 0; !ret && j < w.n; j++)
		if (w.s[j].attached)
			note(&w, TIMED(&w, OP_RPC, kvs_detach(w.k, w.s[j].id)), "final detach");
	if (w.k)
		kvs_close(w.k);
	if (write(out_fd, &fill, sizeof fill) != (ssize_t)sizeof fill ||
	    write(out_fd, &w.st, sizeof w.st) != (ssize_t)sizeof w.st)
		ret = -EIO;
	free(w.s);
	return ret ? 1 : 0;
}

int load_hostile_run(const struct load_cfg *cfg, double deadline_s, int out_fd)
{
	struct wstate w = { .c = cfg, .wi = 1000000, .rng = cfg->seed * 31 + 7 };
	struct wseq own = { .name = "hostile" };
	int ret = connect_worker(&w);
	if (!ret)
		ret = attach_one(&w, &own);
	while (!ret && load_now_s() < deadline_s) {
		struct ring_entry e;
		memset(&e, 0, sizeof e);
		unsigned kind = (unsigned)(rnd(&w) % 3);
		e.n_payload = 1 + (uint32_t)(rnd(&w) % 8);
		e.count = e.n_payload;
		for (uint32_t i = 0; i < e.n_payload; i++)
			e.payload[i] = rnd(&w) % kvs_pool_bytes(w.k) & ~4095ull;
		if (kind == 0) { /* COMMIT of blocks it was never given */
			e.op = RING_OP_COMMIT;
			e.seq_id = own.id;
			e.committed_tokens = 0;
		} else if (kind == 1) { /* RELEASE of leases it never held */
			e.op = RING_OP_RELEASE;
			for (uint32_t i = 0; i < e.n_payload; i++)
				e.payload[i] = rnd(&w);
		} else { /* RECALL of someone else's sequence */
			e.op = RING_OP_RECALL;
			e.seq_id = 1 + rnd(&w) % (cfg->sequences + 1);
			if (e.seq_id == own.id)
				e.seq_id++;
			e.count = 1;
			e.n_payload = 2;
			e.payload[0] = 0;
			e.payload[1] = 1;
		}
		e.user_data = rnd(&w);
		int n = kvs_ring_submit(w.k, &e, 1);
		if (n != 1) {
			ret = n < 0 ? n : -EAGAIN;
			break;
		}
		struct ring_entry c;
		n = kvs_ring_complete(w.k, &c, 1, 10000);
		if (n != 1) {
			ret = n < 0 ? n : -ETIMEDOUT;
			break;
		}
		w.st.forged++;
		w.st.forged_accepted += c.status == 0;
		if (c.status == 0 && !w.st.first_error) {
			w.st.first_error = -EPERM;
			snprintf(w.st.first_error_msg, sizeof w.st.first_error_msg,
				 "hostile: forged op %u was accepted", e.op);
		}
		usleep(2000);
	}
	if (ret)
		note(&w, ret, "hostile client");
	if (w.k)
		kvs_close(w.k);
	struct load_stats none = { 0 };
	if (write(out_fd, &none, sizeof none) != (ssize_t)sizeof none ||
	    write(out_fd, &w.st, sizeof w.st) != (ssize_t)sizeof w.st)
		ret = -EIO;
	return ret ? 1 : 0;
}

int load_verify_all(const struct load_cfg *cfg, struct load_stats *s)
{
	struct wstate w = { .c = cfg, .wi = 2000000, .bb = load_block_bytes(cfg) };
	int ret = connect_worker(&w);
	for (unsigned j = 0; !ret && j < cfg->sequences; j++) {
		struct wseq q;
		memset(&q, 0, sizeof q);
		snprintf(q.name, sizeof q.name, "w%u-s%u", j % cfg->workers, j);
		ret = attach_one(&w, &q);
		if (!ret)
			ret = verify_seq(&w, &q);
		if (!ret)
			ret = note(&w, kvs_detach(w.k, q.id), "verify detach");
	}
	if (w.k)
		kvs_close(w.k);
	stats_merge(s, &w.st);
	return ret;
}
