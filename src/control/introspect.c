/* query-qmp-schema: the registered commands and events and every type they
 * use, in QEMU's introspection format (SchemaInfo), made from the schema
 * tables on each call. As QEMU does, types other than the built-in ones are
 * named by numbers ("0" is the empty object), every integer type shows as
 * "int", and an array of T is "[T]".
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/qmp-cmds.h"
#include "control/qmp.h"
#include "control/schema.h"

/* ---- SchemaInfo, the type of the answer --------------------------------- */

static const struct qapi_type str_list = QAPI_LIST_TYPE(&qapi_str);
static const struct qapi_type meta_type = QAPI_ENUM_TYPE(
	"SchemaMetaType", "builtin", "enum", "array", "object", "alternate", "command", "event");
static const struct qapi_type json_type_enum = QAPI_ENUM_TYPE(
	"JSONType", "string", "number", "int", "boolean", "null", "object", "array", "value");
static const struct qapi_type info_builtin =
	QAPI_OBJECT_TYPE("SchemaInfoBuiltin", QAPI_MEMBERS(QAPI_REQ("json-type", &json_type_enum)));
static const struct qapi_type enum_member =
	QAPI_OBJECT_TYPE("SchemaInfoEnumMember", QAPI_MEMBERS(QAPI_REQ("name", &qapi_str),
							      QAPI_OPT("features", &str_list)));
static const struct qapi_type enum_member_list = QAPI_LIST_TYPE(&enum_member);
static const struct qapi_type info_enum =
	QAPI_OBJECT_TYPE("SchemaInfoEnum", QAPI_MEMBERS(QAPI_REQ("members", &enum_member_list),
							QAPI_REQ("values", &str_list)));
static const struct qapi_type info_array =
	QAPI_OBJECT_TYPE("SchemaInfoArray", QAPI_MEMBERS(QAPI_REQ("element-type", &qapi_str)));
static const struct qapi_type object_member = QAPI_OBJECT_TYPE(
	"SchemaInfoObjectMember",
	QAPI_MEMBERS(QAPI_REQ("name", &qapi_str), QAPI_REQ("type", &qapi_str),
		     QAPI_OPT("default", &qapi_any), QAPI_OPT("features", &str_list)));
static const struct qapi_type object_member_list = QAPI_LIST_TYPE(&object_member);
static const struct qapi_type object_variant =
	QAPI_OBJECT_TYPE("SchemaInfoObjectVariant",
			 QAPI_MEMBERS(QAPI_REQ("case", &qapi_str), QAPI_REQ("type", &qapi_str)));
static const struct qapi_type object_variant_list = QAPI_LIST_TYPE(&object_variant);
static const struct qapi_type info_object = QAPI_OBJECT_TYPE(
	"SchemaInfoObject",
	QAPI_MEMBERS(QAPI_REQ("members", &object_member_list), QAPI_OPT("tag", &qapi_str),
		     QAPI_OPT("variants", &object_variant_list)));
static const struct qapi_type alternate_member =
	QAPI_OBJECT_TYPE("SchemaInfoAlternateMember", QAPI_MEMBERS(QAPI_REQ("type", &qapi_str)));
static const struct qapi_type alternate_member_list = QAPI_LIST_TYPE(&alternate_member);
static const struct qapi_type info_alternate = QAPI_OBJECT_TYPE(
	"SchemaInfoAlternate", QAPI_MEMBERS(QAPI_REQ("members", &alternate_member_list)));
static const struct qapi_type info_command =
	QAPI_OBJECT_TYPE("SchemaInfoCommand", QAPI_MEMBERS(QAPI_REQ("arg-type", &qapi_str),
							   QAPI_REQ("ret-type", &qapi_str),
							   QAPI_OPT("allow-oob", &qapi_bool)));
static const struct qapi_type info_event =
	QAPI_OBJECT_TYPE("SchemaInfoEvent", QAPI_MEMBERS(QAPI_REQ("arg-type", &qapi_str)));
static const struct qapi_type schema_info = QAPI_UNION_TYPE(
	"SchemaInfo",
	QAPI_MEMBERS(QAPI_REQ("name", &qapi_str), QAPI_REQ("meta-type", &meta_type),
		     QAPI_OPT("features", &str_list)),
	"meta-type", {"builtin", &info_builtin}, {"enum", &info_enum}, {"array", &info_array},
	{"object", &info_object}, {"alternate", &info_alternate}, {"command", &info_command},
	{"event", &info_event});
static const struct qapi_type schema_info_list = QAPI_LIST_TYPE(&schema_info);

/* ---- walking the types -------------------------------------------------- */

struct named {
	const struct qapi_type *t;
	char name[40]; /* a number, a built-in's name, or "[" elem "]" */
};

struct walk {
	json_t *out; /* the SchemaInfo list */
	struct named *names;
	size_t n, cap;
	unsigned next_number;
	int err;
};

static const char *builtin_name(const struct qapi_type *t)
{
	switch (t->kind) {
	case QAPI_STR:
		return "str";
	case QAPI_BOOL:
		return "bool";
	case QAPI_INT:
	case QAPI_UINT:
	case QAPI_SIZE:
		return "int";
	case QAPI_NUMBER:
		return "number";
	case QAPI_NULL:
		return "null";
	case QAPI_ANY:
		return "any";
	default:
		return NULL;
	}
}

static const char *builtin_json_type(const char *name)
{
	static const char *const map[][2] = {{"str", "string"}, {"bool", "boolean"},
					     {"int", "int"},    {"number", "number"},
					     {"null", "null"},  {"any", "value"}};
	size_t i;

	for (i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (!strcmp(map[i][0], name))
			return map[i][1];
	return "value";
}

static void emit(struct walk *w, json_t *info)
{
	if (!info || json_array_append_new(w->out, info) < 0)
		w->err = -ENOMEM;
}

static const char *type_name(struct walk *w, const struct qapi_type *t);

static struct named *named_new(struct walk *w, const struct qapi_type *t)
{
	struct named *p;

	if (w->n == w->cap) {
		w->cap = w->cap ? w->cap * 2 : 64;
		p = realloc(w->names, w->cap * sizeof(*p));
		if (!p) {
			w->err = -ENOMEM;
			return NULL;
		}
		w->names = p;
	}
	p = &w->names[w->n++];
	p->t = t;
	p->name[0] = '\0';
	return p;
}

static json_t *members_info(struct walk *w, const struct qapi_member *m)
{
	json_t *list = json_array(), *e;

	for (; list && m && m->name; m++) {
		e = json_pack("{s:s,s:s}", "name", m->name, "type", type_name(w, m->type));
		if (e && m->optional)
			json_object_set_new(e, "default", json_null());
		if (e && m->features) {
			json_t *f = json_array();

			for (const char *const *p = m->features; *p; p++)
				json_array_append_new(f, json_string(*p));
			json_object_set_new(e, "features", f);
		}
		json_array_append_new(list, e);
	}
	return list;
}

static json_t *object_info(struct walk *w, const char *name, const struct qapi_type *t)
{
	json_t *info = json_pack("{s:s,s:s,s:o}", "name", name, "meta-type", "object", "members",
				 members_info(w, t->members));
	const struct qapi_variant *v;
	json_t *vars;

	if (!info || !t->tag)
		return info;
	vars = json_array();
	for (v = t->variants; vars && v->tag; v++)
		json_array_append_new(vars, json_pack("{s:s,s:s}", "case", v->tag, "type",
						      type_name(w, v->type)));
	json_object_set_new(info, "tag", json_string(t->tag));
	json_object_set_new(info, "variants", vars);
	return info;
}

static json_t *enum_info(const char *name, const struct qapi_type *t)
{
	json_t *info = json_pack("{s:s,s:s,s:[],s:[]}", "name", name, "meta-type", "enum",
				 "members", "values");
	size_t i;

	for (i = 0; info && t->values[i]; i++) {
		json_array_append_new(json_object_get(info, "members"),
				      json_pack("{s:s}", "name", t->values[i]));
		json_array_append_new(json_object_get(info, "values"), json_string(t->values[i]));
	}
	return info;
}

static json_t *alternate_info(struct walk *w, const char *name, const struct qapi_type *t)
{
	json_t *info =
		json_pack("{s:s,s:s,s:[]}", "name", name, "meta-type", "alternate", "members");
	const struct qapi_type *const *a;

	for (a = t->alts; info && *a; a++)
		json_array_append_new(json_object_get(info, "members"),
				      json_pack("{s:s}", "type", type_name(w, *a)));
	return info;
}

/* The name t goes by, describing it (once) on first sight. */
static const char *type_name(struct walk *w, const struct qapi_type *t)
{
	const char *b = builtin_name(t);
	struct named *p;
	size_t i;

	for (i = 0; i < w->n; i++)
		if (w->names[i].t == t)
			return w->names[i].name;
	p = named_new(w, t);
	if (!p)
		return "any";
	i = (size_t)(p - w->names); /* p moves if a nested type grows the table */
	if (b)
		snprintf(p->name, sizeof(p->name), "%s", b);
	else if (t->kind != QAPI_LIST)
		snprintf(p->name, sizeof(p->name), "%u", w->next_number++);
	if (b) {
		emit(w, json_pack("{s:s,s:s,s:s}", "name", b, "meta-type", "builtin", "json-type",
				  builtin_json_type(b)));
	} else if (t->kind == QAPI_LIST) {
		char elem[38];

		snprintf(elem, sizeof(elem), "%s", type_name(w, t->elem));
		snprintf(w->names[i].name, sizeof(w->names[i].name), "[%s]", elem);
		emit(w, json_pack("{s:s,s:s,s:s}", "name", w->names[i].name, "meta-type", "array",
				  "element-type", elem));
	} else if (t->kind == QAPI_ENUM) {
		emit(w, enum_info(p->name, t));
	} else if (t->kind == QAPI_ALTERNATE) {
		char name[40];

		snprintf(name, sizeof(name), "%s", p->name);
		emit(w, alternate_info(w, name, t));
	} else {
		char name[40];

		snprintf(name, sizeof(name), "%s", p->name);
		emit(w, object_info(w, name, t));
	}
	return w->names[i].name;
}

static void describe_commands(struct walk *w)
{
	const struct qmp_command *c;
	const struct qmp_event_info *e;
	char arg[40];
	size_t i;

	for (i = 0; (c = qmp_command_at(i)); i++) {
		json_t *info;

		snprintf(arg, sizeof(arg), "%s", type_name(w, c->args ? c->args : &qapi_empty));
		info = json_pack("{s:s,s:s,s:s,s:s}", "name", c->name, "meta-type", "command",
				 "arg-type", arg, "ret-type",
				 type_name(w, c->ret ? c->ret : &qapi_empty));
		if (info && c->features) {
			json_t *f = json_array();

			for (const char *const *p = c->features; *p; p++)
				json_array_append_new(f, json_string(*p));
			json_object_set_new(info, "features", f);
		}
		emit(w, info);
	}
	for (i = 0; (e = qmp_event_at(i)); i++)
		emit(w, json_pack("{s:s,s:s,s:s}", "name", e->name, "meta-type", "event",
				  "arg-type", type_name(w, e->data ? e->data : &qapi_empty)));
}

static void query_qmp_schema(struct qmp_req *req, json_t *args)
{
	struct walk w = {.out = json_array()};

	(void)args;
	if (!w.out)
		w.err = -ENOMEM;
	else
		type_name(&w, &qapi_empty); /* "0", as in QEMU */
	if (!w.err)
		describe_commands(&w);
	free(w.names);
	if (w.err) {
		json_decref(w.out);
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
		return;
	}
	qmp_return(req, w.out);
}

static const struct qmp_command schema_cmd = {
	.name = "query-qmp-schema", .ret = &schema_info_list, .fn = query_qmp_schema};

int qmp_register_introspection(void)
{
	return qmp_register(&schema_cmd);
}
