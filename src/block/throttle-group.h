/* Throttle groups: I/O limits shared by the `throttle` filter nodes that name
 * the group, in QEMU's model and names (leaky buckets for bytes and
 * operations per second, total, read and write, each with an optional burst
 * rate `-max` held for `-max-length` seconds, and `iops-size`).
 *
 * Threading: groups are made, changed and deleted on the main thread;
 * throttle_group_admit() is called from any iothread and takes the group's
 * lock for a few dozen instructions (no system call under it). A node with
 * no throttle filter never reaches this code. */
#ifndef IOPLANE_THROTTLE_GROUP_H
#define IOPLANE_THROTTLE_GROUP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kv_opts;

enum throttle_bucket {
	THR_BPS_TOTAL,
	THR_BPS_READ,
	THR_BPS_WRITE,
	THR_OPS_TOTAL,
	THR_OPS_READ,
	THR_OPS_WRITE,
	THR__COUNT,
};

/* The limit values QEMU accepts: 0 .. THROTTLE_VALUE_MAX. */
#define THROTTLE_VALUE_MAX 1000000000000000ull

struct throttle_limit {
	uint64_t avg;          /* units per second; 0: no limit */
	uint64_t max;          /* burst rate; 0: none */
	uint64_t burst_length; /* seconds the burst rate may last; >= 1 */
};

struct throttle_config {
	struct throttle_limit b[THR__COUNT];
	uint64_t op_size; /* iops-size: an operation larger counts as several; 0: off */
};

struct throttle_level {
	double level, burst_level; /* units in the bucket */
};

struct throttle_group {
	char *id;                    /* main thread */
	struct throttle_config cfg;  /* changed under lock (main thread) */
	unsigned users;              /* main thread: throttle nodes naming the group */
	struct throttle_group *next; /* main thread: the registry */
	pthread_mutex_t lock;
	struct throttle_level lv[THR__COUNT]; /* protected by lock */
	uint64_t last_ns;                     /* protected by lock: last leak */
	uint64_t waits;                       /* protected by lock: requests that waited */
};

/* Fill cfg from QEMU's keys in opts, with prefix ("limits." for the
 * throttle-group object, "x-" for its older spelling, "" for tests):
 * iops-total, iops-total-max, iops-total-max-length, ..., bps-write-max-length,
 * iops-size. Marks the keys used. 0, or -EINVAL with QEMU's message. */
int throttle_config_parse(struct throttle_config *cfg, struct kv_opts *opts, const char *prefix,
			  char *err, size_t errlen);
/* QEMU's validity rules (throttle_is_valid's messages). */
int throttle_config_check(const struct throttle_config *cfg, char *err, size_t errlen);
bool throttle_config_enabled(const struct throttle_config *cfg);

/* The registry (main thread). -EEXIST with "duplicate ID" as QEMU's object
 * layer says it, -EINVAL for a bad config. */
int throttle_group_add(const char *id, const struct throttle_config *cfg, char *err, size_t errlen);
struct throttle_group *throttle_group_find(const char *id);
/* Replace the limits at run time (qom-set): the levels are kept. */
int throttle_group_set(struct throttle_group *g, const struct throttle_config *cfg, char *err,
		       size_t errlen);
/* -EBUSY while a throttle node uses it. */
int throttle_group_del(const char *id, char *err, size_t errlen);
/* At the daemon's end, once every throttle node is closed. */
void throttle_group_free_all(void);
/* QEMU's name of a bucket: "iops-total", ..., "bps-write". */
const char *throttle_bucket_key(enum throttle_bucket b);

/* Any iothread: may a request of `bytes` (write or not) start at now_ns?
 * 0: yes, and it is accounted; else the nanoseconds to wait before asking
 * again (nothing accounted). */
uint64_t throttle_group_admit(struct throttle_group *g, bool write, uint64_t bytes,
			      uint64_t now_ns);

/* throttle.c: the group a throttle node uses, NULL for any other node. */
struct blk_node;
const char *throttle_node_group(const struct blk_node *bs);

/* The arithmetic, exposed for unit tests: leak cfg's buckets over delta_ns,
 * the wait before `lv` may take a request, and the accounting of one. */
void throttle_leak(const struct throttle_config *cfg, struct throttle_level *lv, uint64_t delta_ns);
uint64_t throttle_wait_ns(const struct throttle_config *cfg, const struct throttle_level *lv,
			  bool write);
void throttle_account(const struct throttle_config *cfg, struct throttle_level *lv, bool write,
		      uint64_t bytes);

#endif
