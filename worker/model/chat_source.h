/* chat_source — reads a model's chat template source: GGUF `tokenizer.chat_template`, or
 * `chat_template` of a Hugging Face folder's tokenizer_config.json (a string, or a list of
 * {name, template} of which "default" is taken), else the folder's chat_template.jinja.
 * `kvworker serve` reports it in its Status
 * reply so that kvgate can recognise the family (docs/design.md §6); nothing here interprets it.
 *
 * Ownership: *out is malloc'd (caller frees), NULL when the model has no template. */
#ifndef FREEKV_CHAT_SOURCE_H
#define FREEKV_CHAT_SOURCE_H

#include <stddef.h>

/* 0 (with *out, possibly NULL) or -errno with err set (unreadable file or folder). */
int model_chat_template(const char *path, char **out, char *err, size_t errlen);

#endif
