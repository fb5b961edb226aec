/* Scalars for the schema layer (see schema.h): QEMU's keyval syntax for
 * booleans, integers and sizes, and the accessors handlers read validated
 * arguments with.
 *
 * THREADING RULE: pure functions. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "control/schema.h"

int qapi_parse_bool(const char *s, bool *out)
{
	static const char *const on[] = {"on", "yes", "true", "y"};
	static const char *const off[] = {"off", "no", "false", "n"};
	size_t i;

	for (i = 0; i < 4; i++) {
		if (!strcmp(s, on[i]) || !strcmp(s, off[i])) {
			*out = !strcmp(s, on[i]);
			return 0;
		}
	}
	return -EINVAL;
}

int qapi_parse_int(const char *s, int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 0);
	if (errno)
		return -errno;
	if (end == s || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

int qapi_parse_uint(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 0); /* "-1" wraps to 2^64-1, as in QEMU */
	if (errno)
		return -errno;
	if (end == s || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

static int size_shift(char c)
{
	static const char units[] = "bkmgtpe";
	const char *p = c ? strchr(units, tolower((unsigned char)c)) : NULL;

	return p ? (int)(p - units) * 10 : -1;
}

/* The digits of a size: decimal, or hex after "0x"; the fraction ".ddd" of
 * a decimal one goes to *frac. */
static int size_number(const char *s, uint64_t *val, double *frac, const char **end)
{
	const char *p = s;
	char *e;

	while (isspace((unsigned char)*p))
		p++;
	if (*p == '-')
		return -EINVAL;
	errno = 0;
	*val = strtoull(p, &e, 10);
	if (errno || e == p)
		return errno ? -errno : -EINVAL;
	*frac = 0;
	if (*val == 0 && (*e == 'x' || *e == 'X')) {
		*val = strtoull(p, &e, 16);
		if (errno || e == p + 2 || *e == '.')
			return -EINVAL;
	} else if (*e == '.') {
		char digits[32] = ".";
		size_t n = strspn(e + 1, "0123456789");

		/* Digits only ("1.5e3k" is refused); "5." has none. */
		memcpy(digits + 1, e + 1, n < 30 ? n : 30);
		*frac = strtod(digits, NULL);
		e += 1 + n;
	}
	*end = e;
	return 0;
}

int qapi_parse_size(const char *s, uint64_t *out)
{
	const char *end = s;
	uint64_t val, mul, part;
	double frac = 0;
	int shift, ret = size_number(s, &val, &frac, &end);

	if (ret < 0)
		return ret;
	shift = *end ? size_shift(*end) : 0;
	if (shift < 0 || (*end && end[1]))
		return -EINVAL;
	/* A fraction of a byte is refused, "4096.0" is not. */
	if (shift == 0 && frac != 0)
		return -EINVAL;
	mul = 1ull << shift;
	if (val > UINT64_MAX / mul)
		return -ERANGE;
	part = (uint64_t)(frac * (double)mul); /* frac <= 1 and mul <= 2^60: no overflow */
	if (part > UINT64_MAX - val * mul)
		return -ERANGE;
	*out = val * mul + part;
	return 0;
}

int qapi_enum_index(const struct qapi_type *t, const char *s)
{
	int i;

	for (i = 0; s && t->values[i]; i++)
		if (!strcmp(t->values[i], s))
			return i;
	return -1;
}

json_t *qapi_get(const json_t *o, const char *key)
{
	return json_object_get(o, key);
}

bool qapi_has(const json_t *o, const char *key)
{
	return json_object_get(o, key) != NULL;
}

const char *qapi_get_str(const json_t *o, const char *key)
{
	return json_string_value(json_object_get(o, key));
}

bool qapi_get_bool(const json_t *o, const char *key, bool dflt)
{
	json_t *v = json_object_get(o, key);

	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

int64_t qapi_get_int(const json_t *o, const char *key, int64_t dflt)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) ? json_integer_value(v) : dflt;
}

uint64_t qapi_get_uint(const json_t *o, const char *key, uint64_t dflt)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) ? (uint64_t)json_integer_value(v) : dflt;
}

double qapi_get_number(const json_t *o, const char *key, double dflt)
{
	json_t *v = json_object_get(o, key);

	return json_is_number(v) ? json_number_value(v) : dflt;
}

int qapi_get_enum(const json_t *o, const char *key, const struct qapi_type *t, int dflt)
{
	const char *s = qapi_get_str(o, key);

	return s ? qapi_enum_index(t, s) : dflt;
}

bool qapi_id_wellformed(const char *id)
{
	if (!isalpha((unsigned char)*id))
		return false;
	for (; *id; id++)
		if (!isalnum((unsigned char)*id) && !strchr("-._", *id))
			return false;
	return true;
}
