/* prom — see prom.h. Format: https://prometheus.io/docs/instrumenting/exposition_formats/ */
#include "prom.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double prom_latency_buckets[] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
					0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60 };
const int prom_n_latency_buckets = sizeof prom_latency_buckets / sizeof *prom_latency_buckets;

void prom_buf_init(struct prom_buf *b)
{
	*b = (struct prom_buf){ 0 };
}

void prom_buf_free(struct prom_buf *b)
{
	free(b->p);
	*b = (struct prom_buf){ 0 };
}

static void vappend(struct prom_buf *b, const char *fmt, va_list ap)
{
	if (b->err)
		return;
	for (;;) {
		va_list cp;
		va_copy(cp, ap);
		size_t room = b->cap - b->len;
		int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, cp);
		va_end(cp);
		if (n < 0) {
			b->err = -EINVAL;
			return;
		}
		if ((size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = b->cap ? b->cap * 2 : 4096;
		while (cap - b->len <= (size_t)n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->err = -ENOMEM;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
}

void prom_printf(struct prom_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vappend(b, fmt, ap);
	va_end(ap);
}

/* Escapes backslash and newline (HELP) and also double quotes (label values). */
static void escaped(struct prom_buf *b, const char *s, int quote)
{
	for (; *s; s++) {
		if (*s == '\\')
			prom_printf(b, "\\\\");
		else if (*s == '\n')
			prom_printf(b, "\\n");
		else if (quote && *s == '"')
			prom_printf(b, "\\\"");
		else
			prom_printf(b, "%c", *s);
	}
}

void prom_family(struct prom_buf *b, const char *name, const char *type, const char *help)
{
	prom_printf(b, "# HELP %s ", name);
	escaped(b, help, 0);
	prom_printf(b, "\n# TYPE %s %s\n", name, type);
}

/* The shortest of %.15g..%.17g that reads back as v. */
static void shortest(char *out, size_t n, double v)
{
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(out, n, "%.*g", prec, v);
		if (strtod(out, NULL) == v)
			return;
	}
}

static void value(struct prom_buf *b, double v)
{
	char s[64];
	if (isnan(v))
		prom_printf(b, "NaN");
	else if (isinf(v))
		prom_printf(b, v > 0 ? "+Inf" : "-Inf");
	else if (v == floor(v) && fabs(v) < 1e15)
		prom_printf(b, "%.0f", v);
	else {
		shortest(s, sizeof s, v);
		prom_printf(b, "%s", s);
	}
}

static void labels_out(struct prom_buf *b, const struct prom_label *l, int n, const char *le)
{
	if (!n && !le)
		return;
	prom_printf(b, "{");
	for (int i = 0; i < n; i++) {
		prom_printf(b, "%s%s=\"", i ? "," : "", l[i].name);
		escaped(b, l[i].value ? l[i].value : "", 1);
		prom_printf(b, "\"");
	}
	if (le)
		prom_printf(b, "%sle=\"%s\"", n ? "," : "", le);
	prom_printf(b, "}");
}

void prom_sample(struct prom_buf *b, const char *name, const struct prom_label *labels,
		 int n_labels, double v)
{
	prom_printf(b, "%s", name);
	labels_out(b, labels, n_labels, NULL);
	prom_printf(b, " ");
	value(b, v);
	prom_printf(b, "\n");
}

void prom_one(struct prom_buf *b, const char *name, const char *type, const char *help, double v)
{
	prom_family(b, name, type, help);
	prom_sample(b, name, NULL, 0, v);
}

int prom_hist_init(struct prom_hist *h, const double *bounds, int n)
{
	memset(h, 0, sizeof *h);
	if (n < 1)
		return -EINVAL;
	for (int i = 1; i < n; i++)
		if (!(bounds[i] > bounds[i - 1]))
			return -EINVAL;
	h->bounds = malloc((size_t)n * sizeof *h->bounds);
	h->counts = calloc((size_t)n + 1, sizeof *h->counts);
	if (!h->bounds || !h->counts) {
		free(h->bounds);
		free(h->counts);
		memset(h, 0, sizeof *h);
		return -ENOMEM;
	}
	memcpy(h->bounds, bounds, (size_t)n * sizeof *bounds);
	h->n = n;
	pthread_mutex_init(&h->mu, NULL);
	return 0;
}

void prom_hist_free(struct prom_hist *h)
{
	if (!h->bounds)
		return;
	pthread_mutex_destroy(&h->mu);
	free(h->bounds);
	free(h->counts);
	memset(h, 0, sizeof *h);
}

void prom_hist_observe(struct prom_hist *h, double v)
{
	if (!h->bounds || isnan(v))
		return;
	int i = 0;
	while (i < h->n && v > h->bounds[i]) /* le: a value equal to a bound falls in it */
		i++;
	pthread_mutex_lock(&h->mu);
	h->counts[i]++;
	h->sum += v;
	h->count++;
	pthread_mutex_unlock(&h->mu);
}

void prom_hist_write(struct prom_buf *b, const char *name, const struct prom_label *labels,
		     int n_labels, struct prom_hist *h)
{
	if (!h->bounds)
		return;
	pthread_mutex_lock(&h->mu);
	uint64_t cum = 0;
	char le[64];
	for (int i = 0; i <= h->n; i++) {
		cum += h->counts[i];
		if (i < h->n)
			shortest(le, sizeof le, h->bounds[i]);
		else
			snprintf(le, sizeof le, "+Inf");
		prom_printf(b, "%s_bucket", name);
		labels_out(b, labels, n_labels, le);
		prom_printf(b, " %llu\n", (unsigned long long)cum);
	}
	prom_printf(b, "%s_sum", name);
	labels_out(b, labels, n_labels, NULL);
	prom_printf(b, " ");
	value(b, h->sum);
	prom_printf(b, "\n%s_count", name);
	labels_out(b, labels, n_labels, NULL);
	prom_printf(b, " %llu\n", (unsigned long long)h->count);
	pthread_mutex_unlock(&h->mu);
}
