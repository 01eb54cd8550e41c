/* Shared by the GPU tests that run the engine on a synthetic model (test_backend_cuda.c,
 * test_policies_cuda.c): a random-weight Llama-3.1-8B-geometry model written to a fresh
 * temporary folder and loaded, and that folder's removal. The model is the test's to
 * model_free(). Header-only; include after gpu_test.h. */
#ifndef FREEKV_GPU_MODEL_TEST_H
#define FREEKV_GPU_MODEL_TEST_H

#include <stdio.h>
#include <stdlib.h>

#include "model.h"
#include "synth.h"

/* dir: a "/tmp/...-XXXXXX" template, filled in; layers of bf16 weights, vocab at least 512. */
static inline void gpu_test_synth_8b(char *dir, int layers, uint64_t seed, struct fkv_model *m)
{
	char err[512];
	assert_non_null(mkdtemp(dir));
	int vocab = synth_min_vocab() > 512 ? synth_min_vocab() : 512;
	if (synth_write("llama-3.1-8b", layers, FKV_BF16, dir, seed, vocab, err, sizeof err))
		fail_msg("synth_write: %s", err);
	if (model_load(dir, m, err, sizeof err))
		fail_msg("model_load: %s", err);
}

static inline void gpu_test_rm_dir(const char *dir)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

#endif
