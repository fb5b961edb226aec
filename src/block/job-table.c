/* QEMU's job tables (qapi/job.json, job.c): the names of states, verbs and
 * error actions, which state may follow which, and which verbs each state
 * takes.
 *
 * THREADING RULE: constant tables, pure functions: any thread. */
#include <errno.h>
#include <string.h>

#include "block/job.h"
#include "util/compiler.h"

static const char *const status_names[JOB_STATUS__COUNT] = {
	"undefined", "created", "running",  "paused",    "ready", "standby",
	"waiting",   "pending", "aborting", "concluded", "null",
};

static const char *const verb_names[JOB_VERB__COUNT] = {
	"cancel", "pause", "resume", "set-speed", "complete", "finalize", "dismiss", "change",
};

static const char *const policy_names[JOB_ERR__COUNT] = {"report", "ignore", "enospc", "stop",
							 "auto"};

static const char *const action_names[] = {"ignore", "report", "stop"};

/* JobSTT: [from][to]. Columns: U C R P Y S W D X E N. */
static const bool stt[JOB_STATUS__COUNT][JOB_STATUS__COUNT] = {
	[JOB_STATUS_UNDEFINED] = {0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	[JOB_STATUS_CREATED] = {0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1},
	[JOB_STATUS_RUNNING] = {0, 0, 0, 1, 1, 0, 1, 0, 1, 0, 0},
	[JOB_STATUS_PAUSED] = {0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
	[JOB_STATUS_READY] = {0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0},
	[JOB_STATUS_STANDBY] = {0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
	[JOB_STATUS_WAITING] = {0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0},
	[JOB_STATUS_PENDING] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0},
	[JOB_STATUS_ABORTING] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0},
	[JOB_STATUS_CONCLUDED] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
	[JOB_STATUS_NULL] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};

/* JobVerbTable: [verb][state]. Columns: U C R P Y S W D X E N. */
static const bool verbs[JOB_VERB__COUNT][JOB_STATUS__COUNT] = {
	[JOB_VERB_CANCEL] = {0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0},
	[JOB_VERB_PAUSE] = {0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0},
	[JOB_VERB_RESUME] = {0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0},
	[JOB_VERB_SET_SPEED] = {0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0},
	[JOB_VERB_COMPLETE] = {0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0},
	[JOB_VERB_FINALIZE] = {0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
	[JOB_VERB_DISMISS] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
	[JOB_VERB_CHANGE] = {0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0},
};

const char *job_status_name(enum job_status s)
{
	return (unsigned)s < JOB_STATUS__COUNT ? status_names[s] : NULL;
}

const char *job_verb_name(enum job_verb v)
{
	return (unsigned)v < JOB_VERB__COUNT ? verb_names[v] : NULL;
}

const char *job_action_name(enum job_error_action a)
{
	return (unsigned)a < ARRAY_SIZE(action_names) ? action_names[a] : NULL;
}

int job_error_policy_parse(const char *name, enum job_error_policy *out)
{
	for (unsigned i = 0; name && i < JOB_ERR__COUNT; i++)
		if (!strcmp(name, policy_names[i])) {
			*out = (enum job_error_policy)i;
			return 0;
		}
	return -EINVAL;
}

bool job_transition_allowed(enum job_status from, enum job_status to)
{
	if ((unsigned)from >= JOB_STATUS__COUNT || (unsigned)to >= JOB_STATUS__COUNT)
		return false;
	return stt[from][to];
}

bool job_verb_allowed(enum job_verb v, enum job_status s)
{
	if ((unsigned)v >= JOB_VERB__COUNT || (unsigned)s >= JOB_STATUS__COUNT)
		return false;
	return verbs[v][s];
}
