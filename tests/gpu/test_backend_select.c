/* test_backend_select — choosing a backend (backend_open, kvworker --backend), on any machine:
 * cpu always opens; an unknown name is refused with a message; auto picks cuda exactly when a
 * device is present; --backend cuda without a device (or without CUDA support) is a clear error
 * and exit status 1 from every kvworker command (a retrieval policy included; with a device,
 * quest generates on cuda), and --backend cpu runs. Label unit: the
 * no-device checks are what CI can run; on a GPU machine the cuda cases are checked instead. */
#include "test_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"

/* Runs cmd through the shell; its exit status, stderr+stdout to out. */
static int run(const char *cmd, char *out, size_t cap)
{
	FILE *f = popen(cmd, "r");
	assert_non_null(f);
	size_t n = fread(out, 1, cap - 1, f);
	out[n] = '\0';
	int st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_open(void **state)
{
	(void)state;
	struct backend *be = NULL;
	char err[256] = "";
	assert_int_equal(backend_open("cpu", 1, &be, err, sizeof err), 0);
	assert_string_equal(be->ops->name, "cpu");
	backend_free(be);
	assert_int_equal(backend_open("tpu", 1, &be, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "unknown backend 'tpu'"));
	be = NULL;
	int devs = backend_cuda_devices();
	assert_int_equal(backend_open(NULL, 1, &be, err, sizeof err), 0);
	assert_string_equal(be->ops->name, devs > 0 ? "cuda" : "cpu");
	backend_free(be);
	be = NULL;
	int ret = backend_open("cuda", 1, &be, err, sizeof err);
	if (devs > 0) {
		assert_int_equal(ret, 0);
		assert_string_equal(be->ops->name, "cuda");
		assert_non_null(be->ops->host_register);
		backend_free(be);
	} else {
		assert_int_equal(ret, -ENODEV);
		assert_null(be);
		assert_non_null(strstr(err, "--backend cuda"));
		assert_int_equal(backend_cuda_new(&be, 0), -ENODEV);
	}
}

static void test_kvworker_flag(void **state)
{
	(void)state;
	char cmd[16384], out[8192];
	const char *bin = test_build_path("worker/kvworker");
	const char *model = test_model_path("stories260K/stories260K.gguf");
	if (access(bin, X_OK) || !model) {
		fprintf(stderr, "skip: kvworker or stories260K missing\n");
		skip();
	}
	/* A bad value is a usage error for the shared flags. */
	snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' -n 1 --backend tpu -p x 2>&1", bin, model);
	assert_int_not_equal(run(cmd, out, sizeof out), 0);
	assert_non_null(strstr(out, "--backend"));
	/* A retrieval policy on cuda: runs with a device, else the no-device error (no longer a
	 * policy refusal). */
	snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' -n 2 --temp 0 --policy quest "
		 "--backend cuda -p 'Once' 2>&1", bin, model);
	if (backend_cuda_devices() > 0) {
		int st = run(cmd, out, sizeof out);
		if (st != 0)
			fail_msg("quest on cuda: status %d, output: %s", st, out);
		return;
	}
	assert_int_equal(run(cmd, out, sizeof out), 1);
	assert_non_null(strstr(out, "--backend cuda"));
	assert_null(strstr(out, "cpu backend only"));
	char text[] = "/tmp/freekv-backend-select-XXXXXX";
	int fd = mkstemp(text);
	assert_true(fd >= 0);
	FILE *tf = fdopen(fd, "w");
	for (int i = 0; i < 20; i++)
		fputs("Once upon a time there was a little girl who liked to play. ", tf);
	fclose(tf);
	const char *cmds[] = {
		"generate -m '%s' -n 2 --temp 0 -p 'Once' --backend cuda%s%s",
		"perplexity -m '%s' -f '%s' --backend cuda",
		"eval -m '%s' -f '%s' --policies full --backend cuda",
	};
	for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
		char args[6144];
		snprintf(args, sizeof args, cmds[i], model, i ? text : "", "");
		snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", bin, args);
		int st = run(cmd, out, sizeof out);
		if (st != 1 || !strstr(out, "--backend cuda"))
			fail_msg("kvworker %s: status %d, output: %s", args, st, out);
	}
	unlink(text);
	/* --backend cpu generates. */
	snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' -n 3 --temp 0 -p 'Once' --ids --backend cpu "
		 "2>/dev/null", bin, model);
	assert_int_equal(run(cmd, out, sizeof out), 0);
	assert_true(strlen(out) > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open),
		cmocka_unit_test(test_kvworker_flag),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
