/* The schema validator (see schema.h). It walks the type and the value
 * together the way QEMU's QObject input visitor does, so that the first
 * error it meets is QEMU's first error, worded as QEMU words it: members in
 * schema order (a union's base, then its branch), an object's unexpected
 * members after its own members, nested ones first. Names in messages are
 * full paths ("cache.direct", "enable[0]", "a.0" in keyval) except where
 * QEMU uses the bare member name: enum values and integer ranges (a list
 * element is then 'null').
 *
 * THREADING RULE: pure functions. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "control/keyval.h"
#include "control/schema.h"

const struct qapi_type qapi_str = {.name = "str", .kind = QAPI_STR};
const struct qapi_type qapi_bool = {.name = "bool", .kind = QAPI_BOOL};
const struct qapi_type qapi_int = {.name = "int", .kind = QAPI_INT, .bits = 64};
const struct qapi_type qapi_int8 = {.name = "int8", .kind = QAPI_INT, .bits = 8};
const struct qapi_type qapi_int16 = {.name = "int16", .kind = QAPI_INT, .bits = 16};
const struct qapi_type qapi_int32 = {.name = "int32", .kind = QAPI_INT, .bits = 32};
const struct qapi_type qapi_int64 = {.name = "int64", .kind = QAPI_INT, .bits = 64};
const struct qapi_type qapi_uint8 = {.name = "uint8", .kind = QAPI_UINT, .bits = 8};
const struct qapi_type qapi_uint16 = {.name = "uint16", .kind = QAPI_UINT, .bits = 16};
const struct qapi_type qapi_uint32 = {.name = "uint32", .kind = QAPI_UINT, .bits = 32};
const struct qapi_type qapi_uint64 = {.name = "uint64", .kind = QAPI_UINT, .bits = 64};
const struct qapi_type qapi_size = {.name = "size", .kind = QAPI_SIZE, .bits = 64};
const struct qapi_type qapi_number = {.name = "number", .kind = QAPI_NUMBER};
const struct qapi_type qapi_any = {.name = "any", .kind = QAPI_ANY};
const struct qapi_type qapi_null = {.name = "null", .kind = QAPI_NULL};
const struct qapi_type qapi_empty = {
	.name = "q_empty", .kind = QAPI_OBJECT, .members = (const struct qapi_member[]){{0}}};

#define PATH_MAX_LEN 512

struct vctx {
	bool keyval;
	char path[PATH_MAX_LEN]; /* full name of the value being checked */
	char *err;
	size_t errlen;
};

static int verr(struct vctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int verr(struct vctx *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, c->errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static int type_error(struct vctx *c, const char *expected)
{
	return verr(c, "Invalid parameter type for '%s', expected: %s", c->path, expected);
}

/* Descend into a member (name) or a list element (name NULL, index i);
 * returns the old path length for path_pop(). */
static size_t path_push(struct vctx *c, const char *name, size_t i)
{
	size_t n = strlen(c->path);

	if (name)
		snprintf(c->path + n, sizeof(c->path) - n, "%s%s", n ? "." : "", name);
	else
		snprintf(c->path + n, sizeof(c->path) - n, c->keyval ? ".%zu" : "[%zu]", i);
	return n;
}

static void path_pop(struct vctx *c, size_t n)
{
	c->path[n] = '\0';
}

static int check_value(struct vctx *c, const struct qapi_type *t, json_t *v, const char *raw,
		       json_t **repl);

/* keyval gives strings; a dotted key under a scalar gives an object. 1 with
 * *s for a string, 0 for a value that is typed already (checked as in QMP). */
static int keyval_scalar(struct vctx *c, json_t *v, const char **s)
{
	if (json_is_object(v) || json_is_array(v))
		return verr(c, "Parameters '%s.*' are unexpected", c->path);
	*s = json_string_value(v);
	return *s != NULL;
}

static const char *int_type_name(const struct qapi_type *t)
{
	static const char *const names[2][4] = {
		{"int8_t", "int16_t", "int32_t", "int64_t"},
		{"uint8_t", "uint16_t", "uint32_t", "uint64_t"},
	};
	unsigned i = t->bits == 8 ? 0 : t->bits == 16 ? 1 : t->bits == 32 ? 2 : 3;

	return names[t->kind != QAPI_INT][i];
}

/* The intN/uintN range check, after the 64-bit visit (bare name). */
static int int_range(struct vctx *c, const struct qapi_type *t, int64_t v, const char *raw)
{
	bool ok;

	if (t->bits >= 64)
		return 0;
	if (t->kind == QAPI_INT)
		ok = v >= -(1ll << (t->bits - 1)) && v < (1ll << (t->bits - 1));
	else
		ok = (uint64_t)v < (1ull << t->bits);
	if (ok)
		return 0;
	return verr(c, "Parameter '%s' expects %s", raw ? raw : "null", int_type_name(t));
}

/* Integers of every width and sizes. *repl: the typed value for a string. */
static int check_integer(struct vctx *c, const struct qapi_type *t, json_t *v, const char *raw,
			 json_t **repl)
{
	const char *s = NULL;
	int64_t i;
	uint64_t u;
	int ret = c->keyval ? keyval_scalar(c, v, &s) : 0;

	if (ret < 0)
		return ret;
	if (s) {
		if (t->kind == QAPI_SIZE)
			ret = qapi_parse_size(s, &u);
		else if (t->kind == QAPI_UINT)
			ret = qapi_parse_uint(s, &u);
		else
			ret = qapi_parse_int(s, (int64_t *)&u);
		if (ret < 0)
			return verr(c, "Parameter '%s' expects %s", c->path,
				    t->kind == QAPI_SIZE ? "size" : "integer");
		i = (int64_t)u;
		if (int_range(c, t, i, raw) < 0)
			return -EINVAL;
		*repl = json_integer(i);
		return *repl ? 0 : verr(c, "out of memory");
	} else if (!json_is_integer(v)) {
		/* QEMU: a signed integer is a type error, an unsigned one a value error. */
		if (t->kind == QAPI_INT)
			return type_error(c, "integer");
		return verr(c, "Parameter '%s' expects uint64", c->path);
	} else {
		i = json_integer_value(v); /* an unsigned member takes it modulo 2^64, as QEMU */
	}
	return int_range(c, t, i, raw);
}

static int check_bool(struct vctx *c, json_t *v, json_t **repl)
{
	const char *s = NULL;
	bool b;

	if (c->keyval && keyval_scalar(c, v, &s) < 0)
		return -EINVAL;
	if (s) {
		if (qapi_parse_bool(s, &b) < 0)
			return verr(c, "Parameter '%s' expects 'on' or 'off'", c->path);
		*repl = json_boolean(b);
		return 0;
	}
	return json_is_boolean(v) ? 0 : type_error(c, "boolean");
}

static int check_number(struct vctx *c, json_t *v, json_t **repl)
{
	const char *s = NULL;
	char *end;
	double d;

	if (c->keyval && keyval_scalar(c, v, &s) < 0)
		return -EINVAL;
	if (s) {
		errno = 0;
		d = strtod(s, &end);
		if (end == s || *end || errno || d != d || d - d != 0)
			return type_error(c, "number");
		*repl = json_real(d);
		return 0;
	}
	return json_is_number(v) ? 0 : type_error(c, "number");
}

static int check_str(struct vctx *c, json_t *v)
{
	const char *s;

	if (c->keyval && keyval_scalar(c, v, &s) < 0)
		return -EINVAL;
	return json_is_string(v) ? 0 : type_error(c, "string");
}

static int check_enum(struct vctx *c, const struct qapi_type *t, json_t *v, const char *raw)
{
	if (check_str(c, v) < 0)
		return -EINVAL;
	if (qapi_enum_index(t, json_string_value(v)) < 0)
		return verr(c, "Parameter '%s' does not accept value '%s'", raw ? raw : "null",
			    json_string_value(v));
	return 0;
}

static int check_list(struct vctx *c, const struct qapi_type *t, json_t *v)
{
	json_t *e, *repl;
	size_t i, n;

	if (!json_is_array(v))
		return type_error(c, "array");
	json_array_foreach (v, i, e) {
		repl = NULL;
		n = path_push(c, NULL, i);
		if (check_value(c, t->elem, e, NULL, &repl) < 0) {
			json_decref(repl);
			return -EINVAL;
		}
		path_pop(c, n);
		if (repl && json_array_set_new(v, i, repl) < 0)
			return verr(c, "out of memory");
	}
	return 0;
}

/* The branch whose JSON type fits v (a keyval string picks str or enum). */
static const struct qapi_type *alternate_pick(const struct qapi_type *t, const json_t *v)
{
	const struct qapi_type *const *a;
	enum qapi_kind k;

	for (a = t->alts; *a; a++) {
		k = (*a)->kind;
		if ((json_is_string(v) && (k == QAPI_STR || k == QAPI_ENUM)) ||
		    (json_is_object(v) && k == QAPI_OBJECT) ||
		    (json_is_boolean(v) && k == QAPI_BOOL) || (json_is_null(v) && k == QAPI_NULL) ||
		    (json_is_integer(v) && (k == QAPI_INT || k == QAPI_UINT || k == QAPI_SIZE)) ||
		    (json_is_number(v) && k == QAPI_NUMBER))
			return *a;
	}
	return NULL;
}

static int check_object(struct vctx *c, const struct qapi_type *t, json_t *obj);

static int check_value(struct vctx *c, const struct qapi_type *t, json_t *v, const char *raw,
		       json_t **repl)
{
	const struct qapi_type *alt;

	switch (t->kind) {
	case QAPI_STR:
		return check_str(c, v);
	case QAPI_BOOL:
		return check_bool(c, v, repl);
	case QAPI_INT:
	case QAPI_UINT:
	case QAPI_SIZE:
		return check_integer(c, t, v, raw, repl);
	case QAPI_NUMBER:
		return check_number(c, v, repl);
	case QAPI_ENUM:
		return check_enum(c, t, v, raw);
	case QAPI_OBJECT:
		return json_is_object(v) ? check_object(c, t, v) : type_error(c, "object");
	case QAPI_LIST:
		return check_list(c, t, v);
	case QAPI_ALTERNATE:
		alt = alternate_pick(t, v);
		if (!alt)
			return verr(c, "Invalid parameter type for '%s', expected: %s",
				    raw ? raw : "null", t->name);
		return check_value(c, alt, v, raw, repl);
	case QAPI_NULL:
		return json_is_null(v) ? 0 : type_error(c, "null");
	case QAPI_ANY:
		return 0;
	}
	return verr(c, "internal error: bad schema type");
}

static int fill_default(struct vctx *c, const struct qapi_member *m, json_t *obj)
{
	json_t *d = json_loads(m->dflt, JSON_DECODE_ANY, NULL);

	if (!d || json_object_set_new(obj, m->name, d) < 0)
		return verr(c, "internal error: bad default for '%s'", m->name);
	return 0;
}

static int check_member(struct vctx *c, const struct qapi_member *m, json_t *obj)
{
	json_t *v = json_object_get(obj, m->name), *repl = NULL;
	size_t n = path_push(c, m->name, 0);
	int ret = 0;

	if (!v && !m->optional)
		ret = verr(c, "Parameter '%s' is missing", c->path);
	else if (v)
		ret = check_value(c, m->type, v, m->name, &repl);
	path_pop(c, n);
	if (ret < 0) {
		json_decref(repl);
		return ret;
	}
	if (repl && json_object_set_new(obj, m->name, repl) < 0)
		return verr(c, "out of memory");
	if (!v && m->dflt)
		return fill_default(c, m, obj);
	return 0;
}

static int check_members(struct vctx *c, const struct qapi_member *m, json_t *obj)
{
	for (; m && m->name; m++)
		if (check_member(c, m, obj) < 0)
			return -EINVAL;
	return 0;
}

static bool declared(const struct qapi_member *m, const char *key)
{
	for (; m && m->name; m++)
		if (!strcmp(m->name, key))
			return true;
	return false;
}

static const struct qapi_type *union_branch(const struct qapi_type *t, const json_t *obj)
{
	const char *tag = json_string_value(json_object_get(obj, t->tag));
	const struct qapi_variant *v;

	for (v = t->variants; tag && v && v->tag; v++)
		if (!strcmp(v->tag, tag))
			return v->type;
	return NULL;
}

static int check_object(struct vctx *c, const struct qapi_type *t, json_t *obj)
{
	const struct qapi_type *branch = NULL;
	const char *key;
	json_t *v;
	size_t n;

	if (check_members(c, t->members, obj) < 0)
		return -EINVAL;
	if (t->tag) {
		branch = union_branch(t, obj);
		if (branch && check_members(c, branch->members, obj) < 0)
			return -EINVAL;
	}
	json_object_foreach (obj, key, v) {
		if (declared(t->members, key) || (branch && declared(branch->members, key)))
			continue;
		n = path_push(c, key, 0);
		verr(c, "Parameter '%s' is unexpected", c->path);
		path_pop(c, n);
		return -EINVAL;
	}
	return 0;
}

int qapi_validate(const struct qapi_type *t, json_t *obj, bool keyval, char *err, size_t errlen)
{
	struct vctx c = {.keyval = keyval, .err = err, .errlen = errlen};

	if (!json_is_object(obj))
		return verr(&c, "Invalid parameter type for '<anonymous>', expected: object");
	return check_object(&c, t, obj);
}

json_t *qapi_parse_option(const struct qapi_type *t, const char *arg, const char *implied_key,
			  char *err, size_t errlen)
{
	bool is_json;
	json_t *o = keyval_or_json(arg, implied_key, &is_json, err, errlen);

	if (o && qapi_validate(t, o, !is_json, err, errlen) < 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}
