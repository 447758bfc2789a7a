/* reasoning.h — splits a model's streamed output into reasoning and content at the end tag
 * of its thinking block ("</think>"), chunking-independently: any split of the same text into
 * fed pieces gives the same two strings.
 *
 * Whitespace rule (chosen so that an assistant message built from our response renders back to
 * the same prompt text under the Qwen template, which writes reasoning_content.strip('\n') and
 * content.lstrip('\n')): newlines at both ends of the reasoning and at the start of the content
 * are dropped. Text after the end tag is content even if it holds another tag. When the output
 * ends inside the block (no end tag), everything is reasoning. */
#ifndef DS_SERVER_REASONING_H
#define DS_SERVER_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "server/strbuf.h"

typedef enum ds_reasoning_state {
    DS_REASONING_START = 0, /* inside the block, nothing released yet (leading \n dropped) */
    DS_REASONING_IN,        /* inside the block */
    DS_REASONING_CONTENT_START, /* after the end tag, leading \n dropped */
    DS_REASONING_CONTENT,   /* plain content */
} ds_reasoning_state;

typedef struct ds_reasoning_split {
    const char *end_tag;
    size_t end_len;
    ds_reasoning_state state;
    ds_strbuf held; /* inside the block: trailing newlines + a possible partial end tag */
} ds_reasoning_split;

/* in_reasoning false: everything is content (no tag is looked for). */
void ds_reasoning_init(ds_reasoning_split *s, const char *end_tag, bool in_reasoning);
void ds_reasoning_free(ds_reasoning_split *s);
/* Appends the released parts of text[len] to *reasoning and *content. */
void ds_reasoning_feed(ds_reasoning_split *s, const char *text, size_t len, ds_strbuf *reasoning,
                       ds_strbuf *content);
/* End of output: releases what is held (as reasoning, minus trailing newlines). */
void ds_reasoning_flush(ds_reasoning_split *s, ds_strbuf *reasoning, ds_strbuf *content);

#endif
