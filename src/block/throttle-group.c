/* Throttle groups: QEMU's leaky-bucket limits, shared by throttle nodes.
 *
 * Each limited quantity (bytes or operations; total, read or write) is a
 * bucket that drains at `avg` units per second. A request may start while
 * the bucket holds no more than its size: avg/10 without a burst rate, else
 * max * burst_length; with a burst rate, a second bucket draining at `max`
 * and holding max/10 keeps the burst itself at that rate. A request that
 * starts adds its units to every bucket that applies (total, and read or
 * write); one that may not start waits until the fullest bucket has drained
 * enough, so that over any long interval the rate is the limit.
 *
 * Threading: see throttle-group.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/throttle-group.h"
#include "util/compiler.h"
#include "util/opts.h"

#define NS_PER_S 1000000000.0

static struct throttle_group *groups; /* main thread */

static const char *const bucket_key[THR__COUNT] = {
	[THR_BPS_TOTAL] = "bps-total", [THR_BPS_READ] = "bps-read",
	[THR_BPS_WRITE] = "bps-write", [THR_OPS_TOTAL] = "iops-total",
	[THR_OPS_READ] = "iops-read",  [THR_OPS_WRITE] = "iops-write",
};

const char *throttle_bucket_key(enum throttle_bucket b)
{
	return bucket_key[b];
}

static int get_u64(struct kv_opts *opts, const char *prefix, const char *key, const char *suffix,
		   uint64_t *out, char *err, size_t errlen)
{
	char name[64];

	snprintf(name, sizeof(name), "%s%s%s", prefix, key, suffix);
	if (!kv_get(opts, name))
		return 0;
	if (kv_get_u64(opts, name, out)) {
		snprintf(err, errlen, "Parameter '%s' expects a non-negative number below 2^64",
			 name);
		return -EINVAL;
	}
	return 0;
}

int throttle_config_parse(struct throttle_config *cfg, struct kv_opts *opts, const char *prefix,
			  char *err, size_t errlen)
{
	int ret = 0;

	*cfg = (struct throttle_config){0};
	for (int i = 0; i < THR__COUNT && !ret; i++) {
		struct throttle_limit *l = &cfg->b[i];

		l->burst_length = 1;
		ret = get_u64(opts, prefix, bucket_key[i], "", &l->avg, err, errlen);
		if (!ret)
			ret = get_u64(opts, prefix, bucket_key[i], "-max", &l->max, err, errlen);
		if (!ret)
			ret = get_u64(opts, prefix, bucket_key[i], "-max-length", &l->burst_length,
				      err, errlen);
	}
	if (!ret)
		ret = get_u64(opts, prefix, "iops-size", "", &cfg->op_size, err, errlen);
	return ret ? ret : throttle_config_check(cfg, err, errlen);
}

static int check_limit(const struct throttle_limit *l, char *err, size_t errlen)
{
	const char *why = NULL;

	if (l->avg > THROTTLE_VALUE_MAX || l->max > THROTTLE_VALUE_MAX)
		why = "bps/iops/max values must be within [0, 1000000000000000]";
	else if (!l->burst_length)
		why = "the burst length cannot be 0";
	else if (l->burst_length > 1 && !l->max)
		why = "burst length set without burst rate";
	else if (l->max && l->burst_length > THROTTLE_VALUE_MAX / l->max)
		why = "burst length too high for this burst rate";
	else if (l->max && !l->avg)
		why = "bps_max/iops_max require corresponding bps/iops values";
	else if (l->max && l->max < l->avg)
		why = "bps_max/iops_max cannot be lower than bps/iops";
	if (why)
		snprintf(err, errlen, "%s", why);
	return why ? -EINVAL : 0;
}

int throttle_config_check(const struct throttle_config *cfg, char *err, size_t errlen)
{
	const struct throttle_limit *b = cfg->b;

	if ((b[THR_BPS_TOTAL].avg && (b[THR_BPS_READ].avg || b[THR_BPS_WRITE].avg)) ||
	    (b[THR_OPS_TOTAL].avg && (b[THR_OPS_READ].avg || b[THR_OPS_WRITE].avg))) {
		snprintf(err, errlen,
			 "bps/iops/max total values and read/write values cannot be used at the "
			 "same time");
		return -EINVAL;
	}
	if (cfg->op_size > THROTTLE_VALUE_MAX) {
		snprintf(err, errlen, "iops size must be within [0, 1000000000000000]");
		return -EINVAL;
	}
	for (int i = 0; i < THR__COUNT; i++)
		if (check_limit(&b[i], err, errlen))
			return -EINVAL;
	return 0;
}

bool throttle_config_enabled(const struct throttle_config *cfg)
{
	for (int i = 0; i < THR__COUNT; i++)
		if (cfg->b[i].avg)
			return true;
	return false;
}

/* ---- the arithmetic ---- */

static bool applies(int i, bool write)
{
	return i == THR_BPS_TOTAL || i == THR_OPS_TOTAL ||
	       (write ? i == THR_BPS_WRITE || i == THR_OPS_WRITE
		      : i == THR_BPS_READ || i == THR_OPS_READ);
}

void throttle_leak(const struct throttle_config *cfg, struct throttle_level *lv, uint64_t delta_ns)
{
	for (int i = 0; i < THR__COUNT; i++) {
		const struct throttle_limit *l = &cfg->b[i];
		double d;

		d = (double)l->avg * (double)delta_ns / NS_PER_S;
		lv[i].level = lv[i].level > d ? lv[i].level - d : 0;
		if (l->burst_length > 1) {
			d = (double)l->max * (double)delta_ns / NS_PER_S;
			lv[i].burst_level = lv[i].burst_level > d ? lv[i].burst_level - d : 0;
		}
	}
}

static uint64_t bucket_wait(const struct throttle_limit *l, const struct throttle_level *lv)
{
	double size = l->max ? (double)l->max * (double)l->burst_length : (double)l->avg / 10;
	double extra = lv->level - size;

	if (!l->avg)
		return 0;
	if (extra > 0)
		return (uint64_t)(extra * NS_PER_S / (double)l->avg) + 1;
	if (l->burst_length > 1) {
		extra = lv->burst_level - (double)l->max / 10;
		if (extra > 0)
			return (uint64_t)(extra * NS_PER_S / (double)l->max) + 1;
	}
	return 0;
}

uint64_t throttle_wait_ns(const struct throttle_config *cfg, const struct throttle_level *lv,
			  bool write)
{
	uint64_t wait = 0;

	for (int i = 0; i < THR__COUNT; i++) {
		uint64_t w = applies(i, write) ? bucket_wait(&cfg->b[i], &lv[i]) : 0;

		if (w > wait)
			wait = w;
	}
	return wait;
}

void throttle_account(const struct throttle_config *cfg, struct throttle_level *lv, bool write,
		      uint64_t bytes)
{
	double ops = 1;

	if (cfg->op_size && bytes > cfg->op_size)
		ops = (double)bytes / (double)cfg->op_size;
	for (int i = 0; i < THR__COUNT; i++) {
		double units = i >= THR_OPS_TOTAL ? ops : (double)bytes;

		if (!cfg->b[i].avg || !applies(i, write))
			continue;
		lv[i].level += units;
		if (cfg->b[i].burst_length > 1)
			lv[i].burst_level += units;
	}
}

uint64_t throttle_group_admit(struct throttle_group *g, bool write, uint64_t bytes, uint64_t now_ns)
{
	uint64_t wait;

	pthread_mutex_lock(&g->lock);
	if (now_ns > g->last_ns) {
		throttle_leak(&g->cfg, g->lv, now_ns - g->last_ns);
		g->last_ns = now_ns;
	}
	wait = throttle_wait_ns(&g->cfg, g->lv, write);
	if (!wait)
		throttle_account(&g->cfg, g->lv, write, bytes);
	else
		g->waits++;
	pthread_mutex_unlock(&g->lock);
	return wait;
}

/* ---- the registry ---- */

struct throttle_group *throttle_group_find(const char *id)
{
	for (struct throttle_group *g = groups; g; g = g->next)
		if (!strcmp(g->id, id))
			return g;
	return NULL;
}

int throttle_group_add(const char *id, const struct throttle_config *cfg, char *err, size_t errlen)
{
	struct throttle_group *g;

	if (throttle_group_find(id)) {
		snprintf(err, errlen,
			 "attempt to add duplicate property '%s' to object (type "
			 "'container')",
			 id);
		return -EEXIST;
	}
	if (throttle_config_check(cfg, err, errlen))
		return -EINVAL;
	g = calloc(1, sizeof(*g));
	if (!g || !(g->id = strdup(id))) {
		free(g);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	g->cfg = *cfg;
	pthread_mutex_init(&g->lock, NULL);
	g->next = groups;
	groups = g;
	return 0;
}

int throttle_group_set(struct throttle_group *g, const struct throttle_config *cfg, char *err,
		       size_t errlen)
{
	if (throttle_config_check(cfg, err, errlen))
		return -EINVAL;
	pthread_mutex_lock(&g->lock);
	g->cfg = *cfg;
	pthread_mutex_unlock(&g->lock);
	return 0;
}

static void group_free(struct throttle_group *g)
{
	pthread_mutex_destroy(&g->lock);
	free(g->id);
	free(g);
}

int throttle_group_del(const char *id, char *err, size_t errlen)
{
	for (struct throttle_group **p = &groups; *p; p = &(*p)->next) {
		struct throttle_group *g = *p;

		if (strcmp(g->id, id))
			continue;
		if (g->users) {
			snprintf(err, errlen, "object '%s' is in use, can not be deleted", id);
			return -EBUSY;
		}
		*p = g->next;
		group_free(g);
		return 0;
	}
	snprintf(err, errlen, "object '%s' not found", id);
	return -ENOENT;
}

void throttle_group_free_all(void)
{
	struct throttle_group *g;

	while ((g = groups)) {
		groups = g->next;
		group_free(g);
	}
}
