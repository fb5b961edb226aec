/* KEY=VALUE,... into JSON, with QEMU 7.2's keyval semantics and messages
 * (see keyval.h). Parsing builds nested objects whose list-index keys stay
 * strings ("0", "1"); a second pass turns every object whose keys are all
 * indices into an array, as QEMU's listify step does.
 *
 * THREADING RULE: pure functions. */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/json.h"
#include "control/keyval.h"

#define KEY_FRAGMENT_MAX 127
/* Not a QEMU limit: it bounds the recursion of the listify pass. */
#define KEY_DEPTH_MAX 1024

/* Length of the QAPI name at s ("__RFQDN_" prefix allowed), or 0. */
static size_t qapi_name_len(const char *s)
{
	const char *p = s;

	if (*p == '_') {
		if (*++p != '_')
			return 0;
		while (*++p && (isalnum((unsigned char)*p) || *p == '-' || *p == '.'))
			;
		if (*p++ != '_')
			return 0;
	}
	if (!isalpha((unsigned char)*p))
		return 0;
	while (*++p && (isalnum((unsigned char)*p) || *p == '-' || *p == '_'))
		;
	return (size_t)(p - s);
}

/* A list index: the leading digits of s, capped at INT_MAX; -1 if none. */
static int key_index(const char *s, size_t *len)
{
	long long v = 0;
	size_t n = 0;

	if (!isdigit((unsigned char)*s))
		return -1;
	for (; isdigit((unsigned char)s[n]); n++)
		if (v <= INT_MAX)
			v = v * 10 + (s[n] - '0');
	*len = n;
	return v > INT_MAX ? INT_MAX : (int)v;
}

static bool all_digits(const char *s)
{
	size_t n;

	return key_index(s, &n) >= 0 && !s[n];
}

/* Make cur[name] the object (val NULL) or the string val, unless it is
 * already the other kind. prefix[0..plen) names the key in the message. */
static json_t *kv_put(json_t *cur, const char *name, json_t *val, const char *prefix, size_t plen,
		      char *err, size_t errlen)
{
	json_t *old = json_object_get(cur, name);

	if (old && (json_is_object(old) == (val != NULL))) {
		snprintf(err, errlen, "Parameters '%.*s.*' used inconsistently", (int)plen, prefix);
		json_decref(val);
		return NULL;
	}
	if (old && !val)
		return old;
	if (!val)
		val = json_object();
	if (!val || json_object_set_new(cur, name, val) < 0) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	return val;
}

/* Walk key[0..klen) down from root, creating objects; the last fragment
 * goes to *leaf. NULL on error. */
static json_t *kv_walk(json_t *root, const char *key, size_t klen, char *leaf, char *err,
		       size_t errlen)
{
	const char *s = key, *end = key + klen;
	json_t *cur = root;
	unsigned depth = 0;
	size_t len;

	for (;;) {
		if (++depth > KEY_DEPTH_MAX) {
			snprintf(err, errlen, "Parameter nested more than %d levels deep",
				 KEY_DEPTH_MAX);
			return NULL;
		}
		if (s == key || key_index(s, &len) < 0)
			len = qapi_name_len(s);
		if (len > (size_t)(end - s))
			len = 0; /* a name that runs on past the key (into '=') */
		if (!len || (s + len < end && s[len] != '.')) {
			snprintf(err, errlen, "Invalid parameter '%.*s'", (int)klen, key);
			return NULL;
		}
		if (len > KEY_FRAGMENT_MAX) {
			snprintf(err, errlen, "Parameter%s '%.*s' is too long",
				 s != key || s + len != end ? " fragment" : "", (int)len, s);
			return NULL;
		}
		if (s != key &&
		    !(cur = kv_put(cur, leaf, NULL, key, (size_t)(s - 1 - key), err, errlen)))
			return NULL;
		memcpy(leaf, s, len);
		leaf[len] = '\0';
		s += len;
		if (s == end)
			return cur;
		s++; /* the '.' */
	}
}

/* val as a JSON string; NULL with the message when it is not UTF-8. */
static json_t *kv_string(const char *val, size_t n, const char *key, size_t klen, char *err,
			 size_t errlen)
{
	json_t *v = NULL;

	if (!qjson_utf8_valid(val, n))
		snprintf(err, errlen, "Parameter '%.*s' is not valid UTF-8", (int)klen, key);
	else if (!(v = json_stringn(val, n)))
		snprintf(err, errlen, "out of memory");
	return v;
}

/* The value at s up to a single ','; ",," is a comma. *next: after it. */
static json_t *kv_value(const char *s, const char **next, const char *key, size_t klen, char *err,
			size_t errlen)
{
	size_t n = 0, i;
	char *buf;
	json_t *v;

	for (i = 0; s[i] && (s[i] != ',' || s[i + 1] == ','); i++, n++)
		if (s[i] == ',')
			i++;
	buf = malloc(n + 1);
	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (i = 0, n = 0; s[i] && (s[i] != ',' || s[i + 1] == ','); i++)
		buf[n++] = s[i] == ',' ? s[i++] : s[i];
	buf[n] = '\0';
	*next = s[i] == ',' ? s + i + 1 : s + i;
	v = kv_string(buf, n, key, klen, err, errlen);
	free(buf);
	return v;
}

static bool is_help(const char *s, size_t len)
{
	return (len == 4 && !strncmp(s, "help", 4)) || (len == 1 && *s == '?');
}

/* One element at s; returns what follows it, or NULL on error. */
static const char *kv_parse_one(json_t *root, const char *s, const char *implied_key, bool *help,
				char *err, size_t errlen)
{
	size_t len = strcspn(s, "=,"), klen = len;
	const char *key = s, *next;
	char leaf[KEY_FRAGMENT_MAX + 1];
	json_t *cur, *val;

	if (len && s[len] != '=' && is_help(s, len)) {
		if (!help) {
			snprintf(err, errlen, "Help is not available for this option");
			return NULL;
		}
		*help = true;
		return s[len] == ',' ? s + len + 1 : s + len;
	}
	if (len && s[len] != '=' && implied_key) {
		key = implied_key;
		klen = strlen(implied_key);
		cur = kv_walk(root, key, klen, leaf, err, errlen);
		val = cur ? kv_string(s, len, key, klen, err, errlen) : NULL;
		next = s[len] == ',' ? s + len + 1 : s + len;
	} else {
		cur = kv_walk(root, key, klen, leaf, err, errlen);
		if (cur && key[len] != '=') {
			snprintf(err, errlen, "Expected '=' after parameter '%.*s'", (int)len, key);
			return NULL;
		}
		val = cur ? kv_value(key + len + 1, &next, key, klen, err, errlen) : NULL;
	}
	if (!val || !kv_put(cur, leaf, val, key, klen, err, errlen))
		return NULL;
	return next;
}

static void path_append(char *path, size_t size, const char *key)
{
	size_t n = strlen(path);

	snprintf(path + n, size - n, "%s.", key);
}

/* The object's members as an array by index; NULL with err on a gap. */
static json_t *kv_to_list(json_t *obj, const char *path, char *err, size_t errlen)
{
	size_t n = json_object_size(obj), i, len;
	json_t **elt = calloc(n, sizeof(*elt)), *list = NULL, *v;
	const char *key;
	int max = -1, idx;

	if (!elt)
		goto oom;
	json_object_foreach (obj, key, v) {
		idx = key_index(key, &len);
		max = idx > max ? idx : max;
		if ((size_t)idx < n)
			elt[idx] = v;
	}
	list = json_array();
	for (i = 0; list && i < n && (int)i <= max; i++) {
		if (!elt[i]) {
			snprintf(err, errlen, "Parameter '%s%zu' missing", path, i);
			json_decref(list);
			free(elt);
			return NULL;
		}
		if (json_array_append(list, elt[i]) < 0)
			break;
	}
	free(elt);
	if (list && i == n)
		return list;
	json_decref(list);
oom:
	snprintf(err, errlen, "out of memory");
	return NULL;
}

/* Replace, depth first, each object whose keys are all indices by an array.
 * path: the keys down to obj, each followed by '.'. */
static json_t *kv_listify(json_t *obj, char *path, size_t size, char *err, size_t errlen)
{
	bool has_index = false, has_member = false;
	size_t plen = strlen(path);
	const char *key;
	json_t *v, *nv;
	void *tmp;

	json_object_foreach_safe (obj, tmp, key, v) {
		if (all_digits(key))
			has_index = true;
		else
			has_member = true;
		if (!json_is_object(v))
			continue;
		path_append(path, size, key);
		nv = kv_listify(v, path, size, err, errlen);
		path[plen] = '\0';
		if (!nv)
			return NULL;
		if (nv != v && json_object_set_new(obj, key, nv) < 0)
			return NULL;
	}
	if (has_index && has_member) {
		snprintf(err, errlen, "Parameters '%s*' used inconsistently", path);
		return NULL;
	}
	return has_index ? kv_to_list(obj, path, err, errlen) : obj;
}

json_t *keyval_parse(const char *s, const char *implied_key, bool *help, char *err, size_t errlen)
{
	json_t *root = json_object();
	char path[1024] = "";

	if (!root) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	while (s && *s) {
		s = kv_parse_one(root, s, implied_key, help, err, errlen);
		implied_key = NULL;
	}
	if (s && kv_listify(root, path, sizeof(path), err, errlen))
		return root;
	json_decref(root);
	return NULL;
}

json_t *keyval_or_json(const char *s, const char *implied_key, bool *is_json, char *err,
		       size_t errlen)
{
	*is_json = s[0] == '{';
	if (*is_json)
		return qjson_parse(s, strlen(s), err, errlen); /* '{' cannot start a non-object */
	return keyval_parse(s, implied_key, NULL, err, errlen);
}
