/* policy_opts — the retrieval flags shared by every kvworker command (policy_opts.h). The flags
 * are one table (name, kind, field, bounds); parsing, usage and "given on the command line"
 * bookkeeping all read it. */
#include "policy_opts.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* POPT_PROB: a number in (0, 1] */
enum popt_kind { POPT_POLICY, POPT_INT, POPT_FLOAT, POPT_BOOL, POPT_PROB };

struct popt {
	const char *flag;
	enum popt_kind kind;
	size_t off;	/* of the value in struct policy_opts */
	ptrdiff_t set;	/* offset of its set_* marker, or -1 */
	double lo, hi;
};

#define KV(f) offsetof(struct policy_opts, kv.f)
#define SET(f) (ptrdiff_t)offsetof(struct policy_opts, f)

static const struct popt popts[] = {
	/* first: its getopt_long val is POLICY_OPT_POLICY (policy_opts.h) */
	{ "--policy", POPT_POLICY, offsetof(struct policy_opts, policy), -1, 0, 0 },
	{ "--page-size", POPT_INT, KV(page), SET(set_page), 1, 1 << 16 },
	{ "--budget", POPT_INT, KV(budget), SET(set_budget), 1, 1 << 30 },
	{ "--sink", POPT_INT, KV(sink), SET(set_sink), 0, 1 << 30 },
	{ "--window", POPT_INT, KV(window), SET(set_window), 1, 1 << 30 },
	{ "--full-layers", POPT_INT, KV(full_layers), -1, 0, 1 << 16 },
	{ "--tau", POPT_FLOAT, KV(tau), -1, 0.0, 1e6 },
	{ "--debug-invariants", POPT_BOOL, KV(debug_invariants), -1, 0, 0 },
	/* not --top-p: generate, resume, serve and the client take that as the sampler's */
	{ "--kv-top-p", POPT_PROB, KV(top_p), -1, 0.0, 1.0 },
	{ "--recalibrate", POPT_INT, KV(recalibrate), -1, 1, 1 << 30 },
	{ "--refresh-stride", POPT_INT, KV(refresh_stride), -1, 1, 1 << 20 },
	{ "--refresh-threshold", POPT_FLOAT, KV(refresh_threshold), -1, -1.0, 2.0 },
	{ "--kv-bits", POPT_INT, KV(kv_bits), -1, 1, 2 },
	{ "--spec-topk", POPT_INT, KV(spec_topk), -1, 1, 1 << 24 },
	{ "--no-speculation", POPT_BOOL, KV(no_speculation), -1, 0, 0 },
	{ "--recall-fragmented", POPT_BOOL, KV(recall_fragmented), -1, 0, 0 },
	{ "--recall-single-buffer", POPT_BOOL, KV(recall_single_buffer), -1, 0, 0 },
};

void policy_opts_default(struct policy_opts *o)
{
	memset(o, 0, sizeof *o);
	strcpy(o->policy, "freekv"); /* the point of the project; --policy full for dense attention */
	o->kv = (struct kv_policy_opts){
		.page = 32, .budget = 2048, .sink = 512, .window = 512, .full_layers = 1,
		.tau = 0.9f, .debug_invariants = false,
		.refresh_stride = 5, .refresh_threshold = 0.85f, .kv_bits = 2, .spec_topk = 64,
	};
}

static int perr(char *err, size_t errlen, const char *flag, const char *val, const char *why)
{
	snprintf(err, errlen, "%s: bad value '%s' (%s)", flag, val ? val : "", why);
	return -EINVAL;
}

/* Stores val into the field of p; -EINVAL with a message when it does not parse or fit. */
static int popt_set(struct policy_opts *o, const struct popt *p, const char *val, char *err,
		    size_t errlen)
{
	char *end = NULL;
	void *field = (char *)o + p->off;
	switch (p->kind) {
	case POPT_POLICY:
		if (!kvcache_policy(val) || strlen(val) >= sizeof o->policy)
			return snprintf(err, errlen, "--policy: unknown policy '%s' (known: %s)", val,
					kvcache_policy_names()), -EINVAL;
		strcpy(o->policy, val);
		break;
	case POPT_INT: {
		errno = 0;
		long v = strtol(val, &end, 10);
		if (errno || end == val || *end || v < (long)p->lo || v > (long)p->hi) {
			char why[80];
			snprintf(why, sizeof why, "expected a whole number from %ld to %ld",
				 (long)p->lo, (long)p->hi);
			return perr(err, errlen, p->flag, val, why);
		}
		*(int *)field = (int)v;
		break;
	}
	case POPT_FLOAT:
	case POPT_PROB: {
		errno = 0;
		double v = strtod(val, &end);
		bool prob = p->kind == POPT_PROB;
		if (errno || end == val || *end || !isfinite(v) || v < p->lo || v > p->hi ||
		    (prob && !((float)v > 0.0f))) {
			char why[80] = "expected a number in (0, 1]";
			if (!prob)
				snprintf(why, sizeof why, "expected a number from %g to %g", p->lo,
					 p->hi);
			return perr(err, errlen, p->flag, val, why);
		}
		*(float *)field = (float)v;
		break;
	}
	case POPT_BOOL:
		*(bool *)field = true;
		break;
	}
	if (p->set >= 0)
		*(bool *)((char *)o + p->set) = true;
	return 0;
}

int policy_opts_parse_flag(struct policy_opts *o, int argc, char **argv, int *i, char *err,
			   size_t errlen)
{
	const char *a = argv[*i];
	for (size_t n = 0; n < sizeof popts / sizeof *popts; n++) {
		const struct popt *p = &popts[n];
		size_t fl = strlen(p->flag);
		if (strncmp(a, p->flag, fl) || (a[fl] && a[fl] != '='))
			continue;
		if (p->kind == POPT_BOOL) {
			if (a[fl])
				return perr(err, errlen, p->flag, a + fl + 1, "takes no value");
			int ret = popt_set(o, p, NULL, err, errlen);
			return ret ? ret : 1;
		}
		const char *val;
		if (a[fl]) {
			val = a + fl + 1;
		} else {
			if (*i + 1 >= argc)
				return snprintf(err, errlen, "%s needs a value", p->flag), -EINVAL;
			val = argv[++*i];
		}
		int ret = popt_set(o, p, val, err, errlen);
		return ret ? ret : 1;
	}
	return 0;
}

size_t policy_opts_options(struct option *out, size_t max)
{
	size_t n = 0;
	for (size_t k = 0; k < sizeof popts / sizeof *popts && n < max; k++)
		out[n++] = (struct option){ popts[k].flag + 2,
					    popts[k].kind == POPT_BOOL ? no_argument : required_argument,
					    NULL, POLICY_OPT_BASE + (int)k };
	return n;
}

int policy_opts_apply(struct policy_opts *o, int val, const char *arg, char *err, size_t errlen)
{
	if (val < POLICY_OPT_BASE || val >= POLICY_OPT_BASE + (int)(sizeof popts / sizeof *popts))
		return 0;
	int ret = popt_set(o, &popts[val - POLICY_OPT_BASE], arg, err, errlen);
	return ret ? ret : 1;
}

static int pow2_floor(int x)
{
	int b = 1;
	while (b <= x / 2)
		b *= 2;
	return b;
}

static int imax(int a, int b)
{
	return a > b ? a : b;
}

int policy_opts_check_model(const struct policy_opts *o, int n_layers, char *err, size_t errlen)
{
	if (o->kv.full_layers > n_layers)
		return snprintf(err, errlen, "--full-layers %d: the model has %d layers",
				o->kv.full_layers, n_layers), -EINVAL;
	return 0;
}

int policy_opts_finalize(struct policy_opts *o, int ctx_len, FILE *notice, char *err,
			 size_t errlen)
{
	struct kv_policy_opts *k = &o->kv;
	if (ctx_len <= 0)
		return snprintf(err, errlen, "model context %d is not positive", ctx_len), -EINVAL;
	bool all_set = o->set_page && o->set_budget && o->set_sink && o->set_window;
	/* A budget given alone derives the rest too when the defaults do not fit in it. */
	bool misfit = o->set_budget && (long)k->sink + k->window + k->page > k->budget;
	if (!all_set && (ctx_len < 4 * (long)k->budget || misfit)) {
		struct kv_policy_opts was = *k;
		if (!o->set_budget)
			k->budget = imax(16, pow2_floor(ctx_len / 8));
		if (!o->set_page)
			k->page = imax(4, k->budget / 8);
		if (!o->set_sink)
			k->sink = imax(k->page, k->budget / 8);
		if (!o->set_window)
			k->window = imax(k->page, k->budget / 4);
		/* Said only when the user gave some of the four: scaling the defaults alone is what
		 * --help promises, and a note on every run would be noise. */
		bool some_set = o->set_page || o->set_budget || o->set_sink || o->set_window;
		if (notice && some_set && memcmp(&was, k, sizeof was))
			fprintf(notice,
				"note: retrieval settings scaled to the model's %d-token context: "
				"page %d, budget %d, sink %d, window %d (were %d/%d/%d/%d)\n",
				ctx_len, k->page, k->budget, k->sink, k->window, was.page, was.budget,
				was.sink, was.window);
	}
	int p = k->page;
	if (!strcmp(o->policy, "refreshkv")) {
		/* refreshkv's budget is a token count per KV head, not pages: only the host copy's
		 * page size and the budget's floor apply (docs/design.md §5). */
		if (p <= 0 || k->budget < 8)
			return snprintf(err, errlen, "--budget %d: refreshkv needs a partial cache of "
					"at least 8 tokens", k->budget), -EINVAL;
	} else if (!strcmp(o->policy, "specache")) {
		/* specache keeps no budget: its window is the residual, and only it must fit
		 * pages. */
		if (p <= 0 || k->window % p || k->window < p)
			return snprintf(err, errlen, "window %d must be a positive multiple of the "
					"page size %d", k->window, p), -EINVAL;
	} else if (p <= 0 || k->budget % p || k->sink % p || k->window % p) {
		bool derived = !o->set_budget || !o->set_sink || !o->set_window;
		return snprintf(err, errlen,
				"budget %d, sink %d and window %d must be multiples of the page size %d%s",
				k->budget, k->sink, k->window, p, derived ?
				" (those not given were derived from the defaults and the model's "
				"context: give them too, or a page size that divides them)" : ""),
		       -EINVAL;
	} else if (k->window < p) {
		return snprintf(err, errlen, "window %d must hold at least one page (%d)", k->window,
				p), -EINVAL;
	} else if ((long)k->budget < (long)k->sink + k->window + p) {
		return snprintf(err, errlen,
				"budget %d must be at least sink %d + window %d + one page %d",
				k->budget, k->sink, k->window, p), -EINVAL;
	}
	if (k->full_layers < 0 || !(k->tau >= 0.0f))
		return snprintf(err, errlen, "full layers and tau must be >= 0"), -EINVAL;
	/* 0 is "not given" (the policy's default); the flags refuse 0 themselves */
	if (!(k->top_p >= 0.0f && k->top_p <= 1.0f))
		return snprintf(err, errlen, "kv-top-p %g must be in (0, 1]", (double)k->top_p),
		       -EINVAL;
	if (k->recalibrate < 0)
		return snprintf(err, errlen, "recalibrate %d must be >= 1", k->recalibrate),
		       -EINVAL;
	return 0;
}

const char *policy_opts_usage(void)
{
	return "[--policy full|streaming|quest|freekv|hardkv|refreshkv|specache] [--page-size N] "
	       "[--budget N] [--sink N] [--window N] [--tau F] [--full-layers N] "
	       "[--debug-invariants] [--kv-top-p P] [--recalibrate R] [--refresh-stride Q] "
	       "[--refresh-threshold S] [--kv-bits 2|1] [--spec-topk K] [--no-speculation] "
	       "[--recall-fragmented] [--recall-single-buffer]";
}

int kvcache_resolve_opts(struct kv_policy_opts *o, int64_t max_tokens)
{
	if (o->page || o->budget || o->sink || o->window) {
		struct policy_opts po = { .kv = *o, .set_page = true, .set_budget = true,
					  .set_sink = true, .set_window = true };
		char err[160];
		return policy_opts_finalize(&po, max_tokens > INT_MAX ? INT_MAX : (int)max_tokens,
					    NULL, err, sizeof err);
	}
	struct policy_opts po;
	policy_opts_default(&po);
	po.kv.top_p = o->top_p; /* checked here too */
	po.kv.recalibrate = o->recalibrate;
	char err[160];
	int ret = policy_opts_finalize(&po, max_tokens > INT_MAX ? INT_MAX : (int)max_tokens, NULL,
				       err, sizeof err);
	if (ret)
		return ret;
	o->page = po.kv.page;
	o->budget = po.kv.budget;
	o->sink = po.kv.sink;
	o->window = po.kv.window;
	return 0;
}
