/* Helper for tests that run a real executable to completion and look at what it printed: runs
 * it with stdin from a file (or /dev/null), stdout and stderr into files under a scratch folder
 * the test owns, asserts it exited rather than crashed, and hands back the exit code with both
 * outputs as malloc'ed strings (the caller frees them with proc_result_free). Header-only, used
 * by test_eval.c and test_kvworker_cli.c. */
#ifndef FREEKV_TEST_PROC_H
#define FREEKV_TEST_PROC_H

#include "test_util.h"

#include <fcntl.h>
#include <sys/wait.h>

#define PROC_MAX_ARGS 40
#define PROC_MAX_OUTPUT (1 << 20)

/* Output of one run: exit code, stdout and stderr as strings (malloc'ed). */
struct result {
	int rc;
	char *out, *err;
};

/* The whole of a file (at most PROC_MAX_OUTPUT - 1 bytes) as a NUL-terminated string. */
static inline char *proc_slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	char *buf = calloc(1, PROC_MAX_OUTPUT);
	assert_non_null(buf);
	size_t n = fread(buf, 1, PROC_MAX_OUTPUT - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* Runs bin with args (NULL-terminated, without the binary) and stdin from in_path (or
 * /dev/null); stdout and stderr go through dir/out and dir/err. Fails the test on a crash. */
static inline struct result proc_run(const char *bin, const char *dir, const char *in_path,
				     const char *const *args)
{
	char outp[4200], errp[4200];
	snprintf(outp, sizeof outp, "%s/out", dir);
	snprintf(errp, sizeof errp, "%s/err", dir);
	const char *argv[PROC_MAX_ARGS] = { bin };
	int n = 1;
	while (args[n - 1] && n < PROC_MAX_ARGS - 1) {
		argv[n] = args[n - 1];
		n++;
	}
	argv[n] = NULL;
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int i = open(in_path ? in_path : "/dev/null", O_RDONLY);
		int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (i < 0 || o < 0 || e < 0)
			_exit(127);
		dup2(i, 0);
		dup2(o, 1);
		dup2(e, 2);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st)); /* never a crash */
	return (struct result){ WEXITSTATUS(st), proc_slurp(outp), proc_slurp(errp) };
}

static inline void proc_result_free(struct result *r)
{
	free(r->out);
	free(r->err);
}

#endif
