/* `ioplane qmp SOCKET COMMAND [KEY=VALUE... | JSON]`: a one-shot QMP client
 * for ioplane's monitor or qemu-storage-daemon's. It connects, negotiates,
 * sends one command, prints the reply's "return" on stdout and exits 0, or
 * prints the error's class and description on stderr and exits 1. Every
 * wait is bounded by --timeout.
 *
 * THREADING RULE: single-threaded. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "cmd/qmp-args.h"
#include "control/json.h"
#include "util/opts.h"

#define EXIT_USAGE 2
#define EVENT_LINGER_MS 100 /* -e: events that follow the reply this closely */

struct qmpc {
	int fd;
	int timeout_ms;
	bool events, pretty_events;
	size_t flags; /* jansson's, for the result */
	struct json_split split;
	uint8_t buf[65536];
	size_t head, len;
	json_int_t next_id;
};

static void qmp_usage(FILE *f)
{
	fprintf(f,
		"Usage: ioplane qmp [-e] [-t SECONDS] [-c] [-S] SOCKET COMMAND [KEY=VALUE... | "
		"JSON]\n"
		"\n"
		"Connects to the QMP monitor on the unix socket SOCKET (ioplane serve --monitor,\n"
		"qemu-storage-daemon --monitor), sends COMMAND and prints what it returns as\n"
		"JSON. Arguments are KEY=VALUE pairs in qemu-storage-daemon's command-line\n"
		"syntax (file.driver=file, iothreads.0=a), typed by the server's schema, or one\n"
		"JSON object. Exits 0 on success, 1 when the command fails (its error class and\n"
		"description on stderr) or the server cannot be reached in time, 2 on usage.\n"
		"\n"
		"  -e, --events          also print the events that arrive (one JSON per line)\n"
		"  -t, --timeout SECONDS give up on any wait after this long (default 30)\n"
		"  -c, --compact         print the result on one line\n"
		"  -S, --sort-keys       sort object keys in the result\n"
		"  -h, --help            show this help\n"
		"\n"
		"Examples:\n"
		"  ioplane qmp /run/ioplane.qmp query-version\n"
		"  ioplane qmp /run/ioplane.qmp query-commands\n"
		"  ioplane qmp -e /run/ioplane.qmp quit\n");
}

static int usage_error(const char *msg, const char *arg)
{
	fprintf(stderr, "ioplane qmp: %s%s%s (try 'ioplane qmp --help')\n", msg, arg ? " " : "",
		arg ? arg : "");
	return EXIT_USAGE;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int qmpc_connect(struct qmpc *c, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "ioplane qmp: %s: the path is too long for a unix socket\n", path);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		fprintf(stderr, "ioplane qmp: cannot connect to %s: %s\n", path, strerror(errno));
		return -errno;
	}
	return 0;
}

/* The next message, waiting up to wait_ms; NULL on timeout, EOF or error
 * (said on stderr unless quiet). */
static json_t *qmpc_read(struct qmpc *c, int wait_ms, bool quiet)
{
	int64_t deadline = now_ms() + wait_ms;
	struct pollfd p = {.fd = c->fd, .events = POLLIN};
	char err[256];
	size_t used;
	ssize_t n;

	for (;;) {
		while (c->head < c->len) {
			enum json_split_result r = json_split_feed(&c->split, c->buf + c->head,
								   c->len - c->head, &used);

			c->head += used;
			if (r == JSON_SPLIT_MSG) {
				json_t *v =
					qjson_parse(c->split.buf, c->split.len, err, sizeof(err));

				if (v)
					return v;
			}
			if (r == JSON_SPLIT_FATAL || r == JSON_SPLIT_MSG || r == JSON_SPLIT_ERROR) {
				if (!quiet)
					fprintf(stderr,
						"ioplane qmp: bad message from the server: %s\n",
						r == JSON_SPLIT_MSG ? err : c->split.error);
				return NULL;
			}
		}
		c->head = c->len = 0;
		n = poll(&p, 1, (int)(deadline > now_ms() ? deadline - now_ms() : 0));
		if (n == 0) {
			if (!quiet)
				fprintf(stderr, "ioplane qmp: no answer from the server in %d s\n",
					c->timeout_ms / 1000);
			return NULL;
		}
		n = n < 0 ? -1 : recv(c->fd, c->buf, sizeof(c->buf), 0);
		if (n <= 0) {
			if (!quiet)
				fprintf(stderr, "ioplane qmp: the server %s\n",
					n ? strerror(errno) : "closed the connection");
			return NULL;
		}
		c->len = (size_t)n;
	}
}

static void print_event(struct qmpc *c, json_t *msg)
{
	if (c->events) {
		json_dumpf(msg, stdout, JSON_COMPACT | JSON_ENSURE_ASCII);
		putchar('\n');
		fflush(stdout);
	}
}

/* Send {"execute": name, "arguments": args (stolen), "id": N} and return
 * the reply with that id; events that come first are printed (-e). */
static json_t *qmpc_call(struct qmpc *c, const char *name, json_t *args)
{
	json_int_t id = ++c->next_id;
	json_t *msg = json_pack("{s:s,s:I}", "execute", name, "id", id), *r;
	char *text;

	if (msg && args)
		json_object_set_new(msg, "arguments", args);
	else
		json_decref(args);
	text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
	json_decref(msg);
	if (!text || send(c->fd, text, strlen(text), MSG_NOSIGNAL) != (ssize_t)strlen(text)) {
		fprintf(stderr, "ioplane qmp: cannot send to the server: %s\n", strerror(errno));
		free(text);
		return NULL;
	}
	free(text);
	while ((r = qmpc_read(c, c->timeout_ms, false))) {
		if (json_object_get(r, "event") && !json_object_get(r, "id"))
			print_event(c, r);
		else if (json_integer_value(json_object_get(r, "id")) == id)
			return r;
		json_decref(r);
	}
	return NULL;
}

/* The greeting, then qmp_capabilities. */
static int qmpc_handshake(struct qmpc *c)
{
	json_t *g = qmpc_read(c, c->timeout_ms, false), *r;
	bool ok;

	if (!g)
		return -EIO;
	ok = json_object_get(g, "QMP") != NULL;
	json_decref(g);
	if (!ok) {
		fprintf(stderr, "ioplane qmp: the server did not greet with QMP\n");
		return -EPROTO;
	}
	r = qmpc_call(c, "qmp_capabilities", NULL);
	ok = r && json_object_get(r, "return");
	json_decref(r);
	if (r && !ok)
		fprintf(stderr, "ioplane qmp: capabilities negotiation failed\n");
	return ok ? 0 : -EPROTO;
}

/* COMMAND's arguments from the command line (NULL args: none). */
static int build_args(struct qmpc *c, const char *cmd, char **argv, int argc, json_t **out)
{
	json_t *schema = NULL, *r;
	char err[512];
	int i;

	*out = NULL;
	if (!argc)
		return 0;
	if (argc == 1 && argv[0][0] == '{') {
		*out = qjson_parse(argv[0], strlen(argv[0]), err, sizeof(err));
		if (*out && json_is_object(*out))
			return 0;
		json_decref(*out);
		return usage_error(*out ? "the arguments must be a JSON object" : err, NULL);
	}
	for (i = 0; i < argc; i++)
		if (!strchr(argv[i], '='))
			return usage_error("expected KEY=VALUE or one JSON object, not", argv[i]);
	r = qmpc_call(c, "query-qmp-schema", NULL);
	if (!r)
		return 1;
	schema = json_object_get(r, "return");
	*out = qmp_args_from_keyval(argv, argc, cmd, schema, err, sizeof(err));
	json_decref(r);
	if (*out)
		return 0;
	fprintf(stderr, "ioplane qmp: %s: %s\n", cmd, err);
	return 1;
}

/* Print the result or the error; the exit status. */
static int report(struct qmpc *c, json_t *r)
{
	json_t *ret = json_object_get(r, "return"), *e = json_object_get(r, "error");
	json_t *ev;

	if (ret) {
		json_dumpf(ret, stdout, c->flags);
		putchar('\n');
		fflush(stdout);
	} else {
		const char *cls = json_string_value(json_object_get(e, "class"));
		const char *desc = json_string_value(json_object_get(e, "desc"));

		fprintf(stderr, "ioplane qmp: %s: %s\n", cls ? cls : "(no class)",
			desc ? desc : "(no description)");
	}
	/* -e: events right behind the reply (SHUTDOWN after quit). */
	while (c->events && (ev = qmpc_read(c, EVENT_LINGER_MS, true))) {
		if (json_object_get(ev, "event"))
			print_event(c, ev);
		json_decref(ev);
	}
	return ret ? 0 : 1;
}

static const struct option qmp_long_opts[] = {
	{"events", no_argument, NULL, 'e'},  {"timeout", required_argument, NULL, 't'},
	{"compact", no_argument, NULL, 'c'}, {"sort-keys", no_argument, NULL, 'S'},
	{"help", no_argument, NULL, 'h'},    {NULL, 0, NULL, 0},
};

static int qmp_parse(struct qmpc *c, int argc, char **argv)
{
	uint64_t secs;
	int o;

	opterr = 0;
	optind = 1;
	while ((o = getopt_long(argc, argv, "+et:cSh", qmp_long_opts, NULL)) != -1) {
		if (o == 'e') {
			c->events = true;
		} else if (o == 't') {
			if (parse_u64(optarg, &secs) < 0 || !secs || secs > 86400)
				return usage_error("--timeout: expected 1..86400 seconds, not",
						   optarg);
			c->timeout_ms = (int)secs * 1000;
		} else if (o == 'c') {
			c->flags = (c->flags & ~(size_t)JSON_INDENT(0x1f)) | JSON_COMPACT;
		} else if (o == 'S') {
			c->flags |= JSON_SORT_KEYS;
		} else if (o == 'h') {
			qmp_usage(stdout);
			return 0;
		} else {
			return usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (argc - optind < 2)
		return usage_error("expected SOCKET COMMAND", NULL);
	return -1;
}

int cmd_qmp(int argc, char **argv)
{
	struct qmpc *c = calloc(1, sizeof(*c));
	json_t *args = NULL, *r = NULL;
	int status;

	if (!c)
		return 1;
	c->fd = -1;
	c->timeout_ms = 30000;
	c->flags = JSON_INDENT(2) | JSON_ENSURE_ASCII;
	json_split_init(&c->split);
	status = qmp_parse(c, argc, argv);
	if (status >= 0)
		goto out;
	if (!qjson_utf8_valid(argv[optind + 1], strlen(argv[optind + 1]))) {
		status = usage_error("the command name is not valid UTF-8", NULL);
		goto out;
	}
	status = 1;
	if (qmpc_connect(c, argv[optind]) < 0 || qmpc_handshake(c) < 0)
		goto out;
	status = build_args(c, argv[optind + 1], argv + optind + 2, argc - optind - 2, &args);
	if (status)
		goto out;
	r = qmpc_call(c, argv[optind + 1], args);
	status = r ? report(c, r) : 1;
	json_decref(r);
out:
	if (c->fd >= 0)
		close(c->fd);
	json_split_free(&c->split);
	free(c);
	return status;
}
