/* sampler — picks the next token from a row of logits: greedy (temp 0), or temperature with
 * top-k and top-p (nucleus) filtering, drawn from a seeded PRNG so that runs are reproducible.
 *
 * A sampler owns its candidate scratch (sized for the vocabulary at init) and its PRNG state;
 * sampler_free() releases them. Logits are borrowed for the call and never modified. */
#ifndef FREEKV_SAMPLER_H
#define FREEKV_SAMPLER_H

#include <stdint.h>

struct sampler_params {
	float temp;	/* <= 0: greedy */
	int top_k;	/* <= 0: no limit */
	float top_p;	/* >= 1 or <= 0: no limit */
	uint64_t seed;
};

struct sampler_cand {
	int32_t id;
	float p; /* probability after filtering and renormalisation */
};

struct sampler {
	struct sampler_params p;
	uint64_t rng;
	int vocab;
	struct sampler_cand *cand; /* vocab entries */
};

/* Returns 0, -EINVAL (vocab <= 0, NaN parameters) or -ENOMEM. */
int sampler_init(struct sampler *s, const struct sampler_params *p, int vocab);
void sampler_free(struct sampler *s);

/* The next token. Greedy picks the highest logit, the lowest id on ties. */
int32_t sampler_sample(struct sampler *s, const float *logits);

/* The candidates sampling draws from, most likely first (ties: lower id first), after
 * temperature, top-k and top-p; probabilities sum to 1. Points into the sampler's scratch, valid
 * until the next call. Returns the number of candidates. */
int sampler_candidates(struct sampler *s, const float *logits, const struct sampler_cand **out);

/* Index of the largest logit (lowest id on ties). */
int32_t sampler_argmax(const float *logits, int vocab);

/* Uniform double in [0, 1) from the sampler's PRNG. */
double sampler_uniform(struct sampler *s);

#endif
