/* gate/chat_template.c: each family is recognised from its published Jinja source (excerpts
 * that carry the markers the detector reads) and nothing else is; rendering writes each
 * family's layout byte for byte; bad role orders are refused with a message. */
#include "test_util.h"

#include <errno.h>

#include "chat_template.h"

/* Excerpts of the published templates. */
static const char llama3[] =
	"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
	"'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] "
	"| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
	"{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
	"'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
static const char llama2[] =
	"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
	"system_message = messages[0]['content'] %}{% endif %}{% for message in loop_messages %}"
	"{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
	"system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% endif %}{% if "
	"message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
	"{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
	"{% endif %}{% endfor %}";
static const char chatml[] =
	"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
	"'<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' "
	"+ message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
	"add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
static const char mistral[] =
	"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
	"(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
	"user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
	"'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
	"{{ message['content'] + eos_token}}{% endif %}{% endfor %}";
static const char zephyr[] =
	"{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + "
	"message['content'] + eos_token }}{% endif %}{% endfor %}";

static void test_detect(void **state)
{
	(void)state;
	assert_int_equal(chat_family_detect(llama3), CHAT_LLAMA3);
	assert_int_equal(chat_family_detect(llama2), CHAT_LLAMA2);
	assert_int_equal(chat_family_detect(chatml), CHAT_CHATML);
	assert_int_equal(chat_family_detect(mistral), CHAT_MISTRAL);
	assert_int_equal(chat_family_detect(zephyr), CHAT_NONE);
	assert_int_equal(chat_family_detect(""), CHAT_NONE);
	assert_int_equal(chat_family_detect(NULL), CHAT_NONE);
	enum chat_family f;
	assert_int_equal(chat_family_parse("qwen", &f), 0);
	assert_int_equal(f, CHAT_CHATML);
	assert_int_equal(chat_family_parse("llama3", &f), 0);
	assert_int_equal(f, CHAT_LLAMA3);
	assert_int_equal(chat_family_parse("jinja", &f), -EINVAL);
}

static void expect(enum chat_family f, const struct chat_msg *m, int n, const char *want)
{
	char *out, err[256];
	assert_int_equal(chat_render(f, m, n, &out, err, sizeof err), 0);
	assert_string_equal(out, want);
	free(out);
}

static void test_render(void **state)
{
	(void)state;
	const struct chat_msg conv[] = { { "system", "Be brief." }, { "user", " Hi " },
					 { "assistant", "Hello." }, { "user", "Bye" } };
	expect(CHAT_LLAMA3, conv, 4,
	       "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
	       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
	       "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
	       "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
	       "<|start_header_id|>assistant<|end_header_id|>\n\n");
	expect(CHAT_LLAMA2, conv, 4,
	       "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]");
	expect(CHAT_MISTRAL, conv, 4, "[INST] Be brief.\n\nHi [/INST]Hello.</s><s>[INST] Bye [/INST]");
	expect(CHAT_CHATML, conv, 4,
	       "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
	       "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
	       "<|im_start|>assistant\n");
	expect(CHAT_LLAMA2, conv + 1, 1, "[INST] Hi [/INST]");
}

static void test_refused(void **state)
{
	(void)state;
	char *out = NULL, err[256];
	const struct chat_msg two_users[] = { { "user", "a" }, { "user", "b" } };
	assert_int_equal(chat_render(CHAT_LLAMA2, two_users, 2, &out, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "alternating"));
	const struct chat_msg ends_assistant[] = { { "user", "a" }, { "assistant", "b" } };
	assert_int_equal(chat_render(CHAT_MISTRAL, ends_assistant, 2, &out, err, sizeof err), -EINVAL);
	const struct chat_msg wizard[] = { { "wizard", "a" } };
	assert_int_equal(chat_render(CHAT_CHATML, wizard, 1, &out, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "wizard"));
	assert_int_equal(chat_render(CHAT_LLAMA3, wizard, 0, &out, err, sizeof err), -EINVAL);
	assert_int_equal(chat_render(CHAT_NONE, two_users, 1, &out, err, sizeof err), -EINVAL);
	assert_null(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_detect),
		cmocka_unit_test(test_render),
		cmocka_unit_test(test_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
