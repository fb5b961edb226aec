/* A small QAPI-like schema, written as C tables, and the one validator that
 * QMP commands and the qsd-style command-line options share. Validation
 * checks a JSON object against a type with QEMU's rules and exact error
 * texts, and normalises it in place: keyval strings become the member's JSON
 * type ("on" -> true, "64k" -> 65536 for a size), and absent optional members
 * with a default get it. A handler then reads its arguments with the
 * qapi_get_*() accessors, which cannot fail for a member the schema declares.
 * docs/control.md shows how to write a command against it.
 *
 * THREADING RULE: the tables are constant; the functions are pure. */
#ifndef IOPLANE_CONTROL_SCHEMA_H
#define IOPLANE_CONTROL_SCHEMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum qapi_kind {
	QAPI_STR,
	QAPI_BOOL,
	QAPI_INT,  /* signed, `bits` wide: int, int8 .. int64 */
	QAPI_UINT, /* unsigned, `bits` wide: uint8 .. uint64 */
	QAPI_SIZE, /* uint64; keyval also takes suffixes: 64k, 1.5G */
	QAPI_NUMBER,
	QAPI_ENUM,
	QAPI_OBJECT, /* a struct, or a flat union when `tag` is set */
	QAPI_LIST,
	QAPI_ALTERNATE, /* one of `alts`, chosen by the JSON type of the value */
	QAPI_ANY,
	QAPI_NULL,
};

struct qapi_type;

struct qapi_member {
	const char *name; /* NULL ends a member list */
	const struct qapi_type *type;
	bool optional;
	const char *dflt; /* optional members: JSON text filled in when absent, or NULL */
	const char *const *features; /* NULL-ended, as query-qmp-schema lists them, or NULL */
};

/* A flat union's branch: the members of `type` (an object) join the base's
 * when the tag member has the value `tag`. A tag without a branch adds none. */
struct qapi_variant {
	const char *tag; /* NULL ends the list */
	const struct qapi_type *type;
};

struct qapi_type {
	const char *name; /* QAPI's name: introspection, and alternates' errors */
	enum qapi_kind kind;
	unsigned bits;                       /* QAPI_INT, QAPI_UINT */
	const char *const *values;           /* QAPI_ENUM: NULL-terminated */
	const struct qapi_member *members;   /* QAPI_OBJECT: the (base) members */
	const char *tag;                     /* QAPI_OBJECT union: the enum member that picks */
	const struct qapi_variant *variants; /* ... the branch */
	const struct qapi_type *elem;        /* QAPI_LIST */
	const struct qapi_type *const *alts; /* QAPI_ALTERNATE: NULL-terminated */
};

/* Built-in types, named as in QAPI. */
extern const struct qapi_type qapi_str, qapi_bool, qapi_int, qapi_int8, qapi_int16, qapi_int32,
	qapi_int64, qapi_uint8, qapi_uint16, qapi_uint32, qapi_uint64, qapi_size, qapi_number,
	qapi_any, qapi_null, qapi_empty;

/* Table macros:
 *   static const struct qapi_type my_args = QAPI_OBJECT_TYPE("MyArgs",
 *       QAPI_MEMBERS(QAPI_REQ("node-name", &qapi_str),
 *                    QAPI_OPT_DEFAULT("flat", &qapi_bool, "false")));
 *   static const struct qapi_type my_enum = QAPI_ENUM_TYPE("MyEnum", "a", "b");
 *   static const struct qapi_type my_list = QAPI_LIST_TYPE(&my_enum); */
#define QAPI_REQ(n, t)                                                                             \
	{                                                                                          \
		.name = (n), .type = (t)                                                           \
	}
#define QAPI_OPT(n, t)                                                                             \
	{                                                                                          \
		.name = (n), .type = (t), .optional = true                                         \
	}
/* An optional member QEMU marks unstable (an x- name). */
#define QAPI_OPT_UNSTABLE(n, t)                                                                    \
	{                                                                                          \
		.name = (n), .type = (t), .optional = true, .features = (const char *const[])      \
		{                                                                                  \
			"unstable", NULL                                                           \
		}                                                                                  \
	}
#define QAPI_OPT_DEFAULT(n, t, d)                                                                  \
	{                                                                                          \
		.name = (n), .type = (t), .optional = true, .dflt = (d)                            \
	}
#define QAPI_MEMBERS(...) ((const struct qapi_member[]){__VA_ARGS__, {0}})
#define QAPI_OBJECT_TYPE(n, m)                                                                     \
	{                                                                                          \
		.name = (n), .kind = QAPI_OBJECT, .members = (m)                                   \
	}
#define QAPI_UNION_TYPE(n, m, t, ...)                                                              \
	{                                                                                          \
		.name = (n), .kind = QAPI_OBJECT, .members = (m), .tag = (t),                      \
		.variants = (const struct qapi_variant[])                                          \
		{                                                                                  \
			__VA_ARGS__,                                                               \
			{                                                                          \
				0                                                                  \
			}                                                                          \
		}                                                                                  \
	}
#define QAPI_ENUM_TYPE(n, ...)                                                                     \
	{                                                                                          \
		.name = (n), .kind = QAPI_ENUM, .values = (const char *const[])                    \
		{                                                                                  \
			__VA_ARGS__, NULL                                                          \
		}                                                                                  \
	}
#define QAPI_LIST_TYPE(t)                                                                          \
	{                                                                                          \
		.name = NULL, .kind = QAPI_LIST, .elem = (t)                                       \
	}
#define QAPI_ALTERNATE_TYPE(n, ...)                                                                \
	{                                                                                          \
		.name = (n), .kind = QAPI_ALTERNATE, .alts = (const struct qapi_type *const[])     \
		{                                                                                  \
			__VA_ARGS__, NULL                                                          \
		}                                                                                  \
	}

/* Check obj (an object) against the object type t and normalise it. keyval:
 * obj came from keyval_parse() (string leaves, QEMU's keyval visitor rules
 * and its "a.0" names for list elements); otherwise QMP's JSON rules.
 * 0, or -EINVAL with QEMU's message (class GenericError) in err. */
int qapi_validate(const struct qapi_type *t, json_t *obj, bool keyval, char *err, size_t errlen);

/* A qsd-style option argument (keyval or '{' JSON) parsed and validated
 * against t: a new object, or NULL with the message in err. */
json_t *qapi_parse_option(const struct qapi_type *t, const char *arg, const char *implied_key,
			  char *err, size_t errlen);

/* QEMU's keyval scalar syntax: bool on|yes|true|y / off|no|false|n; integers
 * as strtoll/strtoull with base 0 (uint64 wraps a leading '-', as QEMU's
 * qemu_strtou64 does); sizes with an optional fraction and one suffix of
 * B, K, M, G, T, P, E (any case). 0 or -EINVAL/-ERANGE. */
int qapi_parse_bool(const char *s, bool *out);
int qapi_parse_int(const char *s, int64_t *out);
int qapi_parse_uint(const char *s, uint64_t *out);
int qapi_parse_size(const char *s, uint64_t *out);
/* QEMU's id_wellformed(): a letter, then letters, digits, '-', '.', '_' (the
 * ids of objects, chardevs, exports). */
bool qapi_id_wellformed(const char *id);

/* Accessors for validated objects. Absent members give dflt (str: NULL). A
 * uint64 or size member is kept as a JSON integer holding the same 64 bits. */
json_t *qapi_get(const json_t *o, const char *key);
bool qapi_has(const json_t *o, const char *key);
const char *qapi_get_str(const json_t *o, const char *key);
bool qapi_get_bool(const json_t *o, const char *key, bool dflt);
int64_t qapi_get_int(const json_t *o, const char *key, int64_t dflt);
uint64_t qapi_get_uint(const json_t *o, const char *key, uint64_t dflt);
double qapi_get_number(const json_t *o, const char *key, double dflt);
/* Index of the member's value in the enum's values, or dflt when absent. */
int qapi_get_enum(const json_t *o, const char *key, const struct qapi_type *t, int dflt);
int qapi_enum_index(const struct qapi_type *t, const char *s); /* -1: not a value */

#endif
