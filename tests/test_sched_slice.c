/* Tests common/sched_slice.c: out-of-range requests are refused with a reason and change
 * nothing; a request is what the kernel then reports (sched_getattr and /proc's se.slice), keeps
 * the thread's nice value, and is inherited by threads and processes created afterwards; the
 * process-wide request reaches threads already running; an unprivileged process may make one. On a kernel older than 6.12 the request is refused as
 * unsupported and the tests that need one are skipped. */
#include "test_util.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sched_slice.h"

/* se.slice of the calling thread, in nanoseconds, from /proc/thread-self/sched. */
static long proc_slice_ns(void)
{
	FILE *f = fopen("/proc/thread-self/sched", "r");
	assert_non_null(f);
	char line[256];
	long v = -1;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, "se.slice", 8))
			v = atol(strchr(line, ':') + 1);
	fclose(f);
	return v;
}

/* Skips the calling test where the kernel keeps no slice requests. */
static void need_slices(void)
{
	char err[256];
	int ret = sched_slice_request(0, SCHED_SLICE_MIN_US, err, sizeof err);
	if (ret == -EOPNOTSUPP) {
		print_message("skipped: %s\n", err);
		skip();
	}
	assert_int_equal(ret, 0);
}

static void test_out_of_range(void **state)
{
	(void)state;
	long before = sched_slice_current(0);
	assert_true(before >= 0);
	char err[256] = "";
	assert_int_equal(sched_slice_request(0, SCHED_SLICE_MIN_US - 1, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "99 us is outside"));
	assert_int_equal(sched_slice_request(0, SCHED_SLICE_MAX_US + 1, err, sizeof err), -EINVAL);
	assert_int_equal(sched_slice_request(0, 0, err, sizeof err), 0);
	assert_int_equal(sched_slice_current(0), before);
}

static void *thread_slice(void *arg)
{
	*(long *)arg = sched_slice_current(0);
	return NULL;
}

static void test_request_kept_and_inherited(void **state)
{
	(void)state;
	need_slices();
	errno = 0;
	int nice_before = getpriority(PRIO_PROCESS, 0);
	assert_int_equal(errno, 0);
	char err[256] = "";
	assert_int_equal(sched_slice_request(0, 250, err, sizeof err), 0);
	assert_int_equal(sched_slice_current(0), 250);
	assert_int_equal(proc_slice_ns(), 250000);
	assert_int_equal(getpriority(PRIO_PROCESS, 0), nice_before);

	long in_thread = -1;
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, thread_slice, &in_thread), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(in_thread, 250);

	pid_t pid = fork();
	assert_true(pid >= 0);
	if (!pid)
		_exit(sched_slice_current(0) == 250 ? 0 : 1);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

struct early {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pid_t tid;
	bool go;
};

static void *early_thread(void *arg)
{
	struct early *e = arg;
	pthread_mutex_lock(&e->mu);
	e->tid = (pid_t)syscall(SYS_gettid);
	pthread_cond_broadcast(&e->cv);
	while (!e->go)
		pthread_cond_wait(&e->cv, &e->mu);
	pthread_mutex_unlock(&e->mu);
	return NULL;
}

/* The process-wide request reaches a thread that was already running (as a library's pool
 * started before main is). */
static void test_process_reaches_running_threads(void **state)
{
	(void)state;
	need_slices();
	struct early e = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, early_thread, &e), 0);
	pthread_mutex_lock(&e.mu);
	while (!e.tid)
		pthread_cond_wait(&e.cv, &e.mu);
	pthread_mutex_unlock(&e.mu);
	assert_int_not_equal(sched_slice_current(e.tid), 350);
	char err[256] = "";
	assert_int_equal(sched_slice_request_process(350, err, sizeof err), 0);
	assert_int_equal(sched_slice_current(0), 350);
	assert_int_equal(sched_slice_current(e.tid), 350);
	pthread_mutex_lock(&e.mu);
	e.go = true;
	pthread_cond_broadcast(&e.cv);
	pthread_mutex_unlock(&e.mu);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(sched_slice_request_process(SCHED_SLICE_MAX_US + 1, err, sizeof err),
			 -EINVAL);
}

/* The request carries the thread's nice value through: a niced thread stays niced. */
static void test_keeps_nice(void **state)
{
	(void)state;
	need_slices();
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		if (setpriority(PRIO_PROCESS, 0, 7))
			_exit(2);
		if (sched_slice_request(0, 400, NULL, 0) || sched_slice_current(0) != 400)
			_exit(3);
		_exit(getpriority(PRIO_PROCESS, 0) == 7 ? 0 : 4);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* A service runs as its own user: the request needs no privilege. */
static void test_unprivileged(void **state)
{
	(void)state;
	need_slices();
	if (geteuid() != 0) {
		char err[256] = "";
		assert_int_equal(sched_slice_request(0, 300, err, sizeof err), 0);
		return;
	}
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		if (setgid(65534) || setuid(65534))
			_exit(2);
		char err[256] = "";
		int ret = sched_slice_request(0, 300, err, sizeof err);
		if (ret)
			fprintf(stderr, "unprivileged request: %s\n", err);
		_exit(ret || sched_slice_current(0) != 300 ? 3 : 0);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_out_of_range),
		cmocka_unit_test(test_request_kept_and_inherited),
		cmocka_unit_test(test_process_reaches_running_threads),
		cmocka_unit_test(test_keeps_nice),
		cmocka_unit_test(test_unprivileged),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
