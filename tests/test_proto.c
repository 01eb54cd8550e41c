/* Tests the generated protobuf-c code for proto/kvstore.proto: every request body survives a
 * pack/unpack round trip, and truncated or random bytes are rejected rather than misread. */
#include "test_util.h"

#include "proto/kvstore.pb-c.h"

static Freekv__Request *roundtrip_request(const Freekv__Request *in)
{
	size_t n = freekv__request__get_packed_size(in);
	uint8_t *buf = malloc(n);
	assert_non_null(buf);
	assert_int_equal(freekv__request__pack(in, buf), n);
	Freekv__Request *out = freekv__request__unpack(NULL, n, buf);
	free(buf);
	assert_non_null(out);
	return out;
}

static void test_open_sequence_roundtrip(void **state)
{
	(void)state;
	Freekv__Request req = FREEKV__REQUEST__INIT;
	Freekv__OpenSequence open = FREEKV__OPEN_SEQUENCE__INIT;
	Freekv__Geometry geo = FREEKV__GEOMETRY__INIT;
	uint8_t fp[32];
	uint32_t tokens[100];
	for (int i = 0; i < 32; i++)
		fp[i] = (uint8_t)(i * 7);
	for (int i = 0; i < 100; i++)
		tokens[i] = (uint32_t)(i * 131 % 512);
	geo.n_layers = 32;
	geo.n_kv_heads = 8;
	geo.head_dim = 128;
	geo.page_size = 32;
	geo.dtype = FREEKV__DTYPE__DTYPE_BF16;
	open.name = "chat-42";
	open.model_fingerprint.data = fp;
	open.model_fingerprint.len = sizeof fp;
	open.geometry = &geo;
	open.n_token_ids = 100;
	open.token_ids = tokens;
	req.version = FREEKV__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
	req.id = 0x123456789abcull;
	req.body_case = FREEKV__REQUEST__BODY_OPEN_SEQUENCE;
	req.open_sequence = &open;

	Freekv__Request *out = roundtrip_request(&req);
	assert_int_equal(out->version, 1);
	assert_int_equal(out->id, 0x123456789abcull);
	assert_int_equal(out->body_case, FREEKV__REQUEST__BODY_OPEN_SEQUENCE);
	assert_string_equal(out->open_sequence->name, "chat-42");
	assert_int_equal(out->open_sequence->geometry->head_dim, 128);
	assert_int_equal(out->open_sequence->geometry->dtype, FREEKV__DTYPE__DTYPE_BF16);
	assert_memory_equal(out->open_sequence->model_fingerprint.data, fp, 32);
	assert_int_equal(out->open_sequence->n_token_ids, 100);
	assert_memory_equal(out->open_sequence->token_ids, tokens, sizeof tokens);
	assert_true(out->open_sequence->create); /* default */
	freekv__request__free_unpacked(out, NULL);
}

static void test_reply_roundtrip(void **state)
{
	(void)state;
	Freekv__Reply rep = FREEKV__REPLY__INIT;
	Freekv__Welcome w = FREEKV__WELCOME__INIT;
	w.worker_id = 3;
	w.pool_name = "/freekv-pool";
	w.pool_bytes = 1ull << 34;
	w.ring_name = "/freekv-ring-3";
	w.ring_entries = 1024;
	w.heartbeat_ms = 250;
	rep.id = 9;
	rep.status = -28; /* -ENOSPC: sint32 zig-zag encoding */
	rep.error = "pool full";
	rep.body_case = FREEKV__REPLY__BODY_WELCOME;
	rep.welcome = &w;
	size_t n = freekv__reply__get_packed_size(&rep);
	uint8_t buf[256];
	assert_true(n <= sizeof buf);
	freekv__reply__pack(&rep, buf);
	Freekv__Reply *out = freekv__reply__unpack(NULL, n, buf);
	assert_non_null(out);
	assert_int_equal(out->status, -28);
	assert_string_equal(out->error, "pool full");
	assert_int_equal(out->body_case, FREEKV__REPLY__BODY_WELCOME);
	assert_int_equal(out->welcome->pool_bytes, 1ull << 34);
	assert_string_equal(out->welcome->ring_name, "/freekv-ring-3");
	freekv__reply__free_unpacked(out, NULL);
}

static void test_truncated_and_random_bytes_rejected(void **state)
{
	(void)state;
	Freekv__Request req = FREEKV__REQUEST__INIT;
	Freekv__Hello hello = FREEKV__HELLO__INIT;
	hello.role = FREEKV__CLIENT_ROLE__CLIENT_ROLE_WORKER;
	hello.pid = 4242;
	hello.name = "gpu0";
	req.version = 1;
	req.id = 77;
	req.body_case = FREEKV__REQUEST__BODY_HELLO;
	req.hello = &hello;
	uint8_t buf[128];
	size_t n = freekv__request__pack(&req, buf);
	/* A strict prefix either lacks a required field, cuts a field short, or (cut exactly
	 * after the header fields) decodes with no body, which the daemon must refuse. */
	int headers_only = 0;
	for (size_t cut = 0; cut < n; cut++) {
		Freekv__Request *out = freekv__request__unpack(NULL, cut, buf);
		if (out) {
			assert_int_equal(out->body_case, FREEKV__REQUEST__BODY__NOT_SET);
			headers_only++;
			freekv__request__free_unpacked(out, NULL);
		}
	}
	assert_int_equal(headers_only, 1);
	/* Random garbage either fails to decode or decodes to something freeable; never crashes. */
	uint64_t rng = 5;
	int rejected = 0;
	for (int i = 0; i < 2000; i++) {
		size_t len = test_rand(&rng) % sizeof buf;
		for (size_t k = 0; k < len; k++)
			buf[k] = (uint8_t)test_rand(&rng);
		Freekv__Request *out = freekv__request__unpack(NULL, len, buf);
		if (out)
			freekv__request__free_unpacked(out, NULL);
		else
			rejected++;
	}
	assert_true(rejected > 1900);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_sequence_roundtrip),
		cmocka_unit_test(test_reply_roundtrip),
		cmocka_unit_test(test_truncated_and_random_bytes_rejected),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
