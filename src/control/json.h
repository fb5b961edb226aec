/* JSON for the control plane: the splitter that cuts a QMP byte stream into
 * top-level JSON values (framing only: it tracks strings, escapes and nesting;
 * jansson parses each value), and the parse wrapper that words errors as
 * QEMU does ("JSON parse error, ...").
 *
 * THREADING RULE: none shared; a struct json_split belongs to its caller. */
#ifndef IOPLANE_CONTROL_JSON_H
#define IOPLANE_CONTROL_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits on one message. QEMU allows 64 MiB of tokens; a real QMP command is
 * a few KiB, and jansson needs about 50 bytes per value, so 1 MiB of input
 * costs at most a few tens of MiB for the moment it is parsed. */
#define JSON_SPLIT_MAX_BYTES (1u << 20)
#define JSON_SPLIT_MAX_DEPTH 1024   /* as QEMU's */
#define JSON_SPLIT_MAX_TOKENS 65536 /* values and separators in one message */

enum json_split_result {
	JSON_SPLIT_MORE,  /* no message yet: feed the bytes after *used, if any */
	JSON_SPLIT_MSG,   /* one message in s->buf[0..s->len), NUL-terminated */
	JSON_SPLIT_ERROR, /* bad input (s->error): the stream goes on after it */
	JSON_SPLIT_FATAL, /* a message over JSON_SPLIT_MAX_BYTES: the stream cannot go on */
};

struct json_split {
	char *buf; /* the message being assembled (strings normalised to "...") */
	size_t len, cap;
	unsigned depth, tokens;
	unsigned char state;
	char quote; /* the open string's quote: '"' or '\'' */
	_Bool skip; /* discarding the rest of a value that broke a limit */
	char error[96];
};

void json_split_init(struct json_split *s);
void json_split_free(struct json_split *s);
/* Consume data up to the end of one message or error; *used says how many
 * bytes. Single-quoted strings (a QMP extension) and the \' escape come out
 * in standard JSON. The message stays valid until the next call. */
enum json_split_result json_split_feed(struct json_split *s, const uint8_t *data, size_t len,
				       size_t *used);

/* Parse one JSON value (any type, duplicate keys refused). On failure NULL,
 * and err gets "JSON parse error, REASON" (or, for text after the value,
 * "Expecting at most one JSON value", as QEMU's command line says). */
json_t *qjson_parse(const char *buf, size_t len, char *err, size_t errlen);

/* UTF-8 (RFC 3629: no overlong forms, no surrogates), which jansson demands of
 * every string. */
bool qjson_utf8_valid(const char *s, size_t len);
/* A JSON string of s with each invalid UTF-8 sequence replaced by U+FFFD: for
 * messages that quote input, or that a size limit cut in mid-character. */
json_t *qjson_string_lossy(const char *s);

#endif
