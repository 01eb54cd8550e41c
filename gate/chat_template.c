/* chat_template — see chat_template.h. The layouts follow each family's published template:
 * Llama 3 (meta-llama/Meta-Llama-3-8B-Instruct), Llama 2 (Llama-2-7b-chat-hf), ChatML
 * (Qwen2-7B-Instruct), Mistral (Mistral-7B-Instruct-v0.2). */
#include "chat_template.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {
	[CHAT_NONE] = "none", [CHAT_LLAMA3] = "llama3", [CHAT_LLAMA2] = "llama2",
	[CHAT_CHATML] = "chatml", [CHAT_MISTRAL] = "mistral",
};

const char *chat_family_name(enum chat_family f)
{
	return (unsigned)f < sizeof names / sizeof *names ? names[f] : "none";
}

int chat_family_parse(const char *name, enum chat_family *out)
{
	for (int f = CHAT_LLAMA3; f <= CHAT_MISTRAL; f++)
		if (!strcmp(name, names[f])) {
			*out = (enum chat_family)f;
			return 0;
		}
	if (!strcmp(name, "qwen")) {
		*out = CHAT_CHATML;
		return 0;
	}
	return -EINVAL;
}

enum chat_family chat_family_detect(const char *t)
{
	if (!t)
		return CHAT_NONE;
	if (strstr(t, "<|start_header_id|>") && strstr(t, "<|end_header_id|>") && strstr(t, "<|eot_id|>"))
		return CHAT_LLAMA3;
	if (strstr(t, "<|im_start|>") && strstr(t, "<|im_end|>"))
		return CHAT_CHATML;
	/* Both use [INST]; only Llama 2 wraps the system prompt in <<SYS>>. */
	if (strstr(t, "[INST]") && strstr(t, "[/INST]"))
		return strstr(t, "<<SYS>>") ? CHAT_LLAMA2 : CHAT_MISTRAL;
	return CHAT_NONE;
}

struct sb {
	char *p;
	size_t len, cap;
	int err;
};

static void put(struct sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct sb *b, const char *fmt, ...)
{
	if (b->err)
		return;
	va_list ap;
	va_start(ap, fmt);
	va_list cp;
	va_copy(cp, ap);
	int n = vsnprintf(NULL, 0, fmt, cp);
	va_end(cp);
	if (n < 0) {
		b->err = -EINVAL;
	} else {
		if (b->len + (size_t)n + 1 > b->cap) {
			size_t cap = (b->len + (size_t)n + 1) * 2;
			char *p = realloc(b->p, cap);
			if (!p) {
				b->err = -ENOMEM;
				va_end(ap);
				return;
			}
			b->p = p;
			b->cap = cap;
		}
		vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		b->len += (size_t)n;
	}
	va_end(ap);
}

/* Jinja's `| trim`: a copy without leading and trailing white space. */
static char *trimmed(const char *s)
{
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
		n--;
	return strndup(s, n);
}

static int role_of(const char *r)
{
	if (!strcmp(r, "system"))
		return 0;
	if (!strcmp(r, "user"))
		return 1;
	if (!strcmp(r, "assistant"))
		return 2;
	return -1;
}

/* Llama 2 and Mistral: an optional leading system message, then user/assistant alternating
 * from user, ending with user. */
static int inst_family(struct sb *b, bool llama2, const struct chat_msg *m, int n, char *err,
		       size_t errlen)
{
	const char *sys = NULL;
	int i = 0;
	if (role_of(m[0].role) == 0) {
		sys = m[0].content;
		i = 1;
	}
	if (i >= n)
		return snprintf(err, errlen, "messages: need a user message after the system "
				"message"), -EINVAL;
	for (int k = i; k < n; k++) {
		int want = (k - i) % 2 == 0 ? 1 : 2;
		if (role_of(m[k].role) != want)
			return snprintf(err, errlen, "messages[%d]: the %s chat template needs "
					"user and assistant messages alternating from user "
					"(one system message first at most)", k,
					llama2 ? "llama2" : "mistral"), -EINVAL;
	}
	if (role_of(m[n - 1].role) != 1)
		return snprintf(err, errlen, "messages: the last message must be from the user"),
		       -EINVAL;
	for (int k = i; k < n; k++) {
		char *c = trimmed(m[k].content);
		if (!c)
			return -ENOMEM;
		if (role_of(m[k].role) == 1) {
			/* Every turn after the first opens with BOS; the first's is the worker's. */
			if (k > i)
				put(b, "<s>");
			if (k == i && sys) {
				char *s = trimmed(sys);
				if (!s) {
					free(c);
					return -ENOMEM;
				}
				if (llama2)
					put(b, "[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", s, c);
				else
					put(b, "[INST] %s\n\n%s [/INST]", s, c);
				free(s);
			} else {
				put(b, "[INST] %s [/INST]", c);
			}
		} else {
			put(b, llama2 ? " %s </s>" : "%s</s>", c);
		}
		free(c);
	}
	return 0;
}

int chat_render(enum chat_family f, const struct chat_msg *m, int n, char **out, char *err,
		size_t errlen)
{
	*out = NULL;
	if (n <= 0)
		return snprintf(err, errlen, "messages: at least one message is required"), -EINVAL;
	for (int k = 0; k < n; k++)
		if (role_of(m[k].role) < 0)
			return snprintf(err, errlen, "messages[%d].role: '%s' is not one of system, "
					"user, assistant", k, m[k].role), -EINVAL;
	struct sb b = { 0 };
	int ret = 0;
	switch (f) {
	case CHAT_LLAMA3:
		for (int k = 0; k < n; k++) {
			char *c = trimmed(m[k].content);
			if (!c) {
				ret = -ENOMEM;
				break;
			}
			put(&b, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", m[k].role, c);
			free(c);
		}
		put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
		break;
	case CHAT_CHATML:
		for (int k = 0; k < n; k++)
			put(&b, "<|im_start|>%s\n%s<|im_end|>\n", m[k].role, m[k].content);
		put(&b, "<|im_start|>assistant\n");
		break;
	case CHAT_LLAMA2:
	case CHAT_MISTRAL:
		ret = inst_family(&b, f == CHAT_LLAMA2, m, n, err, errlen);
		break;
	default:
		ret = -EINVAL;
		snprintf(err, errlen, "no chat template");
		break;
	}
	if (!ret && b.err)
		ret = b.err;
	if (ret == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	if (ret) {
		free(b.p);
		return ret;
	}
	if (!b.p && !(b.p = strdup("")))
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	*out = b.p;
	return 0;
}
