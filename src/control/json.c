/* The QMP stream splitter and the jansson parse wrapper (see json.h).
 *
 * QMP has no framing: a message ends where its top-level value does. The
 * splitter copies bytes into the message buffer while it follows strings
 * (with their escapes) and the nesting of {} and []; a top-level scalar ends
 * at the first byte that cannot continue it. What QEMU's lexer treats as a
 * lexical error resets it - a control character other than tab, CR and LF,
 * or a byte that never occurs in UTF-8 (the documented way for a client to
 * get a confused parser back into a known state) - and so it does here.
 * Unlike QEMU, a message that is nested too deep or has too many tokens gets
 * one error and the rest of it is skipped, instead of its tail being parsed
 * as a string of new messages.
 *
 * THREADING RULE: none shared. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/json.h"

enum {
	ST_TOP,    /* between messages */
	ST_VALUE,  /* inside an object or array, outside strings */
	ST_STR,    /* inside a string */
	ST_ESC,    /* after a backslash in a string */
	ST_SCALAR, /* a top-level number or keyword */
};

void json_split_init(struct json_split *s)
{
	memset(s, 0, sizeof(*s));
}

void json_split_free(struct json_split *s)
{
	free(s->buf);
	json_split_init(s);
}

static void split_restart(struct json_split *s)
{
	s->len = 0;
	s->depth = 0;
	s->tokens = 0;
	s->state = ST_TOP;
	s->skip = false;
}

/* Bytes that end any token in QEMU's lexer: ASCII controls other than
 * whitespace, and bytes that UTF-8 never uses. */
static bool lexical_error(uint8_t c)
{
	if (c < 0x20)
		return c != '\t' && c != '\n' && c != '\r';
	return c == 0xc0 || c == 0xc1 || c >= 0xf5;
}

static bool is_space(uint8_t c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_delim(uint8_t c)
{
	return is_space(c) || strchr("{}[],:\"'", c) != NULL;
}

/* 0, or -EFBIG when the message would outgrow the limit. */
static int split_put(struct json_split *s, const char *p, size_t n)
{
	size_t cap;
	char *b;

	if (s->skip)
		return 0;
	if (s->len + n + 1 > JSON_SPLIT_MAX_BYTES)
		return -EFBIG;
	if (s->len + n + 1 > s->cap) {
		cap = s->cap ? s->cap : 256;
		while (cap < s->len + n + 1)
			cap *= 2;
		if (cap > JSON_SPLIT_MAX_BYTES)
			cap = JSON_SPLIT_MAX_BYTES;
		b = realloc(s->buf, cap);
		if (!b)
			return -EFBIG; /* cannot hold it: as fatal as too big */
		s->buf = b;
		s->cap = cap;
	}
	memcpy(s->buf + s->len, p, n);
	s->len += n;
	s->buf[s->len] = '\0';
	return 0;
}

static enum json_split_result stray(struct json_split *s, uint8_t c)
{
	/* QEMU quotes the offending byte; one that is not ASCII becomes U+FFFD. */
	if (c < 0x80)
		snprintf(s->error, sizeof(s->error), "JSON parse error, stray '%c'", c);
	else
		snprintf(s->error, sizeof(s->error), "JSON parse error, stray '\xef\xbf\xbd'");
	split_restart(s);
	return JSON_SPLIT_ERROR;
}

static enum json_split_result limit_error(struct json_split *s, const char *what)
{
	snprintf(s->error, sizeof(s->error), "%s", what);
	s->skip = true;
	s->len = 0;
	return JSON_SPLIT_ERROR;
}

/* A byte of a string, after its opening quote. */
static int split_str(struct json_split *s, uint8_t c)
{
	if (s->state == ST_ESC) {
		s->state = ST_STR;
		/* \' is QMP's extra escape; standard JSON spells it '. */
		if (c == '\'')
			return split_put(s, "'", 1);
		return split_put(s, "\\", 1) < 0 ? -EFBIG : split_put(s, (char *)&c, 1);
	}
	if (c == '\\') {
		s->state = ST_ESC;
		return 0;
	}
	if (c == (uint8_t)s->quote) {
		s->state = s->depth ? ST_VALUE : ST_TOP;
		return split_put(s, "\"", 1);
	}
	if (c == '"') /* inside a single-quoted string */
		return split_put(s, "\\\"", 2);
	return split_put(s, (char *)&c, 1);
}

static bool msg_done(struct json_split *s)
{
	return !s->depth && s->state == ST_TOP;
}

/* A byte outside strings. *done: the message ended with it. */
static enum json_split_result split_structural(struct json_split *s, uint8_t c, bool *done)
{
	if (c == '"' || c == '\'') {
		s->quote = (char)c;
		s->state = ST_STR;
		return split_put(s, "\"", 1) ? JSON_SPLIT_FATAL : JSON_SPLIT_MORE;
	}
	if (c == '{' || c == '[') {
		if (++s->depth > JSON_SPLIT_MAX_DEPTH && !s->skip)
			return limit_error(s, "JSON nesting depth limit exceeded");
		s->state = ST_VALUE;
	} else if ((c == '}' || c == ']') && s->depth) {
		if (!--s->depth) {
			s->state = ST_TOP;
			*done = true;
		}
	} else if (!s->depth) {
		*done = true; /* a stray ']', ',', ...: a message of its own */
	}
	if ((c == ',' || c == ':' || c == '{' || c == '[') && ++s->tokens > JSON_SPLIT_MAX_TOKENS &&
	    !s->skip)
		return limit_error(s, "JSON token count limit exceeded");
	return split_put(s, (char *)&c, 1) ? JSON_SPLIT_FATAL : JSON_SPLIT_MORE;
}

/* One byte; *done when it completed a message (then *consumed says whether
 * the byte belongs to it: a top-level scalar ends at the next byte). */
static enum json_split_result split_byte(struct json_split *s, uint8_t c, bool *done,
					 bool *consumed)
{
	*consumed = true;
	if (lexical_error(c))
		return stray(s, c);
	if (s->state == ST_STR || s->state == ST_ESC) {
		if (split_str(s, c))
			return JSON_SPLIT_FATAL;
		*done = msg_done(s);
		return JSON_SPLIT_MORE;
	}
	if (s->state == ST_SCALAR) {
		if (is_delim(c)) {
			*consumed = false;
			*done = true;
			s->state = ST_TOP;
			return JSON_SPLIT_MORE;
		}
		return split_put(s, (char *)&c, 1) ? JSON_SPLIT_FATAL : JSON_SPLIT_MORE;
	}
	if (is_space(c)) {
		if (s->state == ST_VALUE && !s->skip)
			return split_put(s, (char *)&c, 1) ? JSON_SPLIT_FATAL : JSON_SPLIT_MORE;
		return JSON_SPLIT_MORE;
	}
	if (s->state == ST_TOP && !strchr("{}[],:\"'", c)) {
		s->state = ST_SCALAR;
		return split_put(s, (char *)&c, 1) ? JSON_SPLIT_FATAL : JSON_SPLIT_MORE;
	}
	return split_structural(s, c, done);
}

enum json_split_result json_split_feed(struct json_split *s, const uint8_t *data, size_t len,
				       size_t *used)
{
	enum json_split_result r = JSON_SPLIT_MORE;
	bool done = false, consumed;
	size_t i;

	if (msg_done(s) && !s->skip && s->len)
		s->len = 0; /* the previous message was handed out */
	for (i = 0; i < len && r == JSON_SPLIT_MORE && !done; i++) {
		r = split_byte(s, data[i], &done, &consumed);
		if (!consumed)
			i--;
	}
	*used = i;
	if (r == JSON_SPLIT_FATAL) {
		snprintf(s->error, sizeof(s->error), "JSON token size limit exceeded");
		split_restart(s);
		return r;
	}
	if (r != JSON_SPLIT_MORE || !done)
		return r;
	if (s->skip) { /* the end of a value that broke a limit: nothing to hand out */
		split_restart(s);
		return JSON_SPLIT_MORE;
	}
	return JSON_SPLIT_MSG;
}

/* jansson's reasons, in QEMU's words where QEMU has words for them. */
static const char *parse_reason(const json_error_t *e)
{
	switch (json_error_code(e)) {
	case json_error_duplicate_key:
		return "duplicate key";
	case json_error_invalid_utf8:
		return "invalid UTF-8 sequence in string";
	case json_error_premature_end_of_input:
		return "premature EOI";
	case json_error_null_character:
	case json_error_null_byte_in_key:
		return "\\u0000 in a string is not supported";
	case json_error_numeric_overflow:
		return "number out of range";
	default:
		return e->text;
	}
}

json_t *qjson_parse(const char *buf, size_t len, char *err, size_t errlen)
{
	json_error_t e;
	json_t *v = json_loadb(buf, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);

	if (v)
		return v;
	if (json_error_code(&e) == json_error_end_of_input_expected)
		snprintf(err, errlen, "Expecting at most one JSON value");
	else
		snprintf(err, errlen, "JSON parse error, %s", parse_reason(&e));
	return NULL;
}

/* Length of the valid UTF-8 sequence at s[0..len), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t len)
{
	unsigned char lo = 0x80, hi = 0xbf;
	size_t n, i;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4;
	else
		return 0;
	if (s[0] == 0xe0)
		lo = 0xa0; /* overlong */
	else if (s[0] == 0xed)
		hi = 0x9f; /* surrogates */
	else if (s[0] == 0xf0)
		lo = 0x90; /* overlong */
	else if (s[0] == 0xf4)
		hi = 0x8f; /* beyond U+10FFFF */
	if (len < n || s[1] < lo || s[1] > hi)
		return 0;
	for (i = 2; i < n; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return n;
}

bool qjson_utf8_valid(const char *s, size_t len)
{
	size_t i = 0, n;

	while (i < len) {
		n = utf8_seq((const unsigned char *)s + i, len - i);
		if (!n)
			return false;
		i += n;
	}
	return true;
}

json_t *qjson_string_lossy(const char *s)
{
	size_t len = strlen(s), i = 0, o = 0, n;
	char *buf;
	json_t *v;

	if (qjson_utf8_valid(s, len))
		return json_stringn(s, len);
	buf = malloc(3 * len + 1); /* a bad byte becomes 3 */
	if (!buf)
		return NULL;
	while (i < len) {
		n = utf8_seq((const unsigned char *)s + i, len - i);
		if (n) {
			memcpy(buf + o, s + i, n);
			o += n;
			i += n;
		} else {
			memcpy(buf + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	v = json_stringn(buf, o);
	free(buf);
	return v;
}
