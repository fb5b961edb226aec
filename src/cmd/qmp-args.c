/* `ioplane qmp`'s key=value arguments: keyval syntax (dotted keys, list
 * indices) made into the types the server's query-qmp-schema gives the
 * command, by the same validator the daemon runs on its own command line -
 * so `size=1024 read-only=on` arrive as 1024 and true, with the daemon's
 * messages when they do not fit. The schema's types are rebuilt as
 * struct qapi_type from the introspection data.
 *
 * THREADING RULE: single-threaded (a command-line tool). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/qmp-args.h"
#include "control/keyval.h"
#include "control/schema.h"

struct dyn {
	json_t *infos; /* name -> SchemaInfo */
	json_t *made;  /* name -> index in types[] */
	struct qapi_type **types;
	size_t ntypes;
	void **allocs; /* member, variant and value arrays */
	size_t nallocs;
	int err;
};

static void *dyn_alloc(struct dyn *d, size_t n, size_t size)
{
	void **a = realloc(d->allocs, (d->nallocs + 1) * sizeof(*a));
	void *p = calloc(n + 1, size); /* one more: the terminator */

	if (a)
		d->allocs = a;
	if (!a || !p) {
		free(p);
		d->err = -ENOMEM;
		return NULL;
	}
	d->allocs[d->nallocs++] = p;
	return p;
}

static const char *str_or_empty(const json_t *v)
{
	return json_is_string(v) ? json_string_value(v) : "";
}

static const struct qapi_type *builtin(const char *json_type)
{
	if (!strcmp(json_type, "string"))
		return &qapi_str;
	if (!strcmp(json_type, "int"))
		return &qapi_int;
	if (!strcmp(json_type, "number"))
		return &qapi_number;
	if (!strcmp(json_type, "boolean"))
		return &qapi_bool;
	if (!strcmp(json_type, "null"))
		return &qapi_null;
	return &qapi_any;
}

static const struct qapi_type *dyn_type(struct dyn *d, const char *name);

static void fill_object(struct dyn *d, struct qapi_type *t, json_t *info)
{
	json_t *members = json_object_get(info, "members"), *m, *vars, *v;
	struct qapi_member *mem = dyn_alloc(d, json_array_size(members), sizeof(*mem));
	struct qapi_variant *var;
	size_t i;

	t->kind = QAPI_OBJECT;
	t->members = mem;
	json_array_foreach (members, i, m) {
		if (!mem)
			return;
		mem[i].name = json_string_value(json_object_get(m, "name"));
		mem[i].optional = json_object_get(m, "default") != NULL;
		mem[i].type = dyn_type(d, json_string_value(json_object_get(m, "type")));
	}
	t->tag = json_string_value(json_object_get(info, "tag"));
	vars = json_object_get(info, "variants");
	if (!t->tag || !(var = dyn_alloc(d, json_array_size(vars), sizeof(*var))))
		return;
	t->variants = var;
	json_array_foreach (vars, i, v) {
		var[i].tag = json_string_value(json_object_get(v, "case"));
		var[i].type = dyn_type(d, json_string_value(json_object_get(v, "type")));
	}
}

static void fill_enum(struct dyn *d, struct qapi_type *t, json_t *info)
{
	json_t *values = json_object_get(info, "values"), *v;
	const char **vals = dyn_alloc(d, json_array_size(values), sizeof(*vals));
	size_t i;

	t->kind = QAPI_ENUM;
	t->values = vals ? vals : (const char *const[]){NULL};
	json_array_foreach (values, i, v)
		if (vals)
			vals[i] = json_string_value(v);
}

static void fill_alternate(struct dyn *d, struct qapi_type *t, json_t *info)
{
	json_t *members = json_object_get(info, "members"), *m;
	const struct qapi_type **alts = dyn_alloc(d, json_array_size(members), sizeof(*alts));
	size_t i;

	t->kind = QAPI_ALTERNATE;
	t->alts = alts ? alts : (const struct qapi_type *const[]){NULL};
	json_array_foreach (members, i, m)
		if (alts)
			alts[i] = dyn_type(d, json_string_value(json_object_get(m, "type")));
}

static void fill(struct dyn *d, struct qapi_type *t, json_t *info)
{
	const char *meta = json_string_value(json_object_get(info, "meta-type"));

	if (!meta)
		return;
	if (!strcmp(meta, "object"))
		fill_object(d, t, info);
	else if (!strcmp(meta, "enum"))
		fill_enum(d, t, info);
	else if (!strcmp(meta, "alternate"))
		fill_alternate(d, t, info);
	else if (!strcmp(meta, "array")) {
		t->kind = QAPI_LIST;
		t->elem = dyn_type(d, json_string_value(json_object_get(info, "element-type")));
	}
}

/* The type called name in the schema; made once, so that recursive types
 * (BlockdevOptions and BlockdevRef) end. Unknown names take anything. */
static const struct qapi_type *dyn_type(struct dyn *d, const char *name)
{
	json_t *info = name ? json_object_get(d->infos, name) : NULL, *idx;
	const char *meta = json_string_value(json_object_get(info, "meta-type"));
	struct qapi_type **types, *t;

	if (!info || !meta)
		return &qapi_any;
	if (!strcmp(meta, "builtin"))
		return builtin(str_or_empty(json_object_get(info, "json-type")));
	idx = json_object_get(d->made, name);
	if (idx)
		return d->types[json_integer_value(idx)];
	types = realloc(d->types, (d->ntypes + 1) * sizeof(*types));
	t = calloc(1, sizeof(*t));
	if (types)
		d->types = types;
	if (!types || !t ||
	    json_object_set_new(d->made, name, json_integer((json_int_t)d->ntypes))) {
		free(t);
		d->err = -ENOMEM;
		return &qapi_any;
	}
	d->types[d->ntypes++] = t;
	t->name = name;
	t->kind = QAPI_ANY;
	fill(d, t, info);
	return t;
}

static void dyn_free(struct dyn *d)
{
	size_t i;

	for (i = 0; i < d->ntypes; i++)
		free(d->types[i]);
	for (i = 0; i < d->nallocs; i++)
		free(d->allocs[i]);
	free(d->types);
	free(d->allocs);
	json_decref(d->infos);
	json_decref(d->made);
}

/* "k=v" arguments as one keyval string, commas in values doubled. */
static char *join_args(char **argv, int argc, char *err, size_t errlen)
{
	size_t len = 1, n = 0;
	char *s, *p;
	int i;

	for (i = 0; i < argc; i++)
		len += 2 * strlen(argv[i]) + 1;
	s = malloc(len);
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (i = 0; i < argc; i++) {
		if (!strchr(argv[i], '=')) {
			snprintf(err, errlen, "expected KEY=VALUE, not '%s'", argv[i]);
			free(s);
			return NULL;
		}
		if (i)
			s[n++] = ',';
		for (p = argv[i]; *p; p++) {
			if (*p == ',' && strchr(argv[i], '=') < p)
				s[n++] = ',';
			s[n++] = *p;
		}
	}
	s[n] = '\0';
	return s;
}

json_t *qmp_args_from_keyval(char **argv, int argc, const char *command, json_t *schema, char *err,
			     size_t errlen)
{
	struct dyn d = {.infos = json_object(), .made = json_object()};
	const struct qapi_type *args = NULL;
	char *joined = join_args(argv, argc, err, errlen);
	json_t *o = joined ? keyval_parse(joined, NULL, NULL, err, errlen) : NULL, *info;
	size_t i;

	free(joined);
	json_array_foreach (schema, i, info) {
		const char *name = json_string_value(json_object_get(info, "name"));

		if (name && d.infos)
			json_object_set(d.infos, name, info);
	}
	info = json_object_get(d.infos, command);
	if (o && info && !strcmp(str_or_empty(json_object_get(info, "meta-type")), "command"))
		args = dyn_type(&d, json_string_value(json_object_get(info, "arg-type")));
	/* Without a schema for it the values go as strings: the server judges. */
	if (o && args && args->kind == QAPI_OBJECT && !d.err &&
	    qapi_validate(args, o, true, err, errlen) < 0) {
		json_decref(o);
		o = NULL;
	}
	dyn_free(&d);
	return o;
}
