/* stories260K for a test (tests/data/models, or FREEKV_MODELS_DIR): loaded, or the test
 * skipped where the model is absent. Header-only; include after test_util.h. */
#ifndef FREEKV_STORIES_TEST_H
#define FREEKV_STORIES_TEST_H

#include "model.h"

/* The model into *m (the test's to model_free); skips the test when the file is absent and
 * fails it when the file does not load. */
static inline void test_load_stories(struct fkv_model *m)
{
	const char *path = test_model_path("stories260K/stories260K.gguf");
	char err[256];
	if (!path)
		skip();
	if (model_load(path, m, err, sizeof err))
		fail_msg("model_load %s: %s", path, err);
}

#endif
