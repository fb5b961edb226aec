/* key=value option lists ("file=a.img,cache=none,read-only=on").
 * A comma inside a value is written ",,". Each key is marked when a consumer
 * takes it so that unknown keys can be reported. Threading: caller's. */
#ifndef IOPLANE_OPTS_H
#define IOPLANE_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct kv {
	char *key, *val;
	bool used;
};

struct kv_opts {
	struct kv *v;
	size_t n, cap;
};

/* implied_key: name given to a first element without '=' (NULL: error). */
int kv_parse(struct kv_opts *o, const char *s, const char *implied_key);
int kv_set(struct kv_opts *o, const char *key, const char *val); /* replaces */
void kv_free(struct kv_opts *o);
/* Lookups mark the key used. NULL/dflt when absent. */
const char *kv_get(struct kv_opts *o, const char *key);
/* 0 ok (or absent: *out untouched), -EINVAL malformed, -ERANGE a number
 * too large. */
int kv_get_bool(struct kv_opts *o, const char *key, bool *out);
int kv_get_u64(struct kv_opts *o, const char *key, uint64_t *out);  /* plain number */
int kv_get_size(struct kv_opts *o, const char *key, uint64_t *out); /* K/M/G/T suffixes */
/* First key not marked used, or NULL. */
const char *kv_first_unused(const struct kv_opts *o);

/* "64K", "1G", "512" -> bytes (binary suffixes; B optional). -EINVAL/-ERANGE. */
int parse_size(const char *s, uint64_t *out);
/* Decimal/0x unsigned with range check. */
int parse_u64(const char *s, uint64_t *out);
int parse_bool(const char *s, bool *out); /* on/off, yes/no, true/false, 1/0 */
/* Octal permission bits as chmod takes them ("600", "0660"), at most 0777. */
int parse_octal_mode(const char *s, mode_t *out);

#endif
