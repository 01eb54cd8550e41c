/* engine — see engine.h. One forward chunk ("ubatch") packs up to ubatch tokens from several
 * sequences into one activation matrix, so every projection is one matmul over all of them;
 * only RoPE positions and attention are per sequence, and attention goes through each
 * sequence's KV policy. */
#include "engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "errmsg.h"
#include "hostkv.h"
#include "version.h"
#include "policy_opts.h"

struct engine_layer {
	struct backend_mat attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, w_gate, w_up, w_down;
	/* Fused projections (docs/design.md "The GPU decode step"), where the backend has
	 * weight_concat: wq, wk, wv are then row views of wqkv, w_gate and w_up of wgu. */
	struct backend_mat wqkv, wgu;
	bool has_bias;
};

struct engine_seq {
	bool live;
	void *kv;		  /* policy state */
	struct hostkv_seq *host;  /* borrowed host copy; NULL: none */
	/* Policies with a speculative row (docs/design.md §5 `specache`): */
	bool spec_ready;	  /* the last step ran a speculative row (no pre-step needed) */
	int32_t spec_next;	  /* the token the next step's speculative row runs (x̂_{t+2}) */
	int32_t spec_ran;	  /* the token the last step's speculative row ran (x̂_{t+1}) */
	struct engine_spec_stats spec;
};

/* One sequence's rows in a forward pass: an item of engine_forward, or one phase of a
 * speculative step. */
struct fwd_item {
	int seq;
	const int32_t *ids;
	int n;		     /* rows */
	int keep;	     /* rows that are tokens of the sequence: n, or fewer for a step with
			      * speculative rows (then the rows go into one ubatch) */
	bool all;	     /* logits of every row, else of the last */
	float *out;	     /* host (all ? n : 1, vocab) logits, or NULL */
};

/* One sequence's share of a ubatch. */
struct piece {
	int seq;
	int item;	     /* index into the items */
	int64_t off;	     /* first row within the item */
	int64_t n;	     /* rows */
	int64_t keep;	     /* of them, kept */
	int64_t row;	     /* first row in the ubatch */
	float *out;	     /* where its logits rows go (host), or NULL */
	int64_t n_out;	     /* logits rows */
};

struct engine {
	const struct fkv_model *m;
	struct backend *be;
	const struct kv_policy_ops *policy;
	struct fkv_model_config cfg;
	struct backend_rope rope;
	struct backend_attn attn;
	int64_t max_ctx;
	int ubatch, max_seqs;
	struct kv_policy_opts kv_opts;
	void (*progress)(void *ctx, int64_t done, int64_t total);
	void *progress_ctx;

	struct backend_mat tok_embd, out_norm, output;
	struct engine_layer *layers;
	struct engine_seq *seqs;

	/* Activations (backend memory), T = ubatch rows each. */
	float *x, *xb;	   /* (T, dim) */
	float *att;	   /* (T, n_heads * d) */
	/* q (T, n_heads * d), k, v (T, n_kv * d) back to back in qkv, for the ubatch's T, and
	 * gate, up (T', ffn) in gu for the T' rows of the FFN (layer_tail): one token's fused
	 * projection row [q | k | v] (or [gate | up]) is then exactly q, k, v (gate, up). */
	float *qkv, *gu;
	float *q, *k, *v;
	/* (T, max(n_heads * d + 2 n_kv * d, 2 ffn)) a fused GEMM's output over several rows,
	 * before split_cols de-interleaves it into qkv or gu; NULL without fused weights or the
	 * op (then several rows take the separate GEMMs). */
	float *fz;
	float *xo;	   /* (R, dim) rows whose logits are wanted */
	float *logits;	   /* (R, vocab) */
	int64_t logit_rows; /* R allocated */

	/* Host scratch, T entries each, and their backend copies (uploaded once per ubatch). */
	int32_t *ids, *pos, *out_rows;
	int32_t *ids_b, *pos_b, *rows_b;
	struct piece *pieces;

	struct fwd_item *items;	/* (max_seqs) one forward call's items */
	/* (T) one layer's batch-wide decode attention: an item per prepared piece, and which */
	struct backend_attn_item *att_items;
	int *att_piece;
	/* Speculative steps: the two tokens of each item, their logits (host). */
	int32_t *spec_toks;	/* (max_seqs, 2) */
	float *spec_lg;		/* (max_seqs, 2, vocab) */

	/* Graphs of decode steps (backend graph_run; docs/design.md "The GPU decode step"): the
	 * step's device work between attentions, segment s of graph_segment(), recorded for
	 * steps of graph_T rows over the buffers of generation graph_gen (buf_gen counts moves of
	 * the engine's buffers); graph_warm once such a step ran plain (workspaces grown). */
	struct backend_graph **graphs; /* (n_layers + 1), or NULL: graphs off */
	int64_t graph_T;
	uint64_t buf_gen, graph_gen;
	bool graph_warm;
	struct engine_graph_stats gst;
};

static void *bufa(struct engine *e, size_t bytes)
{
	return e->be->ops->buf_alloc(e->be->ctx, bytes);
}

static void buff(struct engine *e, void *p)
{
	if (p)
		e->be->ops->buf_free(e->be->ctx, p);
}

/* Makes a tensor resident after checking its shape; absent optional tensors stay zeroed. */
static int check_w(const struct fkv_tensor *t, const char *name, int layer, int64_t rows,
		   int64_t cols, char *err, size_t errlen)
{
	if (!t->data)
		return errmsg(err, errlen, -EINVAL, "layer %d: tensor %s missing", layer, name);
	int64_t tc = t->n_dims == 2 ? t->shape[1] : 1;
	if (t->shape[0] != rows || tc != cols)
		return errmsg(err, errlen, -EINVAL,
			      "layer %d: tensor %s is (%lld, %lld), expected (%lld, %lld)", layer,
			      name, (long long)t->shape[0], (long long)tc, (long long)rows,
			      (long long)cols);
	return 0;
}

/* load_w for a weight only embed reads, by the backend's weight_load_rows where it has one. */
static int load_embd(struct engine *e, const struct fkv_tensor *t, int64_t rows, int64_t cols,
		     struct backend_mat *dst, char *err, size_t errlen)
{
	int ret = check_w(t, "tok_embd", -1, rows, cols, err, errlen);
	if (ret)
		return ret;
	const struct backend_ops *o = e->be->ops;
	ret = (o->weight_load_rows ? o->weight_load_rows : o->weight_load)(e->be->ctx, t, dst);
	if (ret)
		return errmsg(err, errlen, ret, "cannot load tok_embd: %s", strerror(-ret));
	return 0;
}

static int load_w(struct engine *e, const struct fkv_tensor *t, const char *name, int layer,
		  int64_t rows, int64_t cols, bool optional, struct backend_mat *dst,
		  char *err, size_t errlen)
{
	if (!t->data && optional)
		return 0;
	int ret = check_w(t, name, layer, rows, cols, err, errlen);
	if (ret)
		return ret;
	ret = e->be->ops->weight_load(e->be->ctx, t, dst);
	if (ret)
		return errmsg(err, errlen, ret, "layer %d: cannot load %s: %s", layer, name,
			      strerror(-ret));
	return 0;
}

static void release_w(struct engine *e, struct backend_mat *w)
{
	if (w->data)
		e->be->ops->weight_release(e->be->ctx, w);
}

/* Loads the n parts (checked shapes (rows[i], cols)) as one weight fused, stacked by rows, and
 * points views[i] at their rows of it, when the backend has weight_concat and the parts share
 * a dtype and none is quantized (a quantized part keeps its own GEMM); otherwise loads each
 * part on its own. A view owns nothing (priv NULL). */
static int load_fused(struct engine *e, const struct fkv_tensor *const *parts,
		      const char *const *names, const int64_t *rows, int n, int64_t cols, int layer,
		      struct backend_mat *fused, struct backend_mat *const *views, char *err,
		      size_t errlen)
{
	int ret = 0;
	bool same = true;
	for (int i = 0; i < n && !ret; i++) {
		ret = check_w(parts[i], names[i], layer, rows[i], cols, err, errlen);
		same &= !ret && parts[i]->dtype == parts[0]->dtype && parts[i]->quant == FKV_QNONE;
	}
	if (ret)
		return ret;
	if (!same || !e->be->ops->weight_concat) {
		for (int i = 0; i < n && !ret; i++)
			ret = load_w(e, parts[i], names[i], layer, rows[i], cols, false, views[i],
				     err, errlen);
		return ret;
	}
	ret = e->be->ops->weight_concat(e->be->ctx, parts, n, fused);
	if (ret)
		return errmsg(err, errlen, ret, "layer %d: cannot load %s..%s fused: %s", layer,
			      names[0], names[n - 1], strerror(-ret));
	size_t off = 0, row_bytes = (size_t)cols * dtype_size(parts[0]->dtype);
	for (int i = 0; i < n; i++) {
		*views[i] = (struct backend_mat){ .data = (const char *)fused->data + off,
						  .dtype = fused->dtype, .rows = rows[i],
						  .cols = cols, .priv = NULL };
		off += (size_t)rows[i] * row_bytes;
	}
	return 0;
}

static int load_weights(struct engine *e, char *err, size_t errlen)
{
	const struct fkv_model *m = e->m;
	const struct fkv_model_config *c = &e->cfg;
	int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim;
	int64_t kvd = (int64_t)c->n_kv_heads * c->head_dim, ffn = c->ffn_dim, V = c->vocab_size;
	int ret = load_embd(e, &m->tok_embd, V, dim, &e->tok_embd, err, errlen)
		?: load_w(e, &m->out_norm, "out_norm", -1, dim, 1, false, &e->out_norm, err, errlen)
		?: load_w(e, &m->output, "output", -1, V, dim, false, &e->output, err, errlen);
	if (ret)
		return ret;
	for (int l = 0; l < c->n_layers; l++) {
		const struct fkv_layer_weights *s = &m->layers[l];
		struct engine_layer *d = &e->layers[l];
		const struct fkv_tensor *qkv[] = { &s->wq, &s->wk, &s->wv };
		const struct fkv_tensor *gu[] = { &s->w_gate, &s->w_up };
		static const char *const qkv_n[] = { "wq", "wk", "wv" };
		static const char *const gu_n[] = { "w_gate", "w_up" };
		struct backend_mat *qkv_v[] = { &d->wq, &d->wk, &d->wv };
		struct backend_mat *gu_v[] = { &d->w_gate, &d->w_up };
		const int64_t qkv_r[] = { qd, kvd, kvd }, gu_r[] = { ffn, ffn };
		ret = load_w(e, &s->attn_norm, "attn_norm", l, dim, 1, false, &d->attn_norm, err, errlen)
		   ?: load_fused(e, qkv, qkv_n, qkv_r, 3, dim, l, &d->wqkv, qkv_v, err, errlen)
		   ?: load_w(e, &s->wo, "wo", l, dim, qd, false, &d->wo, err, errlen)
		   ?: load_w(e, &s->bq, "bq", l, qd, 1, true, &d->bq, err, errlen)
		   ?: load_w(e, &s->bk, "bk", l, kvd, 1, true, &d->bk, err, errlen)
		   ?: load_w(e, &s->bv, "bv", l, kvd, 1, true, &d->bv, err, errlen)
		   ?: load_w(e, &s->ffn_norm, "ffn_norm", l, dim, 1, false, &d->ffn_norm, err, errlen)
		   ?: load_fused(e, gu, gu_n, gu_r, 2, dim, l, &d->wgu, gu_v, err, errlen)
		   ?: load_w(e, &s->w_down, "w_down", l, dim, ffn, false, &d->w_down, err, errlen);
		if (ret)
			return ret;
		d->has_bias = d->bq.data || d->bk.data || d->bv.data;
		if (d->has_bias && (!d->bq.data || !d->bk.data || !d->bv.data))
			return errmsg(err, errlen, -EINVAL, "layer %d: q/k/v biases must come together", l);
	}
	return 0;
}

static int check_config(const struct fkv_model_config *c, char *err, size_t errlen)
{
	if (c->n_layers <= 0 || c->dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
	    c->head_dim <= 0 || c->ffn_dim <= 0 || c->vocab_size <= 0)
		return errmsg(err, errlen, -EINVAL, "model config has a non-positive size");
	if (c->n_heads % c->n_kv_heads)
		return errmsg(err, errlen, -EINVAL, "n_heads %d is not a multiple of n_kv_heads %d",
			      c->n_heads, c->n_kv_heads);
	if (c->head_dim % 2)
		return errmsg(err, errlen, -EINVAL, "head_dim %d is odd", c->head_dim);
	if (c->rope_scaling_factor > 0.0f &&
	    (c->rope_original_ctx <= 0 || c->rope_high_freq_factor <= c->rope_low_freq_factor))
		return errmsg(err, errlen, -EINVAL, "inconsistent llama3 rope scaling parameters");
	return 0;
}

static int alloc_logits(struct engine *e, int64_t rows)
{
	if (rows <= e->logit_rows)
		return 0;
	float *xo = bufa(e, (size_t)rows * (size_t)e->cfg.dim * sizeof(float));
	float *lg = bufa(e, (size_t)rows * (size_t)e->cfg.vocab_size * sizeof(float));
	if (!xo || !lg) {
		buff(e, xo);
		buff(e, lg);
		return -ENOMEM;
	}
	buff(e, e->xo);
	buff(e, e->logits);
	e->xo = xo;
	e->logits = lg;
	e->logit_rows = rows;
	e->buf_gen++; /* a recorded graph holds the old addresses */
	return 0;
}

static void free_graphs(struct engine *e)
{
	for (int s = 0; e->graphs && s <= e->cfg.n_layers; s++) {
		e->be->ops->graph_free(e->be->ctx, e->graphs[s]);
		e->graphs[s] = NULL;
	}
	e->graph_warm = false;
}

static int alloc_acts(struct engine *e)
{
	const struct fkv_model_config *c = &e->cfg;
	size_t T = (size_t)e->ubatch, f = sizeof(float);
	size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
	e->x = bufa(e, T * c->dim * f);
	e->xb = bufa(e, T * c->dim * f);
	e->qkv = bufa(e, T * (qd + 2 * kvd) * f);
	e->att = bufa(e, T * qd * f);
	e->gu = bufa(e, T * 2 * (size_t)c->ffn_dim * f);
	bool fused = false;
	for (int l = 0; l < c->n_layers; l++)
		fused = fused || e->layers[l].wqkv.data || e->layers[l].wgu.data;
	if (fused && T > 1 && e->be->ops->split_cols) {
		const size_t wide = qd + 2 * kvd > 2 * (size_t)c->ffn_dim ? qd + 2 * kvd
									   : 2 * (size_t)c->ffn_dim;
		if (!(e->fz = bufa(e, T * wide * f)))
			return -ENOMEM;
	}
	e->ids_b = bufa(e, T * sizeof(int32_t));
	e->pos_b = bufa(e, T * sizeof(int32_t));
	e->rows_b = bufa(e, T * sizeof(int32_t));
	e->ids = calloc(T, sizeof *e->ids);
	e->pos = calloc(T, sizeof *e->pos);
	e->out_rows = calloc(T, sizeof *e->out_rows);
	e->pieces = calloc(T, sizeof *e->pieces);
	e->items = calloc((size_t)e->max_seqs, sizeof *e->items);
	e->att_items = calloc(T, sizeof *e->att_items);
	e->att_piece = calloc(T, sizeof *e->att_piece);
	if (!e->x || !e->xb || !e->qkv || !e->att || !e->gu || !e->items || !e->att_items ||
	    !e->att_piece ||
	    !e->ids || !e->pos || !e->out_rows || !e->pieces || !e->ids_b || !e->pos_b ||
	    !e->rows_b)
		return -ENOMEM;
	return alloc_logits(e, e->max_seqs < e->ubatch ? e->max_seqs : e->ubatch);
}

void engine_free(struct engine *e)
{
	if (!e)
		return;
	for (int i = 0; e->seqs && i < e->max_seqs; i++)
		if (e->seqs[i].live)
			e->policy->destroy(e->seqs[i].kv);
	free(e->seqs);
	if (e->layers) {
		for (int l = 0; l < e->cfg.n_layers; l++) {
			struct engine_layer *d = &e->layers[l];
			/* views (priv NULL) release nothing; the fused weights last */
			struct backend_mat *w[] = { &d->attn_norm, &d->wq, &d->wk, &d->wv, &d->wo,
						    &d->bq, &d->bk, &d->bv, &d->ffn_norm,
						    &d->w_gate, &d->w_up, &d->w_down, &d->wqkv,
						    &d->wgu };
			for (size_t i = 0; i < sizeof w / sizeof *w; i++)
				release_w(e, w[i]);
		}
		free(e->layers);
	}
	release_w(e, &e->tok_embd);
	release_w(e, &e->out_norm);
	release_w(e, &e->output);
	free_graphs(e);
	free(e->graphs);
	void *bufs[] = { e->x, e->xb, e->qkv, e->att, e->gu, e->fz, e->xo, e->logits,
			 e->ids_b, e->pos_b, e->rows_b };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		buff(e, bufs[i]);
	free(e->ids);
	free(e->pos);
	free(e->out_rows);
	free(e->pieces);
	free(e->items);
	free(e->att_items);
	free(e->att_piece);
	free(e->spec_toks);
	free(e->spec_lg);
	free(e);
}

/* Settings left at 0 become the defaults scaled to the context (policy_opts.h), so the policy
 * and the host copy's page geometry agree on concrete values. */
static int resolve_kv_opts(struct engine *e, char *err, size_t errlen)
{
	struct kv_policy_opts *k = &e->kv_opts;
	if (!(k->top_p >= 0.0f && k->top_p <= 1.0f) || k->recalibrate < 0)
		return errmsg(err, errlen, -EINVAL, "kv-top-p %g must be in (0, 1] and recalibrate %d "
			      ">= 1 (0: the policy's default)", (double)k->top_p, k->recalibrate);
	if (k->page || k->budget || k->sink || k->window)
		return 0;
	struct policy_opts po;
	policy_opts_default(&po);
	po.kv.full_layers = k->full_layers;
	po.kv.tau = k->tau;
	po.kv.debug_invariants = k->debug_invariants;
	po.kv.top_p = k->top_p;
	po.kv.recalibrate = k->recalibrate;
	int ret = policy_opts_finalize(&po, (int)(e->max_ctx < INT32_MAX ? e->max_ctx : INT32_MAX),
				       NULL, err, errlen);
	if (!ret) {
		k->page = po.kv.page;
		k->budget = po.kv.budget;
		k->sink = po.kv.sink;
		k->window = po.kv.window;
	}
	return ret;
}

int engine_new(struct engine **out, const struct fkv_model *m, struct backend *be,
	       const struct engine_opts *o, char *err, size_t errlen)
{
	struct engine_opts def = { 0 };
	if (!o)
		o = &def;
	int ret = check_config(&m->cfg, err, errlen);
	if (ret)
		return ret;
	const char *pname = o->policy ? o->policy : "full";
	const struct kv_policy_ops *pol = kvcache_policy(pname);
	if (!pol)
		return errmsg(err, errlen, -EINVAL, "unknown KV policy '%s' (known: %s)", pname,
			      kvcache_policy_names());
	if (o->max_ctx < 0 || o->ubatch < 0 || o->max_seqs < 0)
		return errmsg(err, errlen, -EINVAL, "negative engine option");
	struct engine *e = calloc(1, sizeof *e);
	if (!e)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	e->m = m;
	e->be = be;
	e->policy = pol;
	e->cfg = m->cfg;
	e->max_ctx = o->max_ctx ? o->max_ctx : (m->cfg.ctx_len > 0 ? m->cfg.ctx_len : 2048);
	e->ubatch = o->ubatch ? o->ubatch : 256;
	e->progress = o->progress;
	e->progress_ctx = o->progress_ctx;
	e->max_seqs = o->max_seqs ? o->max_seqs : 64;
	e->kv_opts = o->kv;
	ret = resolve_kv_opts(e, err, errlen);
	if (ret) {
		free(e);
		return ret;
	}
	e->rope = (struct backend_rope){
		.style = m->cfg.rope_style,
		.theta = m->cfg.rope_theta > 0.0f ? m->cfg.rope_theta : 10000.0f,
		.scaling_factor = m->cfg.rope_scaling_factor,
		.low_freq_factor = m->cfg.rope_low_freq_factor,
		.high_freq_factor = m->cfg.rope_high_freq_factor,
		.original_ctx = m->cfg.rope_original_ctx,
	};
	e->attn = (struct backend_attn){
		.n_heads = m->cfg.n_heads,
		.n_kv_heads = m->cfg.n_kv_heads,
		.head_dim = m->cfg.head_dim,
		.kv_dtype = o->kv_dtype_set ? o->kv_dtype : m->cfg.dtype,
		.scale = 1.0f / sqrtf((float)m->cfg.head_dim),
		.window = m->cfg.sliding_window > 0 ? m->cfg.sliding_window : 0,
	};
	e->layers = calloc((size_t)m->cfg.n_layers, sizeof *e->layers);
	e->seqs = calloc((size_t)e->max_seqs, sizeof *e->seqs);
	if (!e->layers || !e->seqs) {
		engine_free(e);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	ret = load_weights(e, err, errlen);
	if (ret) {
		engine_free(e);
		return ret;
	}
	/* A backend that holds the weights itself (the device's memory, the CPU backend's huge
	 * pages: the output projection, the largest matrix, is then not the model's) reads the
	 * file mapping no more than for the embedding's rows: its pages leave this process's
	 * memory, read again from the page cache if touched. */
	if (e->output.data != m->output.data)
		model_drop_pages(m);
	ret = alloc_acts(e);
	if (ret) {
		engine_free(e);
		return errmsg(err, errlen, ret, "cannot allocate activations for ubatch %d",
			      o->ubatch ? o->ubatch : 256);
	}
	/* Graphs where the backend records them, unless FREEKV_CUDA_GRAPHS=0. */
	const char *gv = getenv("FREEKV_CUDA_GRAPHS");
	if (be->ops->graph_run && be->ops->graph_free && !(gv && !strcmp(gv, "0"))) {
		e->graphs = calloc((size_t)m->cfg.n_layers + 1, sizeof *e->graphs);
		if (!e->graphs) {
			engine_free(e);
			return errmsg(err, errlen, -ENOMEM, "out of memory");
		}
		e->gst.on = true;
	}
	if (pol->spec_rows) {
		/* A step's rows run in one ubatch. */
		if (e->ubatch < 1 + pol->spec_rows || !pol->step_begin_keep) {
			engine_free(e);
			return errmsg(err, errlen, -EINVAL, "policy %s needs a ubatch of at least %d",
				      pol->name, 1 + pol->spec_rows);
		}
		e->spec_toks = calloc((size_t)e->max_seqs * 2, sizeof *e->spec_toks);
		e->spec_lg = malloc((size_t)e->max_seqs * 2 * (size_t)m->cfg.vocab_size *
				    sizeof *e->spec_lg);
		if (!e->spec_toks || !e->spec_lg) {
			engine_free(e);
			return errmsg(err, errlen, -ENOMEM, "out of memory");
		}
	}
	*out = e;
	return 0;
}

int engine_vocab(const struct engine *e)
{
	return e->cfg.vocab_size;
}

int64_t engine_max_ctx(const struct engine *e)
{
	return e->max_ctx;
}

int engine_ubatch(const struct engine *e)
{
	return e->ubatch;
}

/* The CPU's model name (/proc/cpuinfo), or "unknown"; read once (every sequence open asks). */
static char g_cpu_model[128];
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void read_cpu_model(void)
{
	char *buf = g_cpu_model;
	size_t len = sizeof g_cpu_model;
	snprintf(buf, len, "unknown");
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	while (f && fgets(line, sizeof line, f)) {
		char *colon = strchr(line, ':');
		if (colon && !strncmp(line, "model name", 10)) {
			colon += colon[1] == ' ' ? 2 : 1;
			colon[strcspn(colon, "\n")] = 0;
			snprintf(buf, len, "%s", colon);
			break;
		}
	}
	if (f)
		fclose(f);
}

void engine_prefix_variant(const struct engine *e, char *buf, size_t len)
{
	pthread_once(&g_cpu_once, read_cpu_model);
	snprintf(buf, len, "backend=%s;policy=%s;build=%s;cpu=%s", e->be->ops->name, e->policy->name,
		 fkv_build_id(), g_cpu_model);
}

void engine_kv_geom(const struct engine *e, struct kv_geom *g)
{
	*g = (struct kv_geom){ .n_kv = e->attn.n_kv_heads, .p = e->kv_opts.page,
			       .d = e->attn.head_dim, .dtype = e->attn.kv_dtype };
}

const struct kv_policy_opts *engine_kv_opts(const struct engine *e)
{
	return &e->kv_opts;
}

const char *engine_policy_name(const struct engine *e)
{
	return e->policy->name;
}

int engine_seq_new(struct engine *e, int *seq, char *err, size_t errlen)
{
	return engine_seq_open(e, NULL, seq, err, errlen);
}

int engine_seq_open(struct engine *e, struct hostkv_seq *host, int *seq, char *err,
		    size_t errlen)
{
	int i = 0;
	while (i < e->max_seqs && e->seqs[i].live)
		i++;
	if (i == e->max_seqs)
		return errmsg(err, errlen, -ENOSPC, "all %d sequence slots are in use", e->max_seqs);
	struct kv_seq_params p = {
		.be = e->be,
		.n_layers = e->cfg.n_layers,
		.attn = e->attn,
		.max_tokens = e->max_ctx,
		.opts = e->kv_opts,
		.host = host,
	};
	int64_t committed = host ? hostkv_seq_committed(host) : 0;
	/* With no id kept past the committed tokens, the last one is run again (rewriting the
	 * same K/V) so that the caller gets the logits to continue from. */
	const int32_t *kept;
	if (committed && hostkv_seq_tokens(host, &kept) == committed)
		committed--;
	if (committed > e->max_ctx)
		return errmsg(err, errlen, -ENOSPC, "the host copy holds %lld tokens, more than the "
			      "context limit of %lld", (long long)committed, (long long)e->max_ctx);
	if (committed && !e->policy->restore)
		return errmsg(err, errlen, -EOPNOTSUPP, "policy %s cannot resume a sequence",
			      e->policy->name);
	void *kv;
	/* Recall reads the pool: page-locked before the first recall on a backend that DMAs. */
	int ret = host ? hostkv_seq_register(host, e->be, err, errlen) : 0;
	if (ret)
		return ret;
	ret = e->policy->create(&p, &kv);
	if (ret == -EOPNOTSUPP)
		return errmsg(err, errlen, ret, "policy %s does not run on the %s backend (it lacks "
			      "an op the policy needs)", e->policy->name, e->be->ops->name);
	if (ret)
		return errmsg(err, errlen, ret, "policy %s: cannot create sequence state: %s",
			      e->policy->name, strerror(-ret));
	if (committed && (ret = e->policy->restore(kv, committed))) {
		e->policy->destroy(kv);
		return errmsg(err, errlen, ret, "policy %s: cannot restore %lld tokens from the host "
			      "copy: %s", e->policy->name, (long long)committed, strerror(-ret));
	}
	e->seqs[i] = (struct engine_seq){ .live = true, .kv = kv, .host = host };
	*seq = i;
	return 0;
}

static bool seq_ok(const struct engine *e, int seq)
{
	return seq >= 0 && seq < e->max_seqs && e->seqs[seq].live;
}

void engine_seq_free(struct engine *e, int seq)
{
	if (!seq_ok(e, seq))
		return;
	e->policy->destroy(e->seqs[seq].kv);
	e->seqs[seq].kv = NULL;
	e->seqs[seq].host = NULL;
	e->seqs[seq].live = false;
}

int engine_seq_keep(struct engine *e, int seq, const int32_t *ids, int n, char *err,
		    size_t errlen)
{
	if (!seq_ok(e, seq) || n < 0)
		return errmsg(err, errlen, -EINVAL, "sequence %d does not exist", seq);
	struct engine_seq *s = &e->seqs[seq];
	if (!s->host || !n)
		return 0;
	int64_t len = e->policy->length(s->kv);
	return hostkv_commit(s->host, len, ids, len, n, err, errlen);
}

int engine_seqs_keep(struct engine *e, const int *seqs, const int32_t *ids, int n, int *rets,
		     char *err, size_t errlen)
{
	for (int i = 0; i < n; i++)
		rets[i] = 0;
	for (int i = 0; i < n; i++)
		if (!seq_ok(e, seqs[i])) {
			for (int k = 0; k < n; k++)
				rets[k] = -EINVAL;
			return errmsg(err, errlen, -EINVAL, "sequence %d does not exist", seqs[i]);
		}
	/* The sequences with a host copy, kept together when they share its store (the
	 * sequences are distinct: hostkv_commit_many refuses one twice). */
	struct hostkv_seq **hs = malloc((size_t)(n ? n : 1) * sizeof *hs);
	int64_t *len = malloc((size_t)(n ? n : 1) * sizeof *len);
	int64_t *one = malloc((size_t)(n ? n : 1) * sizeof *one);
	const int32_t **idp = malloc((size_t)(n ? n : 1) * sizeof *idp);
	int *at = malloc((size_t)(n ? n : 1) * sizeof *at);
	int *r = malloc((size_t)(n ? n : 1) * sizeof *r);
	int ret = 0, m = 0;
	if (!hs || !len || !one || !idp || !at || !r) {
		ret = errmsg(err, errlen, -ENOMEM, "out of memory");
		goto out;
	}
	bool together = true;
	for (int i = 0; i < n; i++) {
		const struct engine_seq *s = &e->seqs[seqs[i]];
		if (!s->host)
			continue;
		hs[m] = s->host;
		len[m] = e->policy->length(s->kv);
		one[m] = 1;
		idp[m] = ids + i;
		at[m] = i;
		together &= hostkv_seq_store(hs[m]) == hostkv_seq_store(hs[0]);
		m++;
	}
	if (together) {
		/* committed = first = the length: one id, at the position the next step runs */
		ret = hostkv_commit_many(hs, len, idp, len, one, m, r, err, errlen);
		for (int k = 0; k < m; k++)
			rets[at[k]] = r[k];
	} else {
		for (int k = 0; k < m; k++) {
			rets[at[k]] = hostkv_commit(hs[k], len[k], idp[k], len[k], 1, err, errlen);
			ret = ret ? ret : rets[at[k]];
		}
	}
out:
	free(hs);
	free(len);
	free(one);
	free(idp);
	free(at);
	free(r);
	return ret;
}

int engine_seq_layer_stats(const struct engine *e, int seq, int layer,
			   struct kv_layer_stats *out)
{
	if (!seq_ok(e, seq) || layer < 0 || layer >= e->cfg.n_layers)
		return -EINVAL;
	if (!e->policy->layer_stats) {
		memset(out, 0, sizeof *out);
		return 0;
	}
	return e->policy->layer_stats(e->seqs[seq].kv, layer, out);
}

int engine_seq_layer_select(const struct engine *e, int seq, int layer, int *pages,
			    float *theta)
{
	if (!seq_ok(e, seq) || layer < 0 || layer >= e->cfg.n_layers)
		return -EINVAL;
	if (!e->policy->layer_select)
		return -EOPNOTSUPP;
	return e->policy->layer_select(e->seqs[seq].kv, layer, pages, theta);
}

int engine_seq_spec_stats(const struct engine *e, int seq, struct engine_spec_stats *out)
{
	if (!seq_ok(e, seq))
		return -EINVAL;
	*out = e->seqs[seq].spec;
	return 0;
}

void *engine_seq_policy(const struct engine *e, int seq)
{
	return seq_ok(e, seq) ? e->seqs[seq].kv : NULL;
}

int64_t engine_seq_len(const struct engine *e, int seq)
{
	if (!seq_ok(e, seq))
		return -EINVAL;
	return e->policy->length(e->seqs[seq].kv);
}

void engine_graph_stats(const struct engine *e, struct engine_graph_stats *out)
{
	*out = e->gst;
}

int engine_seq_stats(const struct engine *e, int seq, struct kv_stats *out)
{
	if (!seq_ok(e, seq))
		return -EINVAL;
	*out = (struct kv_stats){ 0 }; /* what a policy does not count stays zero */
	e->policy->stats(e->seqs[seq].kv, out);
	return 0;
}

/* Attention block of one layer for every piece: append K/V, attend. With a policy and a
 * backend that batch it, every decode row's attention is one attn_decode_batch call for the
 * whole ubatch (docs/design.md "The GPU decode step"): each sequence prepares (selection,
 * recall, page lists), the batch runs, each finishes; rows a policy does not batch attend as
 * they come. */
static int layer_attention(struct engine *e, int l, const struct piece *pc, int np)
{
	const struct kv_policy_ops *P = e->policy;
	const struct backend_ops *o = e->be->ops;
	int64_t qd = (int64_t)e->cfg.n_heads * e->cfg.head_dim;
	int64_t kvd = (int64_t)e->cfg.n_kv_heads * e->cfg.head_dim;
	const bool batch = P->attend_prepare && o->attn_decode_batch;
	int nb = 0;
	for (int i = 0; i < np; i++) {
		void *kv = e->seqs[pc[i].seq].kv;
		int64_t r = pc[i].row;
		float *out = e->att + r * qd;
		const float *q = e->q + r * qd;
		int ret = (P->layer_begin ? P->layer_begin(kv, l) : 0)
		       ?: P->append(kv, l, e->k + r * kvd, e->v + r * kvd, pc[i].n);
		if (!ret && !batch)
			ret = P->attend(kv, l, out, q, pc[i].n);
		else if (!ret && (ret = P->attend_prepare(kv, l, out, q, pc[i].n,
							  &e->att_items[nb])) == 0) {
			e->att_items[nb].row = r;
			e->att_piece[nb++] = i;
			continue;
		}
		ret = ret < 0 ? ret : P->layer_end ? P->layer_end(kv, l) : 0;
		if (ret)
			return ret;
	}
	if (!nb)
		return 0;
	const uint64_t t0 = clock_ns();
	int ret = o->attn_decode_batch(e->be->ctx, e->att, e->q, e->att_items, nb);
	const int64_t share = (int64_t)(clock_ns() - t0) / nb;
	for (int j = 0; j < nb && !ret; j++) {
		const struct piece *p = &pc[e->att_piece[j]];
		void *kv = e->seqs[p->seq].kv;
		ret = P->attend_finish(kv, l, e->q + p->row * qd, share)
		   ?: (P->layer_end ? P->layer_end(kv, l) : 0);
	}
	return ret;
}

/* y (T, n_parts stacked) = x . fused weight w, parts[i] (T, w's rows of part i): one row
 * straight into them (a token's fused row is exactly the parts back to back there), several
 * through e->fz and split_cols; without fused weights, a GEMM per part over its view. */
static int fused_matmul(struct engine *e, const struct backend_mat *w,
			const struct backend_mat *const *views, float *const *parts, int n_parts,
			const float *x, int64_t T)
{
	const struct backend_ops *o = e->be->ops;
	void *c = e->be->ctx;
	if (w->data && T == 1)
		return o->matmul(c, parts[0], x, w, T);
	if (w->data && e->fz) {
		int64_t cols[3];
		for (int i = 0; i < n_parts; i++)
			cols[i] = views[i]->rows;
		return o->matmul(c, e->fz, x, w, T)
		    ?: o->split_cols(c, parts, cols, n_parts, e->fz, T);
	}
	for (int i = 0; i < n_parts; i++) {
		int ret = o->matmul(c, parts[i], x, views[i], T);
		if (ret)
			return ret;
	}
	return 0;
}

/* The rest of layer L past attention, on T rows: x += att . wo, then x += ffn(norm(x)). */
static int layer_tail(struct engine *e, const struct engine_layer *L, float *x, const float *att,
		      int64_t T)
{
	const struct backend_ops *o = e->be->ops;
	void *c = e->be->ctx;
	const struct fkv_model_config *cf = &e->cfg;
	int64_t dim = cf->dim, ffn = cf->ffn_dim;
	float *gate = e->gu, *up = e->gu + T * ffn;
	return o->matmul(c, e->xb, att, &L->wo, T)
	    ?: o->add(c, x, e->xb, T * dim)
	    ?: o->rmsnorm(c, e->xb, x, &L->ffn_norm, T, dim, cf->norm_eps)
	    ?: fused_matmul(e, &L->wgu, (const struct backend_mat *const[]){ &L->w_gate, &L->w_up },
			    (float *const[]){ gate, up }, 2, e->xb, T)
	    ?: o->silu_mul(c, gate, gate, up, T * ffn)
	    ?: o->matmul(c, e->xb, gate, &L->w_down, T)
	    ?: o->add(c, x, e->xb, T * dim);
}

/* The logits of the n_out final residual rows gathered in e->xo, into e->logits. */
static int logits(struct engine *e, int64_t n_out)
{
	const struct backend_ops *o = e->be->ops;
	void *c = e->be->ctx;
	return o->rmsnorm(c, e->xo, e->xo, &e->out_norm, n_out, e->cfg.dim, e->cfg.norm_eps)
	    ?: o->matmul(c, e->logits, e->xo, &e->output, n_out)
	    ?: (o->sync ? o->sync(c) : 0);
}

/* Layer L up to attention, on T rows: q, k, v = norm(x) . wqkv (+ bias), RoPE on q and k. */
static int layer_head(struct engine *e, const struct engine_layer *L, int64_t T)
{
	const struct backend_ops *o = e->be->ops;
	void *c = e->be->ctx;
	const struct fkv_model_config *cf = &e->cfg;
	int ret = o->rmsnorm(c, e->xb, e->x, &L->attn_norm, T, cf->dim, cf->norm_eps)
	       ?: fused_matmul(e, &L->wqkv,
			       (const struct backend_mat *const[]){ &L->wq, &L->wk, &L->wv },
			       (float *const[]){ e->q, e->k, e->v }, 3, e->xb, T);
	if (!ret && L->has_bias)
		ret = o->add_bias(c, e->q, &L->bq, T) ?: o->add_bias(c, e->k, &L->bk, T)
		   ?: o->add_bias(c, e->v, &L->bv, T);
	return ret ?: o->rope(c, e->q, T, cf->n_heads, cf->head_dim, e->pos_b, &e->rope)
		   ?: o->rope(c, e->k, T, cf->n_kv_heads, cf->head_dim, e->pos_b, &e->rope);
}

/* Segment s of a decode step of T rows, each of whose logits is wanted: the device work
 * between two attentions, none of it reading the host. 0: the embedding and layer 0's head;
 * s in [1, n_layers): layer s-1's tail and layer s's head; n_layers: the last layer's tail
 * and the logits (no sync). */
struct segment {
	struct engine *e;
	int s;
	int64_t T;
};

static int graph_segment(void *arg)
{
	const struct segment *g = arg;
	struct engine *e = g->e;
	const struct backend_ops *o = e->be->ops;
	void *c = e->be->ctx;
	const int L = e->cfg.n_layers;
	int ret = g->s ? layer_tail(e, &e->layers[g->s - 1], e->x, e->att, g->T)
		       : o->embed(c, e->x, &e->tok_embd, e->ids_b, g->T);
	if (ret || g->s < L)
		return ret ?: layer_head(e, &e->layers[g->s], g->T);
	return o->gather_rows(c, e->xo, e->x, e->cfg.dim, e->rows_b, g->T)
	    ?: o->rmsnorm(c, e->xo, e->xo, &e->out_norm, g->T, e->cfg.dim, e->cfg.norm_eps)
	    ?: o->matmul(c, e->logits, e->xo, &e->output, g->T);
}

/* A decode step through graphs: segment by segment, attention between them as plain ops. The
 * first step of a shape runs plain (its workspaces grow then); later ones launch each segment's
 * graph, recorded at first use and again when a buffer it holds moved. */
static int run_step_graphs(struct engine *e, int64_t T, const struct piece *pc, int np)
{
	const struct backend_ops *o = e->be->ops;
	void *c = e->be->ctx;
	const int L = e->cfg.n_layers;
	if (T != e->graph_T || e->buf_gen != e->graph_gen) {
		free_graphs(e);
		e->graph_T = T;
		e->graph_gen = e->buf_gen;
	}
	int ret = 0;
	for (int s = 0; s <= L && !ret; s++) {
		struct segment g = { e, s, T };
		if (!e->graph_warm) {
			ret = graph_segment(&g);
		} else {
			int r = o->graph_run(c, &e->graphs[s], graph_segment, &g);
			if (r < 0)
				ret = r;
			else if (r == 1)
				e->gst.plain++;
			else
				e->gst.launched++, e->gst.recorded += r == 2;
		}
		if (!ret && s < L)
			ret = layer_attention(e, s, pc, np);
	}
	if (ret)
		return ret;
	e->graph_warm = true;
	return o->sync ? o->sync(c) : 0;
}

/* Runs one ubatch of T tokens (ids, positions and out_rows filled in on the host) through
 * every layer, then the logits of the n_out rows listed in out_rows into e->logits. */
static int run_ubatch(struct engine *e, int64_t T, const struct piece *pc, int np, int64_t n_out)
{
	const struct backend_ops *o = e->be->ops;
	void *c = e->be->ctx;
	const struct fkv_model_config *cf = &e->cfg;
	int64_t dim = cf->dim;
	int64_t qd = (int64_t)cf->n_heads * cf->head_dim;
	int64_t kvd = (int64_t)cf->n_kv_heads * cf->head_dim;
	size_t i4 = sizeof(int32_t);
	e->q = e->qkv;
	e->k = e->q + T * qd;
	e->v = e->k + T * kvd;
	int ret = o->upload(c, e->ids_b, e->ids, (size_t)T * i4)
	       ?: o->upload(c, e->pos_b, e->pos, (size_t)T * i4)
	       ?: (n_out ? o->upload(c, e->rows_b, e->out_rows, (size_t)n_out * i4) : 0);
	/* A decode step (a row per piece, every row's logits wanted) goes through graphs. */
	if (!ret && e->graphs && np == T && n_out == T)
		return run_step_graphs(e, T, pc, np);
	ret = ret ?: o->embed(c, e->x, &e->tok_embd, e->ids_b, T);
	for (int l = 0; l < cf->n_layers && !ret; l++) {
		const struct engine_layer *L = &e->layers[l];
		ret = layer_head(e, L, T) ?: layer_attention(e, l, pc, np);
		if (ret || l < cf->n_layers - 1 || n_out == T) {
			ret = ret ?: layer_tail(e, L, e->x, e->att, T);
			continue;
		}
		/* The last layer's K and V are in the cache now; past them only the n_out rows
		 * whose logits were asked for matter (none in a ubatch that only fills the
		 * cache): their residual and attention rows are gathered (the latter into q,
		 * free now) and the rest of the layer runs on them alone. */
		if (!n_out)
			return 0;
		ret = o->gather_rows(c, e->xo, e->x, dim, e->rows_b, n_out)
		   ?: o->gather_rows(c, e->q, e->att, qd, e->rows_b, n_out)
		   ?: layer_tail(e, L, e->xo, e->q, n_out);
		if (ret)
			return ret;
		return logits(e, n_out);
	}
	if (ret || !n_out)
		return ret;
	ret = o->gather_rows(c, e->xo, e->x, dim, e->rows_b, n_out);
	return ret ?: logits(e, n_out);
}

/* Checks the whole request before anything runs, so a refused call changes nothing. */
static int check_items(struct engine *e, int n_items, const int *seqs,
		       const int32_t *const *ids, const int *n, char *err, size_t errlen)
{
	if (n_items <= 0)
		return errmsg(err, errlen, -EINVAL, "no sequences given");
	for (int i = 0; i < n_items; i++) {
		if (!seq_ok(e, seqs[i]))
			return errmsg(err, errlen, -EINVAL, "sequence %d does not exist", seqs[i]);
		for (int j = 0; j < i; j++)
			if (seqs[j] == seqs[i])
				return errmsg(err, errlen, -EINVAL, "sequence %d given twice", seqs[i]);
		if (n[i] <= 0)
			return errmsg(err, errlen, -EINVAL, "sequence %d: no tokens given", seqs[i]);
		int64_t len = e->policy->length(e->seqs[seqs[i]].kv);
		if (len + n[i] > e->max_ctx)
			return errmsg(err, errlen, -ENOSPC,
				      "sequence %d: %lld + %d tokens exceed the context limit of %lld",
				      seqs[i], (long long)len, n[i], (long long)e->max_ctx);
		for (int t = 0; t < n[i]; t++)
			if (ids[i][t] < 0 || ids[i][t] >= e->cfg.vocab_size)
				return errmsg(err, errlen, -EINVAL,
					      "sequence %d: token id %d out of range [0, %d)", seqs[i],
					      ids[i][t], e->cfg.vocab_size);
	}
	return 0;
}

/* After a ubatch: each piece's tokens are part of its sequence; tell the host copy. The KV
 * policies' write-through may still be in flight on the backend (store_rows lands after a
 * fence), so one sync precedes the first COMMIT of the ubatch. */
static int commit_pieces(struct engine *e, const struct piece *pc, int np,
			 const struct fwd_item *it, char *err, size_t errlen)
{
	bool fenced = !e->be->ops->sync;
	for (int i = 0; i < np; i++) {
		struct engine_seq *s = &e->seqs[pc[i].seq];
		if (!s->host || !pc[i].keep) /* a pre-step keeps nothing */
			continue;
		int ret;
		if (!fenced && (ret = e->be->ops->sync(e->be->ctx)))
			return errmsg(err, errlen, ret, "backend sync before COMMIT: %s",
				      strerror(-ret));
		fenced = true;
		int64_t len = e->policy->length(s->kv);
		char why[256];
		ret = hostkv_commit(s->host, len, it[pc[i].item].ids + pc[i].off, len - pc[i].keep,
				    pc[i].keep, why, sizeof why);
		if (ret)
			return errmsg(err, errlen, ret, "sequence %d: commit to the host copy: %s",
				      pc[i].seq, why);
	}
	return 0;
}

/* Downloads the logits rows of the pieces, merging pieces whose destinations follow each other
 * into one copy (a plain engine_forward call: one copy per ubatch). */
static int download_logits(struct engine *e, const struct piece *pc, int np)
{
	const size_t V = (size_t)e->cfg.vocab_size;
	int64_t row = 0; /* the run's first row in e->logits */
	for (int i = 0; i < np;) {
		if (!pc[i].n_out) {
			i++;
			continue;
		}
		int64_t rows = pc[i].n_out;
		int j = i + 1;
		for (; j < np && pc[j].n_out && pc[j].out == pc[i].out + (size_t)rows * V; j++)
			rows += pc[j].n_out;
		int ret = e->be->ops->download(e->be->ctx, pc[i].out, e->logits + (size_t)row * V,
					       (size_t)rows * V * sizeof(float));
		if (ret)
			return ret;
		row += rows;
		i = j;
	}
	return 0;
}

/* Runs the items through the model in ubatches: consecutive items, the last one of a ubatch
 * possibly cut (never an item with speculative rows: its rows see each other). Each piece's
 * tokens are committed after its ubatch. */
static int forward_items(struct engine *e, int n_items, const struct fwd_item *it, char *err,
			 size_t errlen)
{
	const size_t V = (size_t)e->cfg.vocab_size;
	int item = 0, ret;
	int64_t off = 0; /* cursor: row off of item */
	int64_t total = 0, done = 0;
	for (int i = 0; e->progress && i < n_items; i++)
		total += it[i].n;
	while (item < n_items) {
		int64_t T = 0, n_out = 0;
		int np = 0;
		while (item < n_items && T < e->ubatch) {
			const struct fwd_item *x = &it[item];
			const bool whole = x->keep < x->n;
			int64_t take = x->n - off;
			if (take > e->ubatch - T) {
				if (whole)
					break;
				take = e->ubatch - T;
			}
			const bool last = off + take == x->n;
			const int64_t lg = !x->out ? 0 : x->all ? take : last;
			if (n_out + lg > e->logit_rows && (ret = alloc_logits(e, n_out + lg)))
				return errmsg(err, errlen, ret, "out of memory for logits");
			struct piece *p = &e->pieces[np++];
			*p = (struct piece){ .seq = x->seq, .item = item, .off = off, .n = take,
					     .keep = whole ? x->keep : take, .row = T,
					     .out = lg ? x->out + (x->all ? (size_t)off * V : 0) : NULL,
					     .n_out = lg };
			int64_t len = e->policy->length(e->seqs[p->seq].kv);
			for (int64_t t = 0; t < take; t++) {
				e->ids[T + t] = x->ids[off + t];
				e->pos[T + t] = (int32_t)(len + t);
				if (x->out && (x->all || (last && t == take - 1)))
					e->out_rows[n_out++] = (int32_t)(T + t);
			}
			T += take;
			off += take;
			if (off == x->n) {
				item++;
				off = 0;
			}
		}
		if (!np)
			return errmsg(err, errlen, -EINVAL, "a step of %d rows does not fit a ubatch of "
				      "%d", it[item].n, e->ubatch);
		for (int i = 0; i < np; i++) {
			const struct piece *p = &e->pieces[i];
			void *kv = e->seqs[p->seq].kv;
			ret = p->keep < p->n ? e->policy->step_begin_keep(kv, p->n, p->keep)
					     : e->policy->step_begin(kv, p->n);
			if (ret)
				return errmsg(err, errlen, ret, "sequence %d: KV policy %s refused %lld tokens: %s",
					      p->seq, e->policy->name, (long long)p->n, strerror(-ret));
		}
		ret = run_ubatch(e, T, e->pieces, np, n_out);
		if (ret)
			return errmsg(err, errlen, ret, "forward pass failed: %s", strerror(-ret));
		for (int i = 0; i < np; i++)
			e->policy->step_end(e->seqs[e->pieces[i].seq].kv);
		if ((ret = commit_pieces(e, e->pieces, np, it, err, errlen)))
			return ret;
		if ((ret = download_logits(e, e->pieces, np)))
			return errmsg(err, errlen, ret, "cannot read logits: %s", strerror(-ret));
		done += T;
		if (e->progress)
			e->progress(e->progress_ctx, done, total);
	}
	return 0;
}

static int32_t argmax_row(const float *x, int n)
{
	int32_t b = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* A forward call under a policy with a speculative row (docs/design.md §5 `specache`). Per
 * item: every token but the last is prefilled (dense); the last is a decode step of two rows —
 * the token and the speculative token, the argmax of the previous step's speculative row —
 * preceded by a one-row pre-step that yields the speculative token (its argmax) and the rows
 * to fetch when the sequence has no previous step to take them from (after a prefill, a
 * resume, or any call of several tokens). The step's first row gives the item's logits; the
 * argmax of its second is the next step's speculative token. Each phase batches every item. */
static int forward_spec(struct engine *e, int n_items, const int *seqs,
			const int32_t *const *ids, const int *n, float *logits, bool all_logits,
			char *err, size_t errlen)
{
	const int V = e->cfg.vocab_size;
	struct fwd_item *it = e->items;
	int m = 0, ret = 0;
	int64_t base = 0; /* the item's first logits row (all_logits) */
	/* Dense prefixes. */
	for (int i = 0; i < n_items; i++) {
		if (n[i] > 1)
			it[m++] = (struct fwd_item){
				.seq = seqs[i], .ids = ids[i], .n = n[i] - 1, .keep = n[i] - 1,
				.all = true,
				.out = logits && all_logits ? logits + (size_t)base * V : NULL,
			};
		base += n[i];
		struct engine_seq *s = &e->seqs[seqs[i]];
		/* The next real token is what the last speculative row guessed, or not. */
		if (s->spec_ready) {
			s->spec.checked++;
			s->spec.hits += ids[i][0] == s->spec_ran;
		}
		if (n[i] > 1)
			s->spec_ready = false;
	}
	if (m && (ret = forward_items(e, m, it, err, errlen)))
		goto fail;
	/* Pre-steps. */
	m = 0;
	for (int i = 0; i < n_items; i++) {
		if (e->seqs[seqs[i]].spec_ready)
			continue;
		it[m] = (struct fwd_item){ .seq = seqs[i], .ids = &ids[i][n[i] - 1], .n = 1,
					   .keep = 0, .all = true, .out = e->spec_lg + (size_t)m * V };
		m++;
	}
	if (m && (ret = forward_items(e, m, it, err, errlen)))
		goto fail;
	for (int i = 0, j = 0; i < n_items; i++) {
		struct engine_seq *s = &e->seqs[seqs[i]];
		if (!s->spec_ready)
			s->spec_next = argmax_row(e->spec_lg + (size_t)j++ * V, V);
	}
	/* The two-row steps. */
	for (int i = 0; i < n_items; i++) {
		int32_t *tk = e->spec_toks + 2 * i;
		tk[0] = ids[i][n[i] - 1];
		tk[1] = e->seqs[seqs[i]].spec_next;
		it[i] = (struct fwd_item){ .seq = seqs[i], .ids = tk, .n = 2, .keep = 1, .all = true,
					   .out = e->spec_lg + (size_t)i * 2 * V };
	}
	if ((ret = forward_items(e, n_items, it, err, errlen)))
		goto fail;
	base = 0;
	for (int i = 0; i < n_items; i++) {
		struct engine_seq *s = &e->seqs[seqs[i]];
		const float *lg = e->spec_lg + (size_t)i * 2 * V;
		base += n[i];
		if (logits)
			memcpy(logits + (size_t)(all_logits ? base - 1 : i) * V, lg, (size_t)V * 4);
		s->spec_ran = e->spec_toks[2 * i + 1];
		s->spec_next = argmax_row(lg + V, V);
		s->spec_ready = true;
	}
	return 0;
fail:
	/* The next call starts over with a pre-step. */
	for (int i = 0; i < n_items; i++)
		e->seqs[seqs[i]].spec_ready = false;
	return ret;
}

int engine_forward(struct engine *e, int n_items, const int *seqs, const int32_t *const *ids,
		   const int *n, float *logits, bool all_logits, char *err, size_t errlen)
{
	int ret = check_items(e, n_items, seqs, ids, n, err, errlen);
	if (ret)
		return ret;
	if (e->policy->spec_rows)
		return forward_spec(e, n_items, seqs, ids, n, logits, all_logits, err, errlen);
	struct fwd_item *it = e->items; /* n_items <= max_seqs: check_items */
	const size_t V = (size_t)e->cfg.vocab_size;
	size_t row = 0;
	for (int i = 0; i < n_items; i++) {
		it[i] = (struct fwd_item){ .seq = seqs[i], .ids = ids[i], .n = n[i], .keep = n[i],
					   .all = all_logits,
					   .out = logits ? logits + row * V : NULL };
		row += all_logits ? (size_t)n[i] : 1;
	}
	return forward_items(e, n_items, it, err, errlen);
}

int engine_prefill(struct engine *e, int seq, const int32_t *ids, int n, float *logits,
		   bool all_logits, char *err, size_t errlen)
{
	return engine_forward(e, 1, &seq, &ids, &n, logits, all_logits, err, errlen);
}

int engine_decode(struct engine *e, int n, const int *seqs, const int32_t *tokens, float *logits,
		  char *err, size_t errlen)
{
	if (n <= 0 || n > e->max_seqs)
		return errmsg(err, errlen, -EINVAL, "decode batch of %d sequences (1..%d allowed)", n,
			      e->max_seqs);
	const int32_t *ptrs[n];
	int ones[n];
	for (int i = 0; i < n; i++) {
		ptrs[i] = tokens + i;
		ones[i] = 1;
	}
	return engine_forward(e, n, seqs, ptrs, ones, logits, false, err, errlen);
}
