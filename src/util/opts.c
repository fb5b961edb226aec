/* key=value option lists and the number/size/bool parsers behind them.
 * Syntax: elements separated by ','; ",," is a literal comma (in a value, or
 * in the implied first element); keys are non-empty and unique. Values are
 * copied, so the input string need not outlive the list.
 * Threading: a struct kv_opts belongs to its caller; the parsers are pure. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/compiler.h"
#include "util/opts.h"

static struct kv *kv_find(const struct kv_opts *o, const char *key)
{
	size_t i;

	for (i = 0; i < o->n; i++) {
		if (!strcmp(o->v[i].key, key))
			return &o->v[i];
	}
	return NULL;
}

/* Append, taking ownership of key and val (freed here on failure). */
static int kv_append(struct kv_opts *o, char *key, char *val)
{
	size_t cap;
	struct kv *v;

	if (o->n == o->cap) {
		cap = o->cap ? o->cap * 2 : 8;
		v = realloc(o->v, cap * sizeof(*v));
		if (!v)
			goto fail;
		o->v = v;
		o->cap = cap;
	}
	o->v[o->n++] = (struct kv){.key = key, .val = val, .used = false};
	return 0;
fail:
	free(key);
	free(val);
	return -ENOMEM;
}

int kv_set(struct kv_opts *o, const char *key, const char *val)
{
	struct kv *kv;
	char *k = NULL, *v;

	if (!key || !*key || !val)
		return -EINVAL;
	v = strdup(val);
	if (!v)
		return -ENOMEM;
	kv = kv_find(o, key);
	if (kv) {
		/* A new value has not been consumed yet. */
		free(kv->val);
		kv->val = v;
		kv->used = false;
		return 0;
	}
	k = strdup(key);
	if (!k) {
		free(v);
		return -ENOMEM;
	}
	return kv_append(o, k, v);
}

/* Copy s[0..] up to the first single ',' (or the end) into a new string,
 * turning ",," into ','. *end gets the position of the terminator. */
static char *kv_unescape(const char *s, const char **end)
{
	size_t len = 0, i = 0;
	const char *p;
	char *out;

	for (p = s; *p; p++, len++) {
		if (*p == ',') {
			if (p[1] != ',')
				break;
			p++;
		}
	}
	*end = p;
	out = malloc(len + 1);
	if (!out)
		return NULL;
	for (p = s; i < len; p++) {
		out[i++] = *p;
		if (*p == ',')
			p++;
	}
	out[len] = '\0';
	return out;
}

/* Parse one element starting at s; *next is left at the ',' or '\0' after it. */
static int kv_parse_one(struct kv_opts *o, const char *s, const char *implied_key,
			const char **next)
{
	size_t klen = strcspn(s, "=,");
	char *key = NULL, *val;

	if (s[klen] == '=') {
		if (klen == 0)
			return -EINVAL;
		key = strndup(s, klen);
		val = key ? kv_unescape(s + klen + 1, next) : NULL;
	} else {
		/* No '=' before the first ',': only valid as the implied element. */
		if (!implied_key)
			return -EINVAL;
		if (klen == 0 && !(s[0] == ',' && s[1] == ','))
			return -EINVAL; /* empty element */
		key = strdup(implied_key);
		val = key ? kv_unescape(s, next) : NULL;
	}
	if (!key || !val) {
		free(key);
		return -ENOMEM;
	}
	if (kv_find(o, key)) {
		free(key);
		free(val);
		return -EINVAL;
	}
	return kv_append(o, key, val);
}

static void kv_truncate(struct kv_opts *o, size_t n)
{
	while (o->n > n) {
		o->n--;
		free(o->v[o->n].key);
		free(o->v[o->n].val);
	}
}

/* Elements are appended to o; on failure o is left as it was. */
int kv_parse(struct kv_opts *o, const char *s, const char *implied_key)
{
	size_t n0 = o->n;
	const char *p = s;
	int ret = 0;

	if (!s)
		return -EINVAL;
	if (!*s)
		return 0;
	for (;;) {
		ret = kv_parse_one(o, p, p == s ? implied_key : NULL, &p);
		if (ret < 0)
			goto fail;
		if (!*p)
			return 0;
		p++; /* the separating ',' */
		if (!*p) {
			ret = -EINVAL; /* trailing ',' */
			goto fail;
		}
	}
fail:
	kv_truncate(o, n0);
	return ret;
}

void kv_free(struct kv_opts *o)
{
	kv_truncate(o, 0);
	free(o->v);
	o->v = NULL;
	o->cap = 0;
}

const char *kv_get(struct kv_opts *o, const char *key)
{
	struct kv *kv = kv_find(o, key);

	if (!kv)
		return NULL;
	kv->used = true;
	return kv->val;
}

int kv_get_bool(struct kv_opts *o, const char *key, bool *out)
{
	const char *v = kv_get(o, key);

	return v ? parse_bool(v, out) : 0;
}

int kv_get_u64(struct kv_opts *o, const char *key, uint64_t *out)
{
	const char *v = kv_get(o, key);

	return v ? parse_u64(v, out) : 0;
}

int kv_get_size(struct kv_opts *o, const char *key, uint64_t *out)
{
	const char *v = kv_get(o, key);

	return v ? parse_size(v, out) : 0;
}

const char *kv_first_unused(const struct kv_opts *o)
{
	size_t i;

	for (i = 0; i < o->n; i++) {
		if (!o->v[i].used)
			return o->v[i].key;
	}
	return NULL;
}

static int digit_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return 99;
}

/* Digits in `base` from *s on, advancing *s past them. -EINVAL if there are
 * none, -ERANGE on overflow (the digits are still consumed). */
static int parse_digits(const char **s, unsigned base, uint64_t *out)
{
	const char *p = *s;
	uint64_t v = 0;
	bool over = false;
	int d;

	for (; (d = digit_value(*p)) < (int)base; p++) {
		over |= __builtin_mul_overflow(v, base, &v);
		over |= __builtin_add_overflow(v, (uint64_t)d, &v);
	}
	if (p == *s)
		return -EINVAL;
	*s = p;
	if (over)
		return -ERANGE;
	*out = v;
	return 0;
}

/* No sign, no whitespace: strtoull would accept both (and negate "-1"). */
int parse_u64(const char *s, uint64_t *out)
{
	unsigned base = 10;
	uint64_t v;
	int ret;

	if (!s)
		return -EINVAL;
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		s += 2;
	}
	ret = parse_digits(&s, base, &v);
	if (ret == 0 && *s)
		ret = -EINVAL;
	if (ret == 0)
		*out = v;
	return ret;
}

/* Power-of-two shift for a size suffix, or -1. Accepts "", "B", "K", "KB",
 * "KiB" and so on, case-insensitively. */
static int size_suffix_shift(const char *s)
{
	static const char units[] = "KMGTPE";
	const char *u;

	if (!*s)
		return 0;
	if ((s[0] == 'b' || s[0] == 'B') && !s[1])
		return 0;
	u = memchr(units, toupper((unsigned char)s[0]), sizeof(units) - 1);
	if (!u)
		return -1;
	s++;
	if (*s == 'i' || *s == 'I')
		s++;
	else if (!*s)
		return (int)(u - units + 1) * 10;
	if ((*s != 'b' && *s != 'B') || s[1])
		return -1;
	return (int)(u - units + 1) * 10;
}

/* Exact decimal fraction `frac` / 10^digits of 2^shift bytes, or -EINVAL if it
 * is not a whole number of bytes (0.1K). 2^shift / 10^d = 2^(shift-d) / 5^d. */
static int size_fraction(uint64_t frac, int digits, int shift, uint64_t *out)
{
	uint64_t pow5 = 1;
	int i;

	for (; digits > 0 && frac % 10 == 0; digits--)
		frac /= 10;
	if (frac == 0) {
		*out = 0;
		return 0;
	}
	if (digits > shift)
		return -EINVAL;
	for (i = 0; i < digits; i++)
		pow5 *= 5;
	if (frac % pow5)
		return -EINVAL;
	*out = (frac / pow5) << (shift - digits);
	return 0;
}

int parse_size(const char *s, uint64_t *out)
{
	uint64_t whole = 0, frac = 0, fbytes = 0, v;
	const char *p = s, *f;
	int ret, shift, digits = 0;

	if (!s)
		return -EINVAL;
	ret = parse_digits(&p, 10, &whole);
	if (ret == -EINVAL)
		return ret;
	if (*p == '.') {
		f = ++p;
		/* 19 digits always fit in a uint64_t. */
		while (*p >= '0' && *p <= '9' && p - f < 19)
			frac = frac * 10 + (uint64_t)(*p++ - '0');
		digits = (int)(p - f);
		if (digits == 0 || (*p >= '0' && *p <= '9'))
			return -EINVAL;
	}
	shift = size_suffix_shift(p);
	if (shift < 0)
		return -EINVAL;
	if (ret < 0)
		return ret; /* -ERANGE, reported after the syntax is known good */
	if (size_fraction(frac, digits, shift, &fbytes) < 0)
		return -EINVAL;
	if (shift && whole > (UINT64_MAX >> shift))
		return -ERANGE;
	if (__builtin_add_overflow(whole << shift, fbytes, &v))
		return -ERANGE;
	*out = v;
	return 0;
}

int parse_octal_mode(const char *s, mode_t *out)
{
	unsigned long v;
	char *end;

	errno = 0;
	if (*s < '0' || *s > '7')
		return -EINVAL;
	v = strtoul(s, &end, 8);
	if (errno || *end || v > 0777)
		return -EINVAL;
	*out = (mode_t)v;
	return 0;
}

int parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = {"on", "yes", "true", "1"};
	static const char *const no[] = {"off", "no", "false", "0"};
	size_t i;

	if (!s)
		return -EINVAL;
	for (i = 0; i < ARRAY_SIZE(yes); i++) {
		if (!strcasecmp(s, yes[i])) {
			*out = true;
			return 0;
		}
		if (!strcasecmp(s, no[i])) {
			*out = false;
			return 0;
		}
	}
	return -EINVAL;
}
