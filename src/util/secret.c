/* The secret table (secret.h): a list under one lock; values are wiped
 * before they are freed. Threading: any thread, under secret_lock. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/secret.h"

struct secret {
	struct secret *next;
	char *id;
	unsigned char *data;
	size_t len;
};

static pthread_mutex_t secret_lock = PTHREAD_MUTEX_INITIALIZER;
static struct secret *secrets; /* protected by secret_lock */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static struct secret **find(const char *id)
{
	struct secret **pp;

	for (pp = &secrets; *pp && strcmp((*pp)->id, id); pp = &(*pp)->next)
		;
	return pp;
}

static void secret_free(struct secret *s)
{
	explicit_bzero(s->data, s->len);
	free(s->data);
	free(s->id);
	free(s);
}

int secret_add(const char *id, const void *data, size_t len)
{
	struct secret *s = calloc(1, sizeof(*s));
	int ret = 0;

	if (!s || !(s->id = strdup(id)) || !(s->data = malloc(len ? len : 1))) {
		if (s)
			free(s->id);
		free(s);
		return -ENOMEM;
	}
	memcpy(s->data, data, len);
	s->len = len;
	pthread_mutex_lock(&secret_lock);
	if (*find(id)) {
		ret = -EEXIST;
	} else {
		s->next = secrets;
		secrets = s;
	}
	pthread_mutex_unlock(&secret_lock);
	if (ret)
		secret_free(s);
	return ret;
}

int secret_del(const char *id)
{
	struct secret **pp, *s;

	pthread_mutex_lock(&secret_lock);
	pp = find(id);
	s = *pp;
	if (s)
		*pp = s->next;
	pthread_mutex_unlock(&secret_lock);
	if (!s)
		return -ENOENT;
	secret_free(s);
	return 0;
}

bool secret_exists(const char *id)
{
	bool found;

	pthread_mutex_lock(&secret_lock);
	found = *find(id) != NULL;
	pthread_mutex_unlock(&secret_lock);
	return found;
}

static void encode(const unsigned char *in, size_t len, char *out)
{
	size_t i, o = 0;

	for (i = 0; i < len; i += 3) {
		unsigned v = in[i] << 16 | (i + 1 < len ? in[i + 1] << 8 : 0) |
			     (i + 2 < len ? in[i + 2] : 0);

		out[o++] = b64[v >> 18 & 63];
		out[o++] = b64[v >> 12 & 63];
		out[o++] = i + 1 < len ? b64[v >> 6 & 63] : '=';
		out[o++] = i + 2 < len ? b64[v & 63] : '=';
	}
	out[o] = 0;
}

int secret_get_base64(const char *id, char **out)
{
	struct secret *s;
	int ret = -ENOENT;

	pthread_mutex_lock(&secret_lock);
	s = *find(id);
	if (s) {
		*out = malloc((s->len + 2) / 3 * 4 + 1);
		ret = *out ? 0 : -ENOMEM;
		if (*out)
			encode(s->data, s->len, *out);
	}
	pthread_mutex_unlock(&secret_lock);
	return ret;
}

static int b64_value(char c)
{
	const char *p = c ? strchr(b64, c) : NULL;

	return p ? (int)(p - b64) : -1;
}

long secret_base64_decode(const char *in, size_t len, unsigned char *out)
{
	long o = 0;

	if (len % 4)
		return -EINVAL;
	for (size_t i = 0; i < len; i += 4) {
		int pad = 0, v[4];

		if (i + 4 == len && in[i + 3] == '=')
			pad = in[i + 2] == '=' ? 2 : 1;
		for (int k = 0; k < 4; k++) {
			v[k] = k >= 4 - pad ? 0 : b64_value(in[i + k]);
			if (v[k] < 0)
				return -EINVAL;
		}
		out[o++] = (unsigned char)(v[0] << 2 | v[1] >> 4);
		if (pad < 2)
			out[o++] = (unsigned char)(v[1] << 4 | v[2] >> 2);
		if (pad < 1)
			out[o++] = (unsigned char)(v[2] << 6 | v[3]);
	}
	return o;
}

void secret_free_all(void)
{
	struct secret *s;

	pthread_mutex_lock(&secret_lock);
	while ((s = secrets)) {
		secrets = s->next;
		secret_free(s);
	}
	pthread_mutex_unlock(&secret_lock);
}
