/* cmd_common — what the kvworker commands share: strict number parsing for flags, reading a
 * prompt or text file, loading a model with its tokenizer, the command table entry type, and
 * the decoding session of generate and resume (model, CPU backend, engine with the retrieval
 * flags, the host copy in kvstored or an embedded store, the sampling loop, --stats).
 *
 * Exit codes of every command: 0 done, 1 failed (message on stderr), 2 usage error. Commands
 * print results to stdout and everything else to stderr. Helpers that allocate say so; the
 * caller frees. */
#ifndef FREEKV_CMD_COMMON_H
#define FREEKV_CMD_COMMON_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "hostkv.h"
#include "model.h"
#include "policy_opts.h"
#include "sampler.h"

#define CMD_OK 0
#define CMD_FAIL 1
#define CMD_USAGE 2
#define CMD_SIGNALLED 128 /* + the signal: a run stopped by SIGINT exits 130, by SIGTERM 143 */

struct fkv_tokenizer;
struct cmd_session;

/* One kvworker command: run() gets argv with argv[0] = the command name. */
struct cmd {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv);
};

int cmd_generate(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_resume(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_client(int argc, char **argv);
int cmd_info(int argc, char **argv);

/* Parse a whole decimal number within [lo, hi]; 0 or -EINVAL. */
int cmd_parse_long(const char *s, long lo, long hi, long *out);
/* A --slice-us value: 0, or SCHED_SLICE_MIN_US to SCHED_SLICE_MAX_US (common/sched_slice.h). */
int cmd_parse_slice(const char *s, long *out);
int cmd_parse_float(const char *s, double lo, double hi, double *out);
int cmd_parse_u64(const char *s, uint64_t *out);

/* Reads a whole file ("-" = stdin) into a NUL-terminated malloc'ed string; 0 or -errno. */
int cmd_read_text(const char *path, char **out);

/* Loads the model at path (a .gguf file or a Hugging Face folder) and its tokenizer, printing
 * the reason to stderr on failure. Returns 0 or a negative errno; on failure nothing is held. */
int cmd_load(const char *path, struct fkv_model *m, struct fkv_tokenizer **tok);

/* -log p(target) from one row of V logits, in double. */
double cmd_nll(const float *logits, int V, int target);
/* The scoring window of perplexity and eval that starts at text token start of toks[0..n):
 * BOS first when bos >= 0, then up to per text tokens. Writes win; returns its length. */
long cmd_window(int32_t *win, const int32_t *toks, long n, long start, long per, int bos);

/* Options generate and resume share besides the retrieval options: parsed by cmd_session_apply. */
struct cmd_session_opts {
	const char *prog;	/* "kvworker generate", for messages */
	const char *model;
	long threads, ctx, n;
	struct sampler_params sp;
	bool ids, stats, keep;
	const char *endpoint;	/* --store; NULL: an embedded in-process store */
	uint32_t lease_budget;	/* --lease-budget; 0: lease-all */
	long store_retry;	/* --store-retry: seconds to wait for a kvstored that went away */
	const char *seq_name;	/* --seq; NULL: a fresh name */
	const char *backend;	/* --backend cuda|cpu|auto; NULL: auto */
	const char *cache_salt;	/* --cache-salt: the prefix-sharing namespace; NULL: default */
	bool no_prefix;		/* --no-prefix: neither share nor publish (docs/design.md §4) */
	long slice_us;		/* --slice-us: the scheduler slice to ask for; 0: its own */
	struct policy_opts po;
};

/* Defaults: 64 tokens, temp 0.8, top-k 40, top-p 0.95, seed from the clock, policy freekv. */
void cmd_session_defaults(struct cmd_session_opts *o, const char *prog);
/* Options are parsed with getopt_long. cmd_options() builds a command's table: its own entries,
 * then (with session) the options generate and resume share, then the retrieval options, ending
 * with the zero entry; out holds max entries. The short options of the shared ones are
 * "m:n:t:c:s:" (CMD_SESSION_SHORT). */
#define CMD_SESSION_OPT_BASE 0x2000
#define CMD_SESSION_SHORT "m:n:t:c:s:"
size_t cmd_options(struct option *out, size_t max, const struct option *own, size_t n_own,
		   bool session);
/* What getopt_long returned for a shared or retrieval option, stored in o: 1 taken, 0 not one
 * of them, -EINVAL after printing why. */
int cmd_session_apply(struct cmd_session_opts *o, int c, const char *arg);
/* For getopt_long's '?' and ':' (with opterr 0 and a leading ':' in the short string): names
 * the option and returns -EINVAL. */
int cmd_getopt_error(const char *prog, int c, char **argv);
/* What the shared flags cannot mean together, said on stderr: --keep and --seq without --store
 * (the embedded store ends with the process). 0, or -EINVAL after saying why. */
int cmd_session_check(const struct cmd_session_opts *o);
/* The exit code of a finished cmd_session_run: CMD_OK, CMD_SIGNALLED + the signal that stopped
 * it, or CMD_FAIL. */
int cmd_session_exit(const struct cmd_session *s, int run_ret);
/* The shared flags, for usage texts. */
void cmd_session_usage(FILE *f);

/* The backend name to open for --backend value backend (NULL: auto) and a KV policy: backend
 * unchanged, since every built policy runs on both backends (the retrieval policies need the
 * optional recall_units and attn_decode_heads ops, which the CPU and CUDA backends have). */
const char *cmd_backend_for(const char *backend, const char *policy, const char *prog);
/* -EINVAL (printed) when policy names no built policy; else 0. A backend that lacks an op a
 * policy needs is refused when the policy is created (-EOPNOTSUPP, engine error message). */
int cmd_backend_check(const char *backend, const char *policy, const char *prog);

/* Everything a decoding run holds; cmd_session_open fills it, cmd_session_close frees it. */
struct cmd_session {
	struct cmd_session_opts o;
	struct fkv_model m;
	struct fkv_tokenizer *tok;
	struct backend *be;
	struct engine *e;
	struct hostkv *hk;
	struct hostkv_seq *hs;
	int seq;		/* engine handle, -1 before open */
	char seq_name[128];
	bool interrupted;	/* SIGINT/SIGTERM stopped the run: the sequence is kept */
	int stop_signal;	/* which of the two (for the exit code) */
	bool completed;		/* the run finished; only then is the sequence dropped */
	bool resumed;		/* opened by resume: the sequence existed before this run */
	bool progress;		/* stderr is a terminal: a progress line for long runs */
	double progress_t0, progress_last; /* ms: start of the phase, last line written */
	bool store_lost;	/* kvstored went away for good: the sequence stays in its journal */
	bool first_by_decode;	/* cmd_session_run runs `first` by decode steps, not prefill */
	int64_t prefix_covered;	/* prompt tokens found in the store's pool: not prefilled */
	struct hostkv_opts ho;	/* how the store was opened (again on a reconnect) */
	double open_ms;		/* cmd_session_open_seq's time (the prefix lookup and restore) */
	char worker_name[64];
};

/* Loads the model, creates the backend and engine, opens the store and the sequence: a new
 * empty one (resume false; an existing sequence with tokens is refused) or an existing one
 * whose policy state is rebuilt from the host copy (resume true). Prints why on failure;
 * 0 or -errno. */
int cmd_session_open(struct cmd_session *s, const struct cmd_session_opts *o, bool resume);
/* The same in two steps, for a new sequence that starts with a prompt: load (everything but
 * the sequence), then open the sequence with the prompt's ids. With a kvstored and without
 * --no-prefix the prompt's leading pages that another sequence already holds are attached
 * (docs/design.md §4 "Prefix sharing"): s->prefix_covered tokens, which the run skips
 * (cmd_session_run takes the prompt from there). */
int cmd_session_load(struct cmd_session *s, const struct cmd_session_opts *o, bool resume);
int cmd_session_open_seq(struct cmd_session *s, const int32_t *prompt, int n_prompt);
/* Runs first[0..n_first) (the prompt, or a resumed sequence's pending ids), then samples and
 * decodes up to o.n tokens, each kept in the host copy before it is printed. Prints the
 * --stats JSON to stderr and reports it to kvstored. When kvstored goes away (killed,
 * restarted) the run says so, reconnects with backoff for up to o.store_retry seconds,
 * rebuilds the sequence from the store as a resume does and runs again what the store did not
 * keep, so the tokens are those of an uninterrupted run (docs/design.md §4 "Restart without
 * loss"); when it does not come back, the run fails and the store keeps the sequence.
 * 0 (also after SIGINT/SIGTERM stopped it: s->interrupted) or -errno. */
int cmd_session_run(struct cmd_session *s, const int32_t *first, int n_first);
/* Detaches the sequence (kept with --keep, after an interruption or a failure) or drops it
 * (a completed run without --keep); frees everything. Fine on a partly opened session. */
void cmd_session_close(struct cmd_session *s);

#endif
