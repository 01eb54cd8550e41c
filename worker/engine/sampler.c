/* sampler — see sampler.h. PRNG: splitmix64, one 64-bit state, good enough for sampling and
 * identical on every platform. */
#include "sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

int sampler_init(struct sampler *s, const struct sampler_params *p, int vocab)
{
	if (vocab <= 0 || isnan(p->temp) || isnan(p->top_p))
		return -EINVAL;
	s->p = *p;
	s->rng = p->seed;
	s->vocab = vocab;
	s->cand = malloc((size_t)vocab * sizeof *s->cand);
	return s->cand ? 0 : -ENOMEM;
}

void sampler_free(struct sampler *s)
{
	free(s->cand);
	s->cand = NULL;
}

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

double sampler_uniform(struct sampler *s)
{
	return (double)(splitmix64(&s->rng) >> 11) / (double)(1ull << 53);
}

int32_t sampler_argmax(const float *logits, int vocab)
{
	int32_t best = 0;
	for (int i = 1; i < vocab; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

/* Orders by logit (stored in p before normalisation), descending, then by id. */
static int cand_cmp(const void *a, const void *b)
{
	const struct sampler_cand *x = a, *y = b;
	if (x->p != y->p)
		return x->p > y->p ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

int sampler_candidates(struct sampler *s, const float *logits, const struct sampler_cand **out)
{
	int n = s->vocab;
	for (int i = 0; i < n; i++)
		s->cand[i] = (struct sampler_cand){ i, isnan(logits[i]) ? -INFINITY : logits[i] };
	qsort(s->cand, (size_t)n, sizeof *s->cand, cand_cmp);
	if (s->p.top_k > 0 && s->p.top_k < n)
		n = s->p.top_k;
	float temp = s->p.temp > 0.0f ? s->p.temp : 1.0f;
	float mx = s->cand[0].p;
	double sum = 0.0;
	for (int i = 0; i < n; i++) {
		s->cand[i].p = expf((s->cand[i].p - mx) / temp);
		sum += s->cand[i].p;
	}
	if (s->p.top_p > 0.0f && s->p.top_p < 1.0f) {
		/* The smallest prefix whose mass reaches top_p. */
		double acc = 0.0;
		int keep = 0;
		while (keep < n) {
			acc += s->cand[keep++].p / sum;
			if (acc >= s->p.top_p)
				break;
		}
		n = keep;
		sum = 0.0;
		for (int i = 0; i < n; i++)
			sum += s->cand[i].p;
	}
	for (int i = 0; i < n; i++)
		s->cand[i].p = (float)(s->cand[i].p / sum);
	*out = s->cand;
	return n;
}

int32_t sampler_sample(struct sampler *s, const float *logits)
{
	if (s->p.temp <= 0.0f)
		return sampler_argmax(logits, s->vocab);
	const struct sampler_cand *c;
	int n = sampler_candidates(s, logits, &c);
	double u = sampler_uniform(s), acc = 0.0;
	for (int i = 0; i < n; i++) {
		acc += c[i].p;
		if (u < acc)
			return c[i].id;
	}
	return c[n - 1].id;
}
