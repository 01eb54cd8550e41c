/* Helpers for tests that run the real kvworker binary next to a real kvstored: start it with
 * its stdout on a pipe, read whitespace-separated token ids as they stream, wait for it, read a
 * sequence's kept token ids from the daemon, and tell whether a KV policy is built. Header-only,
 * used with test_kvstored_harness.h by test_resume.c, test_two_workers.c and test_serve.c. */
#ifndef FREEKV_TEST_KVWORKER_PROC_H
#define FREEKV_TEST_KVWORKER_PROC_H

#include "test_kvstored_harness.h"

#include <ctype.h>

#include "kvcache.h"

#define P_MAX_ARGS 48
#define P_MAX_IDS 4096

struct proc {
	pid_t pid;
	int out;		/* read end of its stdout */
	char buf[65536];	/* stdout read so far */
	size_t len;
	int ids[P_MAX_IDS];	/* ids parsed from complete words */
	int n_ids;
	size_t parsed;		/* bytes of buf consumed by the parser */
};

static inline const char *p_kvworker_path(void)
{
	static char p[4096];
	snprintf(p, sizeof p, "%s/worker/kvworker", FREEKV_BUILD_DIR);
	return p;
}

/* argv without the binary, NULL-terminated; stderr goes to the test's stderr. */
static inline void p_start(struct proc *p, const char *const *args)
{
	const char *argv[P_MAX_ARGS];
	int n = 0;
	argv[n++] = p_kvworker_path();
	for (int i = 0; args[i] && n < P_MAX_ARGS - 1; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	int fd[2];
	assert_int_equal(pipe(fd), 0);
	memset(p, 0, sizeof *p);
	p->pid = fork();
	assert_true(p->pid >= 0);
	if (p->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd[1], 1);
		close(fd[0]);
		close(fd[1]);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(fd[1]);
	p->out = fd[0];
}

static inline void p_parse(struct proc *p)
{
	while (p->parsed < p->len) {
		size_t i = p->parsed;
		while (i < p->len && isspace((unsigned char)p->buf[i]))
			i++;
		size_t j = i;
		while (j < p->len && isdigit((unsigned char)p->buf[j]))
			j++;
		if (j == p->len || j == i) /* an incomplete word, or nothing */
			break;
		if (p->n_ids < P_MAX_IDS)
			p->ids[p->n_ids++] = atoi(p->buf + i);
		p->parsed = j;
	}
}

/* Reads until at least n ids arrived (or EOF); returns how many there are. */
static inline int p_read_ids(struct proc *p, int n)
{
	while (p->n_ids < n && p->len < sizeof p->buf - 1) {
		ssize_t r = read(p->out, p->buf + p->len, sizeof p->buf - 1 - p->len);
		if (r <= 0)
			break;
		p->len += (size_t)r;
		p_parse(p);
	}
	return p->n_ids;
}

/* Reads to EOF and reaps it; returns the exit status (or 128 + signal). */
static inline int p_wait(struct proc *p)
{
	p_read_ids(p, P_MAX_IDS + 1);
	if (p->len < sizeof p->buf) /* the last word had no trailing blank */
		p->buf[p->len++] = '\n';
	p_parse(p);
	close(p->out);
	int st;
	assert_int_equal(waitpid(p->pid, &st, 0), p->pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Runs kvworker to completion; its ids land in p. */
static inline int p_run(struct proc *p, const char *const *args)
{
	p_start(p, args);
	return p_wait(p);
}

/* The token ids a sequence keeps, and its state and committed length. Returns the count. */
static inline int p_seq_ids(const char *endpoint, const char *name, int *ids, int max,
			    int *state, uint64_t *committed)
{
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(endpoint, 5000, &k), 0);
	int ret = kvs_show_sequence(k, 0, name, true, &r);
	if (ret)
		fprintf(stderr, "show %s: %s\n", name, kvs_error(k));
	assert_int_equal(ret, 0);
	int n = (int)r->sequence->n_token_ids;
	for (int i = 0; i < n && i < max; i++)
		ids[i] = (int)r->sequence->token_ids[i];
	if (state)
		*state = r->sequence->state;
	if (committed)
		*committed = r->sequence->committed_tokens;
	kvs_reply_free(r);
	kvs_close(k);
	return n;
}

/* True when KV policy name is built; otherwise notes on stderr that the case is skipped. */
static inline bool p_policy_built(const char *name)
{
	if (kvcache_policy(name))
		return true;
	fprintf(stderr, "note: policy %s is not built: case skipped\n", name);
	return false;
}

#endif
