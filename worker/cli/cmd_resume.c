/* cmd_resume — `kvworker resume`: continue a sequence that kvstored keeps (orphaned by a worker
 * that died, or detached with --keep). The policy's state is rebuilt from the host copy of the
 * committed tokens, the ids kept past them (sampled but never run) are run first, then decoding
 * goes on as in generate. With greedy sampling the continuation equals the one the first worker
 * would have produced. Only the new tokens are printed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "freekv_store.h"

/* Without --page-size the sequence's own page size (a sequence keeps its geometry; the budget,
 * sink and window then scale to it as usual). A sequence that cannot be looked up is left to the
 * open that follows, which says why. */
static void take_stored_page_size(struct cmd_session_opts *o)
{
	struct kvs *k;
	Freekv__Reply *r;
	if (o->po.set_page || kvs_connect(o->endpoint, 5000, &k))
		return;
	if (!kvs_show_sequence(k, 0, o->seq_name, false, &r)) {
		if (r->sequence && r->sequence->geometry && r->sequence->geometry->page_size) {
			o->po.kv.page = (int)r->sequence->geometry->page_size;
			o->po.set_page = true;
		}
		kvs_reply_free(r);
	}
	kvs_close(k);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvworker resume -m MODEL --store ENDPOINT --seq NAME [-n N] [options]\n"
		"  continues sequence NAME of the kvstored at ENDPOINT with the model that started\n"
		"  it (same fingerprint), printing only the new tokens; --page-size defaults to\n"
		"  the sequence's own\n");
	cmd_session_usage(f);
	fprintf(f, "  -h, --help           this text\n");
}

int cmd_resume(int argc, char **argv)
{
	struct cmd_session_opts o;
	cmd_session_defaults(&o, "kvworker resume");
	static const struct option own[] = { { "help", no_argument, NULL, 'h' } };
	struct option opts[128];
	cmd_options(opts, 128, own, 1, true);
	optind = 0;
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":h" CMD_SESSION_SHORT, opts, NULL)) != -1) {
		if (c == 'h') {
			usage(stdout);
			return CMD_OK;
		}
		if (c == '?' || c == ':')
			cmd_getopt_error(o.prog, c, argv);
		if (c == '?' || c == ':' || cmd_session_apply(&o, c, optarg) != 1) {
			usage(stderr);
			return CMD_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvworker resume: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return CMD_USAGE;
	}
	if (o.cache_salt || o.no_prefix) { /* prefix sharing is for a new sequence's prompt */
		fprintf(stderr, "kvworker resume: --cache-salt and --no-prefix apply to generate: a "
			"resumed sequence keeps its pages\n");
		usage(stderr);
		return CMD_USAGE;
	}
	if (!o.model || !o.endpoint || !o.seq_name) {
		fprintf(stderr, "kvworker resume: need -m, --store and --seq\n");
		usage(stderr);
		return CMD_USAGE;
	}
	take_stored_page_size(&o);
	struct cmd_session s;
	int ret = CMD_FAIL;
	if (cmd_session_open(&s, &o, true))
		goto out;
	const int32_t *ids;
	int64_t n_ids = hostkv_seq_tokens(s.hs, &ids);
	int64_t len = engine_seq_len(s.e, s.seq);
	fprintf(stderr, "kvworker resume: sequence '%s': %lld tokens restored, %lld to run\n",
		s.seq_name, (long long)len, (long long)(n_ids - len));
	if (n_ids - len > engine_max_ctx(s.e)) {
		fprintf(stderr, "kvworker resume: too many pending tokens\n");
		goto out;
	}
	/* A copy: the host copy's id array grows while the run commits. */
	int32_t *pending = malloc((size_t)(n_ids - len) * sizeof *pending + 1);
	if (!pending) {
		fprintf(stderr, "kvworker resume: out of memory\n");
		goto out;
	}
	memcpy(pending, ids + len, (size_t)(n_ids - len) * sizeof *pending);
	/* One or two pending ids are what a decoding worker leaves (the id it sampled, and the
	 * one whose length had not reached the store yet): they ran as decode steps, and run so
	 * again to continue exactly. More are a prompt cut short: prefill, as it ran. */
	s.first_by_decode = n_ids - len <= 2;
	ret = cmd_session_exit(&s, cmd_session_run(&s, pending, (int)(n_ids - len)));
	free(pending);
out:
	cmd_session_close(&s);
	return ret;
}
