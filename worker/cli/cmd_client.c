/* cmd_client — `kvworker client`: talks to a `kvworker serve` over its ROUTER socket
 * (proto/worker.proto) with a DEALER. Generate (a prompt or token ids) or Resume (a sequence
 * kvstored keeps) stream the sampled tokens to stdout as they arrive — text, or ids with
 * --ids, the same bytes `kvworker generate` prints — and the final Done goes to stderr as a JSON
 * line with --stats. --status prints the worker's state. SIGINT sends a Cancel: the worker
 * stops the request and keeps its sequence.
 *
 * Exit codes follow kvctl's: 0 ok, 1 the worker refused or failed the request, 2 usage,
 * 3 the worker cannot be reached (no reply within --timeout). */
#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "clock.h"
#include "cmd_common.h"
#include "proto/worker.pb-c.h"

#define CLIENT_UNREACHABLE 3
#define CLIENT_MAX_IDS (1 << 20)

static volatile sig_atomic_t g_cancel;

static void on_int(int sig)
{
	(void)sig;
	g_cancel = 1;
}

struct client_opts {
	const char *endpoint, *prompt, *file, *resume, *seq, *token_ids;
	long n, timeout_ms;
	bool ids, stats, keep, status;
	Freekv__Worker__Sampling sp;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvworker client -e ENDPOINT (-p PROMPT | -f FILE | --token-ids LIST |\n"
		"                       --resume SEQ | --status) [options]\n"
		"  -e, --endpoint ENDPOINT  the `kvworker serve` socket (ipc://PATH, tcp://...)\n"
		"  -p, --prompt TEXT        prompt text ('-' reads stdin)\n"
		"  -f, --file PATH          read the prompt from a file\n"
		"      --token-ids LIST     prompt as token ids, comma- or space-separated\n"
		"      --resume SEQ         continue sequence SEQ kept by kvstored\n"
		"      --status             print the worker's state and exit\n"
		"  -n, --n-predict N        tokens to generate (default 64)\n"
		"      --seq NAME           the new sequence's name in kvstored\n"
		"      --keep               keep the sequence in kvstored when done\n"
		"      --temp T, --top-k K, --top-p P, -s/--seed S   sampling (generate's defaults)\n"
		"      --ids                print token ids instead of text\n"
		"      --stats              print the final statistics as JSON to stderr\n"
		"      --timeout MS         give up after MS without a reply (default 120000)\n"
		"  exit: 0 ok, 1 refused or failed, 2 usage, 3 cannot reach the worker\n");
}

static int bad(const char *flag, const char *v)
{
	fprintf(stderr, "kvworker client: invalid value '%s' for %s\n", v, flag);
	usage(stderr);
	return CMD_USAGE;
}

/* 0 parsed, -1 help shown, CMD_USAGE. */
static int parse(int argc, char **argv, struct client_opts *o)
{
	*o = (struct client_opts){ .n = 64, .timeout_ms = 120000 };
	freekv__worker__sampling__init(&o->sp);
	enum { O_IDS = 256, O_STATS, O_KEEP, O_STATUS, O_TOKENIDS, O_RESUME, O_SEQ, O_TIMEOUT,
	       O_TEMP, O_TOPK, O_TOPP };
	static const struct option opts[] = {
		{ "help", no_argument, NULL, 'h' },	 { "ids", no_argument, NULL, O_IDS },
		{ "stats", no_argument, NULL, O_STATS }, { "keep", no_argument, NULL, O_KEEP },
		{ "status", no_argument, NULL, O_STATUS },
		{ "endpoint", required_argument, NULL, 'e' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "file", required_argument, NULL, 'f' },
		{ "token-ids", required_argument, NULL, O_TOKENIDS },
		{ "resume", required_argument, NULL, O_RESUME },
		{ "seq", required_argument, NULL, O_SEQ },
		{ "n-predict", required_argument, NULL, 'n' },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "temp", required_argument, NULL, O_TEMP },
		{ "top-k", required_argument, NULL, O_TOPK },
		{ "top-p", required_argument, NULL, O_TOPP },
		{ "seed", required_argument, NULL, 's' },
		{ 0, 0, 0, 0 },
	};
	optind = 0;
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":he:p:f:n:s:", opts, NULL)) != -1) {
		const char *v = optarg;
		long l;
		double d;
		switch (c) {
		case 'h': usage(stdout); return -1;
		case O_IDS: o->ids = true; break;
		case O_STATS: o->stats = true; break;
		case O_KEEP: o->keep = true; break;
		case O_STATUS: o->status = true; break;
		case 'e': o->endpoint = v; break;
		case 'p': o->prompt = v; break;
		case 'f': o->file = v; break;
		case O_TOKENIDS: o->token_ids = v; break;
		case O_RESUME: o->resume = v; break;
		case O_SEQ: o->seq = v; break;
		case 'n':
			if (cmd_parse_long(v, 0, 1L << 30, &o->n))
				return bad("-n", v);
			break;
		case O_TIMEOUT:
			if (cmd_parse_long(v, 1, 86400000, &o->timeout_ms))
				return bad("--timeout", v);
			break;
		case O_TEMP:
			if (cmd_parse_float(v, 0.0, 100.0, &d))
				return bad("--temp", v);
			o->sp.has_temp = true;
			o->sp.temp = (float)d;
			break;
		case O_TOPK:
			if (cmd_parse_long(v, 0, 1L << 30, &l))
				return bad("--top-k", v);
			o->sp.has_top_k = true;
			o->sp.top_k = (uint32_t)l;
			break;
		case O_TOPP:
			if (cmd_parse_float(v, 0.0, 1.0, &d))
				return bad("--top-p", v);
			o->sp.has_top_p = true;
			o->sp.top_p = (float)d;
			break;
		case 's':
			if (cmd_parse_u64(v, &o->sp.seed))
				return bad("--seed", v);
			o->sp.has_seed = true;
			break;
		default:
			cmd_getopt_error("kvworker client", c, argv);
			usage(stderr);
			return CMD_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvworker client: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return CMD_USAGE;
	}
	int modes = !!o->prompt + !!o->file + !!o->token_ids + !!o->resume + o->status;
	if (!o->endpoint || modes != 1) {
		fprintf(stderr, "kvworker client: need -e and exactly one of -p, -f, --token-ids, "
				"--resume, --status\n");
		usage(stderr);
		return CMD_USAGE;
	}
	if (o->resume && o->seq) {
		fprintf(stderr, "kvworker client: --seq names a new sequence; --resume names the "
				"one to continue\n");
		return CMD_USAGE;
	}
	return 0;
}

/* "1,2 3" -> ids; 0 or -EINVAL. *out is malloc'ed. */
static int parse_ids(const char *s, int32_t **out, size_t *n)
{
	size_t cap = 16, k = 0;
	int32_t *ids = malloc(cap * sizeof *ids);
	while (ids && *s) {
		while (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n')
			s++;
		if (!*s)
			break;
		char *end;
		errno = 0;
		long v = strtol(s, &end, 10);
		if (errno || end == s || v < 0 || v > INT32_MAX || k >= CLIENT_MAX_IDS) {
			free(ids);
			return -EINVAL;
		}
		if (k == cap) {
			int32_t *nb = realloc(ids, cap * 2 * sizeof *ids);
			if (!nb)
				break;
			ids = nb;
			cap *= 2;
		}
		ids[k++] = (int32_t)v;
		s = end;
	}
	if (!ids)
		return -ENOMEM;
	if (!k) {
		free(ids);
		return -EINVAL;
	}
	*out = ids;
	*n = k;
	return 0;
}

static int send_request(void *sock, const Freekv__Worker__Request *rq)
{
	size_t len = freekv__worker__request__get_packed_size(rq);
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	freekv__worker__request__pack(rq, buf);
	int ret = zmq_send(sock, buf, len, 0) < 0 ? -errno : 0;
	free(buf);
	return ret;
}

/* The next reply, or NULL after the timeout (or an interruption by SIGINT: *interrupted). */
static Freekv__Worker__Reply *recv_reply(void *sock, long timeout_ms, bool *interrupted)
{
	double deadline = clock_ms_f() + (double)timeout_ms;
	for (;;) {
		zmq_pollitem_t it = { .socket = sock, .events = ZMQ_POLLIN };
		int n = zmq_poll(&it, 1, 100);
		if (n < 0 && errno != EINTR)
			return NULL;
		if (g_cancel && !*interrupted) {
			*interrupted = true;
			return NULL;
		}
		if (n > 0) {
			zmq_msg_t m;
			zmq_msg_init(&m);
			if (zmq_msg_recv(&m, sock, 0) < 0) {
				zmq_msg_close(&m);
				continue;
			}
			Freekv__Worker__Reply *r =
				freekv__worker__reply__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
			zmq_msg_close(&m);
			if (r)
				return r;
			fprintf(stderr, "kvworker client: a malformed reply ignored\n");
		}
		if (clock_ms_f() > deadline)
			return NULL;
	}
}

static void print_status(const Freekv__Worker__StatusReply *s)
{
	printf("model     %s\npolicy    %s\nbackend   %s", s->model, s->policy, s->backend);
	if (s->gpu >= 0)
		printf(" (--gpu %d)", s->gpu);
	printf("\nactive    %zu of %u, %u waiting\nrequests  %llu done\n"
	       "tokens    %llu generated in %llu steps\nuptime    %.1f s\n", s->n_active,
	       s->max_seqs, s->queued,
	       (unsigned long long)s->requests_served, (unsigned long long)s->tokens_generated,
	       (unsigned long long)s->steps, s->uptime_s);
	for (size_t i = 0; i < s->n_active; i++)
		printf("  request %llu  seq %s  %llu tokens  %u/%u generated\n",
		       (unsigned long long)s->active[i]->request_id, s->active[i]->seq,
		       (unsigned long long)s->active[i]->seq_tokens, s->active[i]->generated_tokens,
		       s->active[i]->n);
}

static void print_done(const Freekv__Worker__Done *d, bool stats)
{
	if (strcmp(d->reason, "eos") && strcmp(d->reason, "length"))
		fprintf(stderr, "kvworker client: stopped (%s); sequence '%s' %s at %llu tokens\n",
			d->reason, d->seq, d->kept ? "kept" : "dropped",
			(unsigned long long)d->seq_tokens);
	if (!stats)
		return;
	struct json_object *o = json_object_new_object();
	json_object_object_add(o, "seq", json_object_new_string(d->seq));
	json_object_object_add(o, "reason", json_object_new_string(d->reason));
	json_object_object_add(o, "prompt_tokens", json_object_new_int64(d->prompt_tokens));
	json_object_object_add(o, "generated_tokens", json_object_new_int64(d->generated_tokens));
	json_object_object_add(o, "seq_tokens", json_object_new_uint64(d->seq_tokens));
	json_object_object_add(o, "kept", json_object_new_boolean(d->kept));
	json_object_object_add(o, "prefill_ms", json_object_new_double(d->prefill_ms));
	json_object_object_add(o, "decode_ms", json_object_new_double(d->decode_ms));
	json_object_object_add(o, "decode_tok_s", json_object_new_double(d->decode_tok_s));
	json_object_object_add(o, "max_batch", json_object_new_int64(d->max_batch));
	fprintf(stderr, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
}

/* Sends the request and reads replies until its final one. */
static int exchange(void *sock, const struct client_opts *o, Freekv__Worker__Request *rq)
{
	if (send_request(sock, rq))
		return CLIENT_UNREACHABLE;
	bool interrupted = false;
	uint32_t printed = 0;
	for (;;) {
		Freekv__Worker__Reply *r = recv_reply(sock, o->timeout_ms, &interrupted);
		if (!r && interrupted) {
			Freekv__Worker__Cancel c = FREEKV__WORKER__CANCEL__INIT;
			Freekv__Worker__Request cr = FREEKV__WORKER__REQUEST__INIT;
			c.target_id = rq->id;
			cr.version = rq->version;
			cr.id = rq->id + 1;
			cr.body_case = FREEKV__WORKER__REQUEST__BODY_CANCEL;
			cr.cancel = &c;
			send_request(sock, &cr);
			continue;
		}
		if (!r) {
			if (printed)
				printf("\n");
			fprintf(stderr, "kvworker client: no reply from %s within %ld ms\n", o->endpoint,
				o->timeout_ms);
			return CLIENT_UNREACHABLE;
		}
		if (r->id != rq->id) { /* the Cancel's acknowledgement, or a stale reply */
			if (r->status < 0 && r->id != rq->id + 1)
				fprintf(stderr, "kvworker client: worker: %s\n", r->error ? r->error : "");
			freekv__worker__reply__free_unpacked(r, NULL);
			continue;
		}
		if (r->status < 0) {
			if (printed)
				printf("\n");
			fprintf(stderr, "kvworker client: refused: %s (%s)\n",
				r->error ? r->error : "", strerror(-r->status));
			freekv__worker__reply__free_unpacked(r, NULL);
			return CMD_FAIL;
		}
		int rc = -1;
		switch (r->body_case) {
		case FREEKV__WORKER__REPLY__BODY_PIECE:
			if (o->ids)
				printf(printed ? " %d" : "%d", r->piece->token_id);
			else if (r->piece->has_text)
				fwrite(r->piece->text.data, 1, r->piece->text.len, stdout);
			printed++;
			fflush(stdout);
			break;
		case FREEKV__WORKER__REPLY__BODY_DONE:
			if (o->ids || printed)
				printf("\n");
			fflush(stdout);
			print_done(r->done, o->stats);
			rc = CMD_OK;
			break;
		case FREEKV__WORKER__REPLY__BODY_STATUS_REPLY:
			print_status(r->status_reply);
			rc = CMD_OK;
			break;
		default:
			fprintf(stderr, "kvworker client: unexpected reply\n");
			rc = CMD_FAIL;
			break;
		}
		freekv__worker__reply__free_unpacked(r, NULL);
		if (rc >= 0)
			return rc;
	}
}

int cmd_client(int argc, char **argv)
{
	struct client_opts o;
	int ret = parse(argc, argv, &o);
	if (ret)
		return ret < 0 ? CMD_OK : ret;
	char *text = NULL;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	if (o.file || (o.prompt && !strcmp(o.prompt, "-"))) {
		const char *path = o.file ? o.file : "-";
		if ((ret = cmd_read_text(path, &text))) {
			fprintf(stderr, "kvworker client: cannot read %s: %s\n", path, strerror(-ret));
			return CMD_FAIL;
		}
	}
	if (o.token_ids && parse_ids(o.token_ids, &ids, &n_ids)) {
		fprintf(stderr, "kvworker client: --token-ids: need non-negative integers\n");
		return CMD_USAGE;
	}
	Freekv__Worker__Request rq = FREEKV__WORKER__REQUEST__INIT;
	Freekv__Worker__Generate g = FREEKV__WORKER__GENERATE__INIT;
	Freekv__Worker__Resume rs = FREEKV__WORKER__RESUME__INIT;
	Freekv__Worker__Status st = FREEKV__WORKER__STATUS__INIT;
	rq.version = FREEKV__WORKER__WORKER_PROTOCOL_VERSION__WORKER_PROTOCOL_VERSION_CURRENT;
	/* Ids are per client connection; odd ones leave id + 1 free for a Cancel. */
	rq.id = ((uint64_t)time(NULL) << 20 | (uint64_t)getpid()) * 2 + 1;
	if (o.status) {
		rq.body_case = FREEKV__WORKER__REQUEST__BODY_STATUS;
		rq.status = &st;
	} else if (o.resume) {
		rs.seq = (char *)o.resume;
		rs.n = (uint32_t)o.n;
		rs.sampling = &o.sp;
		rs.has_keep = true;
		rs.keep = o.keep;
		rq.body_case = FREEKV__WORKER__REQUEST__BODY_RESUME;
		rq.resume = &rs;
	} else {
		g.prompt = text ? text : (char *)o.prompt;
		g.token_ids = ids;
		g.n_token_ids = n_ids;
		g.n = (uint32_t)o.n;
		g.sampling = &o.sp;
		g.seq = (char *)o.seq;
		g.has_keep = true;
		g.keep = o.keep;
		rq.body_case = FREEKV__WORKER__REQUEST__BODY_GENERATE;
		rq.generate = &g;
	}
	void *ctx = zmq_ctx_new(), *sock = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
	int rc = CLIENT_UNREACHABLE;
	if (!sock) {
		fprintf(stderr, "kvworker client: cannot create a ZeroMQ socket\n");
		goto out;
	}
	int zero = 0;
	zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
	if (zmq_connect(sock, o.endpoint)) {
		fprintf(stderr, "kvworker client: cannot connect to %s: %s\n", o.endpoint,
			zmq_strerror(errno));
		goto out;
	}
	struct sigaction sa = { .sa_handler = on_int };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	rc = exchange(sock, &o, &rq);
out:
	if (sock)
		zmq_close(sock);
	if (ctx)
		zmq_ctx_term(ctx);
	free(ids);
	free(text);
	return rc;
}
