/* chat_template — turns an OpenAI `messages` list into the prompt text a model was trained on,
 * for the chat-template families kvgate knows (docs/design.md §6): Llama 3, Llama 2,
 * ChatML (Qwen and others) and Mistral. Models ship their template as Jinja source (GGUF
 * `tokenizer.chat_template`, tokenizer_config.json `chat_template`); kvgate does not run Jinja:
 * chat_family_detect() recognises the family from the markers the source contains and
 * chat_render() writes that family's layout with built-in code. An unrecognised template is
 * CHAT_NONE, and the caller refuses chat requests naming --chat-template.
 *
 * The beginning-of-sequence token is not written: `kvworker serve` tokenizes every prompt with
 * BOS (worker/serve/serve_batch.c), so rendered text starts right after it. Special tokens are
 * written as text; the worker's tokenizer matches them verbatim.
 *
 * Ownership: chat_render() returns a malloc'd string the caller frees; messages are borrowed. */
#ifndef FREEKV_CHAT_TEMPLATE_H
#define FREEKV_CHAT_TEMPLATE_H

#include <stddef.h>

enum chat_family { CHAT_NONE = 0, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_CHATML, CHAT_MISTRAL };

struct chat_msg {
	const char *role;	/* system, user, assistant */
	const char *content;
};

/* "llama3", "llama2", "chatml", "mistral"; "none" for CHAT_NONE. */
const char *chat_family_name(enum chat_family f);
/* A --chat-template NAME (also "qwen" for chatml); 0 or -EINVAL. */
int chat_family_parse(const char *name, enum chat_family *out);
/* The family a Jinja template belongs to, CHAT_NONE when unknown or NULL. */
enum chat_family chat_family_detect(const char *jinja);
/* The prompt for messages[0..n), ending where the assistant's reply starts. 0, -EINVAL (err
 * says why: no messages, unknown role, roles that the family cannot order) or -ENOMEM. */
int chat_render(enum chat_family f, const struct chat_msg *m, int n, char **out, char *err,
		size_t errlen);

#endif
