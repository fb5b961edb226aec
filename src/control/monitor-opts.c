/* --chardev and --monitor (see monitor-opts.h).
 *
 * --monitor is a QAPI-style option: keyval or JSON, checked by the schema
 * validator against MonitorOptions (chardev implied) plus ioplane's unix=
 * and fd=. --chardev is, as in QEMU 7.2, not QAPI: it takes QemuOpts syntax
 * (a backend first, "key" alone for key=on, last value wins) and QemuOpts'
 * messages. Of its backends ioplane has the socket one, listening on a
 * unix path or using a socket passed in by fd; it does not wait for the
 * first client as QEMU does without wait=off - there is no need to.
 *
 * THREADING RULE: main thread only. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "control/json.h"
#include "control/monitor-opts.h"
#include "util/opts.h"
#include "util/service.h"
#include "control/monitor.h"
#include "control/schema.h"
#include "util/log.h"

struct chardev_opt {
	const char *arg;
	char *id, *path;
	int fd; /* -1: path */
	bool used;
};

struct monitor_opt {
	const char *arg;
	char *chardev, *path;
	mode_t mode;
	int fd;
	bool has_mode, pretty;
	struct svc_owner owner; /* unix=: user=, group= */
	struct monitor *mon;
};

struct monitor_set {
	struct chardev_opt *chardevs;
	struct monitor_opt *monitors;
	unsigned nchardevs, nmonitors;
};

/* ---- --chardev (QemuOpts) ----------------------------------------------- */

/* QEMU's chardev option names: others are "Invalid parameter". */
static const char *const chardev_keys[] = {
	"backend",   "path",      "host",    "port",   "fd",        "local",     "localaddr",
	"localport", "to",        "ipv4",    "ipv6",   "wait",      "server",    "delay",
	"nodelay",   "reconnect", "telnet",  "tn3270", "websocket", "tls-creds", "tls-authz",
	"width",     "height",    "cols",    "rows",   "mux",       "signal",    "name",
	"debug",     "size",      "chardev", "append", "logfile",   "logappend", "abstract",
	"tight",     "id",        NULL,
};
static const char *const chardev_bools[] = {
	"ipv4",      "ipv6", "wait",   "server", "delay",     "nodelay",  "telnet", "tn3270",
	"websocket", "mux",  "signal", "append", "logappend", "abstract", "tight",  NULL,
};
/* What the socket backend does here, with values that need no support. */
static const char *const socket_keys[] = {"backend", "id",   "path",    "fd",
					  "server",  "wait", "nodelay", NULL};
static const char *const backends[] = {
	"null",    "socket",   "udp",       "ringbuf",      "memory", "file",
	"pipe",    "pty",      "stdio",     "serial",       "tty",    "parallel",
	"parport", "spicevmc", "spiceport", "qemu-vdagent", "dbus",   "vc",
	"braille", "msmouse",  "wctablet",  "testdev",      NULL,
};

static bool in_list(const char *const *list, const char *s, size_t n)
{
	for (; *list; list++)
		if (strlen(*list) == n && !strncmp(*list, s, n))
			return true;
	return false;
}

/* o[key] = val[0..n); -EINVAL when it is not text. */
static int qemuopts_set(json_t *o, const char *key, const char *val, size_t n, char *err,
			size_t errlen)
{
	if (!qjson_utf8_valid(val, n)) {
		snprintf(err, errlen, "Parameter '%s' is not valid UTF-8", key);
		return -EINVAL;
	}
	return json_object_set_new(o, key, json_stringn(val, n));
}

/* One "key=value" or "key" at s[0..n) (",," already a comma). */
static int qemuopts_put(json_t *o, const char *s, size_t n, const char *arg, char *err,
			size_t errlen)
{
	const char *eq = memchr(s, '=', n), *k = s;
	size_t klen = eq ? (size_t)(eq - s) : n;
	char key[16];
	bool no = false;

	if (!eq && !in_list(chardev_bools, s, n) && n > 2 && !strncmp(s, "no", 2) &&
	    in_list(chardev_bools, s + 2, n - 2)) {
		no = true; /* "nowait": wait=off */
		k += 2;
		klen -= 2;
	}
	if (!in_list(chardev_keys, k, klen)) {
		snprintf(err, errlen, "Invalid parameter '%.*s'", (int)klen, k);
		return -EINVAL;
	}
	if (!eq)
		log_warn(
			"--chardev %s: short-form boolean option '%.*s' is deprecated, use %.*s=%s",
			arg, (int)n, s, (int)klen, k, no ? "off" : "on");
	snprintf(key, sizeof(key), "%.*s", (int)klen, k);
	if (eq)
		return qemuopts_set(o, key, eq + 1, n - klen - 1, err, errlen);
	return json_object_set_new(o, key, json_string(no ? "off" : "on"));
}

/* QemuOpts' syntax into a flat object of strings; the first element without
 * '=' is the backend. */
static json_t *qemuopts_parse(const char *arg, char *err, size_t errlen)
{
	json_t *o = json_object();
	char *buf = malloc(strlen(arg) + 1);
	const char *s = arg;
	bool first = true;
	int ret = o && buf ? 0 : -ENOMEM;
	size_t n;

	while (!ret && *s) {
		for (n = 0; *s && (*s != ',' || s[1] == ','); s++)
			buf[n++] = *s == ',' ? *++s : *s;
		if (*s)
			s++;
		if (first && n && !memchr(buf, '=', n))
			ret = qemuopts_set(o, "backend", buf, n, err, errlen);
		else if (n)
			ret = qemuopts_put(o, buf, n, arg, err, errlen);
		first = false;
	}
	free(buf);
	if (ret == -ENOMEM || ret == -1)
		snprintf(err, errlen, "out of memory");
	if (ret) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* A decimal fd number (QEMU's message when it is not one). */
static int parse_fd(const char *s, int *fd, char *err, size_t errlen)
{
	int64_t v;

	if (qapi_parse_int(s, &v) < 0 || v < 0 || v > INT32_MAX) {
		snprintf(err, errlen, "Unable to parse FD number %s", s);
		return -EINVAL;
	}
	*fd = (int)v;
	return 0;
}

static int chardev_bool(json_t *o, const char *key, bool dflt, bool *out, char *err, size_t errlen)
{
	const char *v = qapi_get_str(o, key);

	*out = dflt;
	if (v && qapi_parse_bool(v, out) < 0) {
		snprintf(err, errlen, "Parameter '%s' expects 'on' or 'off'", key);
		return -EINVAL;
	}
	return 0;
}

/* What ioplane's socket chardev does not do. */
static int socket_check(json_t *o, char *err, size_t errlen)
{
	const char *id = qapi_get_str(o, "id"), *key;
	bool server, b;
	json_t *v;

	json_object_foreach (o, key, v) {
		if (!in_list(socket_keys, key, strlen(key))) {
			snprintf(err, errlen,
				 "chardev '%s': '%s' is not supported by ioplane "
				 "(unix sockets by path, and passed fds, are)",
				 id, key);
			return -EINVAL;
		}
	}
	if (chardev_bool(o, "server", false, &server, err, errlen) < 0 ||
	    chardev_bool(o, "wait", true, &b, err, errlen) < 0 ||
	    chardev_bool(o, "nodelay", false, &b, err, errlen) < 0)
		return -EINVAL;
	if (!qapi_has(o, "path") == !qapi_has(o, "fd")) {
		snprintf(err, errlen, "chardev '%s': socket needs one of path= and fd=", id);
		return -EINVAL;
	}
	if (qapi_has(o, "path") && !server) {
		snprintf(err, errlen,
			 "chardev '%s': ioplane listens (server=on); it does not "
			 "connect to a socket",
			 id);
		return -EINVAL;
	}
	return 0;
}

static int chardev_check(json_t *o, char *err, size_t errlen)
{
	const char *id = qapi_get_str(o, "id"), *backend = qapi_get_str(o, "backend");

	if (!id) {
		snprintf(err, errlen, "chardev: no id specified");
		return -EINVAL;
	}
	if (!qapi_id_wellformed(id)) {
		snprintf(err, errlen, "Parameter 'id' expects an identifier");
		return -EINVAL;
	}
	if (!backend) {
		snprintf(err, errlen, "chardev: \"%s\" missing backend", id);
		return -EINVAL;
	}
	if (!in_list(backends, backend, strlen(backend))) {
		snprintf(err, errlen, "'%s' is not a valid char driver name", backend);
		return -EINVAL;
	}
	if (strcmp(backend, "socket")) {
		snprintf(err, errlen, "chardev '%s': ioplane has only the socket backend, not '%s'",
			 id, backend);
		return -EINVAL;
	}
	return socket_check(o, err, errlen);
}

static struct chardev_opt *find_chardev(struct monitor_set *ms, const char *id)
{
	unsigned i;

	for (i = 0; i < ms->nchardevs; i++)
		if (!strcmp(ms->chardevs[i].id, id))
			return &ms->chardevs[i];
	return NULL;
}

static void *grow(void *p, unsigned n, size_t size)
{
	return realloc(p, (n + 1) * size);
}

int monitor_set_add_chardev(struct monitor_set *ms, const char *arg, char *err, size_t errlen)
{
	json_t *o = qemuopts_parse(arg, err, errlen);
	struct chardev_opt c = {.arg = arg, .fd = -1}, *p;
	int ret = o ? chardev_check(o, err, errlen) : -EINVAL;

	if (!ret && find_chardev(ms, qapi_get_str(o, "id"))) {
		snprintf(err, errlen, "Duplicate ID '%s' for chardev", qapi_get_str(o, "id"));
		ret = -EINVAL;
	}
	if (!ret && qapi_has(o, "fd"))
		ret = parse_fd(qapi_get_str(o, "fd"), &c.fd, err, errlen);
	if (!ret) {
		c.id = strdup(qapi_get_str(o, "id"));
		c.path = qapi_has(o, "path") ? strdup(qapi_get_str(o, "path")) : NULL;
		p = grow(ms->chardevs, ms->nchardevs, sizeof(*p));
		if (!c.id || (qapi_has(o, "path") && !c.path) || !p) {
			free(c.id);
			free(c.path);
			snprintf(err, errlen, "out of memory");
			ret = -ENOMEM;
		}
		if (p)
			ms->chardevs = p;
		if (!ret)
			ms->chardevs[ms->nchardevs++] = c;
	}
	json_decref(o);
	return ret;
}

/* ---- --monitor (QAPI: MonitorOptions, and ioplane's unix= and fd=) ------- */

static const struct qapi_type monitor_options = QAPI_OBJECT_TYPE(
	"MonitorOptions",
	QAPI_MEMBERS(QAPI_OPT("id", &qapi_str), QAPI_OPT("mode", &qapi_str),
		     QAPI_OPT("pretty", &qapi_bool), QAPI_OPT("chardev", &qapi_str),
		     QAPI_OPT("unix", &qapi_str), QAPI_OPT("fd", &qapi_str),
		     QAPI_OPT("user", &qapi_str), QAPI_OPT("group", &qapi_str)));

/* mode= means MonitorMode with chardev=, the socket's permissions with unix=. */
static int monitor_mode(json_t *o, struct monitor_opt *m, char *err, size_t errlen)
{
	const char *mode = qapi_get_str(o, "mode");

	if (!mode)
		return 0;
	if (qapi_has(o, "unix")) {
		m->has_mode = true;
		if (parse_octal_mode(mode, &m->mode) == 0)
			return 0;
		snprintf(err, errlen, "mode must be octal permissions like 0600, not '%s'", mode);
		return -EINVAL;
	}
	if (!strcmp(mode, "control"))
		return 0;
	if (!strcmp(mode, "readline"))
		snprintf(err, errlen, "Only QMP is supported");
	else
		snprintf(err, errlen, "Parameter 'mode' does not accept value '%s'", mode);
	return -EINVAL;
}

static int monitor_check(json_t *o, struct monitor_opt *m, char *err, size_t errlen)
{
	unsigned n = qapi_has(o, "chardev") + qapi_has(o, "unix") + qapi_has(o, "fd");

	if (!n) {
		snprintf(err, errlen, "Parameter 'chardev' is missing");
		return -EINVAL;
	}
	if (n > 1) {
		snprintf(err, errlen, "give one of chardev=, unix= and fd=");
		return -EINVAL;
	}
	if (qapi_has(o, "unix") && !*qapi_get_str(o, "unix")) {
		snprintf(err, errlen, "unix= needs a socket path");
		return -EINVAL;
	}
	m->pretty = qapi_get_bool(o, "pretty", false);
	if ((qapi_has(o, "user") || qapi_has(o, "group")) && !qapi_has(o, "unix")) {
		snprintf(err, errlen, "user= and group= go with unix=");
		return -EINVAL;
	}
	if (svc_owner_lookup(qapi_get_str(o, "user"), qapi_get_str(o, "group"), &m->owner, err,
			     errlen) < 0)
		return -EINVAL;
	if (qapi_has(o, "fd") && parse_fd(qapi_get_str(o, "fd"), &m->fd, err, errlen) < 0)
		return -EINVAL;
	return monitor_mode(o, m, err, errlen);
}

int monitor_set_add_monitor(struct monitor_set *ms, const char *arg, char *err, size_t errlen)
{
	struct monitor_opt m = {.arg = arg, .fd = -1, .mode = 0600}, *p;
	json_t *o = qapi_parse_option(&monitor_options, arg, "chardev", err, errlen);
	int ret = o ? monitor_check(o, &m, err, errlen) : -EINVAL;

	if (!ret) {
		m.chardev = qapi_has(o, "chardev") ? strdup(qapi_get_str(o, "chardev")) : NULL;
		m.path = qapi_has(o, "unix") ? strdup(qapi_get_str(o, "unix")) : NULL;
		p = grow(ms->monitors, ms->nmonitors, sizeof(*p));
		if (p)
			ms->monitors = p;
		if (!p || (qapi_has(o, "chardev") && !m.chardev) ||
		    (qapi_has(o, "unix") && !m.path)) {
			free(m.chardev);
			free(m.path);
			snprintf(err, errlen, "out of memory");
			ret = -ENOMEM;
		} else {
			ms->monitors[ms->nmonitors++] = m;
		}
	}
	json_decref(o);
	return ret;
}

/* ---- the set -------------------------------------------------------------- */

struct monitor_set *monitor_set_new(void)
{
	return calloc(1, sizeof(struct monitor_set));
}

unsigned monitor_set_count(const struct monitor_set *ms)
{
	return ms ? ms->nmonitors : 0;
}

/* A chardev socket gets what bind() would give it under QEMU: 0777 less the
 * umask (read from /proc: umask() itself would change it for a moment). */
mode_t qmp_socket_mode(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	unsigned mask = 077;
	char line[128];

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "Umask: %o", &mask) == 1)
			break;
	if (f)
		fclose(f);
	return 0777 & ~(mode_t)mask;
}

/* The socket a monitor serves: a chardev's, or its own. */
static int monitor_config(struct monitor_set *ms, struct monitor_opt *m, struct monitor_config *cfg,
			  char *err, size_t errlen)
{
	struct chardev_opt *c;

	*cfg = (struct monitor_config){
		.path = m->path, .mode = m->mode, .fd = m->fd, .pretty = m->pretty};
	if (!m->chardev)
		return 0;
	c = find_chardev(ms, m->chardev);
	if (!c) {
		snprintf(err, errlen, "chardev \"%s\" not found", m->chardev);
		return -EINVAL;
	}
	if (c->used) {
		snprintf(err, errlen, "Device '%s' is in use", m->chardev);
		return -EINVAL;
	}
	c->used = true;
	cfg->path = c->path;
	cfg->fd = c->fd;
	cfg->mode = qmp_socket_mode();
	return 0;
}

int monitor_set_start(struct monitor_set *ms, struct loop *main_loop, char *err, size_t errlen)
{
	struct monitor_config cfg;
	char why[256];
	unsigned i;
	int ret;

	for (i = 0; i < ms->nmonitors; i++) {
		ret = monitor_config(ms, &ms->monitors[i], &cfg, why, sizeof(why));
		if (ret == 0)
			ret = monitor_start(main_loop, &cfg, &ms->monitors[i].mon, why,
					    sizeof(why));
		if (ret == 0 && ms->monitors[i].path)
			ret = svc_owner_apply(ms->monitors[i].path, &ms->monitors[i].owner, why,
					      sizeof(why));
		if (ret < 0) {
			snprintf(err, errlen, "--monitor %s: %s", ms->monitors[i].arg, why);
			return ret;
		}
	}
	for (i = 0; i < ms->nchardevs; i++)
		if (!ms->chardevs[i].used)
			log_warn("--chardev %s: no --monitor uses it", ms->chardevs[i].arg);
	return 0;
}

void monitor_set_take_passed(struct monitor_set *ms,
			     int (*take)(const char *name, const char *path))
{
	unsigned i;
	int fd;

	for (i = 0; ms && i < ms->nchardevs; i++) {
		struct chardev_opt *c = &ms->chardevs[i];

		if (c->fd < 0 && c->path && (fd = take(c->id, c->path)) >= 0) {
			c->fd = fd;
			free(c->path);
			c->path = NULL;
		}
	}
	for (i = 0; ms && i < ms->nmonitors; i++) {
		struct monitor_opt *m = &ms->monitors[i];

		if (m->path && (fd = take(NULL, m->path)) >= 0) {
			m->fd = fd;
			free(m->path);
			m->path = NULL;
		}
	}
}

void monitor_set_stop_listening(struct monitor_set *ms)
{
	unsigned i;

	for (i = 0; ms && i < ms->nmonitors; i++)
		monitor_stop_listening(ms->monitors[i].mon);
}

void monitor_set_free(struct monitor_set *ms)
{
	unsigned i;

	if (!ms)
		return;
	for (i = 0; i < ms->nmonitors; i++) {
		monitor_free(ms->monitors[i].mon);
		free(ms->monitors[i].chardev);
		free(ms->monitors[i].path);
	}
	for (i = 0; i < ms->nchardevs; i++) {
		free(ms->chardevs[i].id);
		free(ms->chardevs[i].path);
	}
	free(ms->monitors);
	free(ms->chardevs);
	free(ms);
}
