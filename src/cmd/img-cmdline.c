/* `ioplane img`: the command line of every subcommand from one option table
 * (img_parse_args), and the values qemu-img's options take (sizes as its
 * qemu_strtosz reads them, --output, cache modes) with its messages.
 *
 * Threading: main thread only (getopt's globals). */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/img-int.h"

/* ---- values ---- */

int img_parse_output(const char *arg, enum img_output *out)
{
	if (!strcmp(arg, "human")) {
		*out = IMG_OUT_HUMAN;
	} else if (!strcmp(arg, "json")) {
		*out = IMG_OUT_JSON;
	} else {
		img_err("--output must be used with human or json as argument.");
		return -EINVAL;
	}
	return 0;
}

int img_check_cache(const char *cache, bool source)
{
	static const char *const ok[] = {
		"none", "writeback", "writethrough", "directsync", "unsafe", "off", "on",
	};
	size_t i;

	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (!strcmp(cache, ok[i]))
			return 0;
	img_err("Invalid %scache option: %s", source ? "source " : "", cache);
	return -EINVAL;
}

static int img_suffix_shift(char c)
{
	static const char suffixes[] = "bkmgtpe"; /* bytes, then 2^10 each */
	const char *p = c ? strchr(suffixes, tolower((unsigned char)c)) : NULL;

	return p ? (int)(p - suffixes) * 10 : -1;
}

/* 0.DIGITS (n of them) of 2^shift bytes, rounded half up, exactly: the
 * decimal digits are doubled shift times, what carries out of the first
 * one is the whole part. (qemu-img goes through a double, which gets the
 * last of 20 digits wrong.) */
static int img_frac_bytes(const char *digits, size_t n, int shift, uint64_t *out)
{
	uint64_t whole = 0;
	unsigned char *d;
	size_t i;

	while (n && digits[n - 1] == '0')
		n--;
	*out = 0;
	if (!n)
		return 0;
	d = malloc(n);
	if (!d)
		return -ENOMEM;
	for (i = 0; i < n; i++)
		d[i] = (unsigned char)(digits[i] - '0');
	for (int r = 0; r < shift; r++) {
		unsigned carry = 0;

		for (i = n; i-- > 0;) {
			unsigned v = d[i] * 2u + carry;

			d[i] = (unsigned char)(v % 10);
			carry = v / 10;
		}
		whole = whole * 2 + carry;
	}
	*out = whole + (d[0] >= 5);
	free(d);
	return 0;
}

struct img_num {
	uint64_t v;
	bool over, hex;
	const char *frac; /* digits after '.', or NULL */
	size_t nfrac;
};

/* Leading blanks, '+', then decimal digits or "0x" and hex digits, then
 * for decimal an optional ".DIGITS" without an exponent. *p moves past. */
static int img_num_parse(const char **p, struct img_num *n)
{
	const char *s = *p;
	unsigned base = 10;

	while (isspace((unsigned char)*s))
		s++;
	if (*s == '+')
		s++;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		if (!isxdigit((unsigned char)s[2]))
			return -EINVAL;
		n->hex = true;
		base = 16;
		s += 2;
	}
	for (; n->hex ? isxdigit((unsigned char)*s) : isdigit((unsigned char)*s); s++) {
		unsigned d = isdigit((unsigned char)*s) ? (unsigned)(*s - '0')
							: (unsigned)(tolower(*s) - 'a' + 10);

		n->over |= __builtin_mul_overflow(n->v, base, &n->v);
		n->over |= __builtin_add_overflow(n->v, d, &n->v);
	}
	if (*s == '.' && !n->over) { /* qemu-img stops at an overflow */
		if (n->hex)
			return -EINVAL;
		n->frac = ++s;
		while (isdigit((unsigned char)*s))
			s++;
		n->nfrac = (size_t)(s - n->frac);
		if (n->nfrac && (*s == 'e' || *s == 'E') &&
		    (isdigit((unsigned char)s[1]) ||
		     ((s[1] == '+' || s[1] == '-') && isdigit((unsigned char)s[2]))))
			return -EINVAL; /* an exponent: 1.5e3 */
	}
	*p = s;
	return 0;
}

int img_strtosz_quiet(const char *s, uint64_t *out, bool *hex_suffix)
{
	struct img_num n = {0};
	const char *p = s;
	uint64_t fb;
	int shift = -1, ret = img_num_parse(&p, &n);

	if (ret || (n.over && *p))
		return -EINVAL; /* qemu-img: past an overflow, anything is malformed */
	if (*p) {
		shift = img_suffix_shift(*p);
		if (shift < 0 || p[1])
			return -EINVAL;
	}
	if (n.over)
		return -ERANGE;
	*hex_suffix = n.hex && shift >= 0;
	if (shift < 0)
		shift = 0;
	ret = img_frac_bytes(n.frac ? n.frac : "", n.nfrac, shift, &fb);
	if (ret)
		return ret;
	if (!shift && n.frac && strspn(n.frac, "0") < n.nfrac)
		return -EINVAL; /* a fraction of a byte */
	if ((shift && n.v > (UINT64_MAX >> shift)) || __builtin_add_overflow(n.v << shift, fb, out))
		return -ERANGE;
	return 0;
}

int img_strtosz(const char *s, uint64_t *out)
{
	bool hex_suffix = false;
	int ret = img_strtosz_quiet(s, out, &hex_suffix);

	if (hex_suffix)
		img_err("warning: Using a multiplier suffix on hex numbers is deprecated: %s", s);
	return ret;
}

int img_parse_size(const char *arg, const char *what, uint64_t *out)
{
	int ret = img_strtosz(arg, out);

	if (ret == -ERANGE || (!ret && *out > (uint64_t)INT64_MAX)) {
		img_err("Invalid %s specified. Must be between 0 and %" PRId64 ".", what,
			INT64_MAX);
		return -ERANGE;
	}
	if (ret) {
		img_err("Invalid %s specified. You may use k, M, G, T, P or E suffixes for "
			"kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.",
			what);
		return -EINVAL;
	}
	return 0;
}

int img_parse_size_param(const char *file, const char *key, const char *arg, uint64_t *out)
{
	int ret = img_strtosz(arg, out);

	if (ret == -ERANGE) {
		img_err("%s%sValue '%s' is out of range for parameter '%s'", file ? file : "",
			file ? ": " : "", arg, key);
		return -ERANGE;
	}
	if (ret) {
		img_err("%s%sParameter '%s' expects a non-negative number below 2^64 (optional "
			"suffix k, M, G, T, P or E means kilo-, mega-, giga-, tera-, peta- and "
			"exabytes, respectively)",
			file ? file : "", file ? ": " : "", key);
		return -EINVAL;
	}
	return 0;
}

int img_parse_number_param(const char *file, const char *key, const char *arg, uint64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoull(arg, &end, 0); /* as qemu_strtou64: "-1" wraps, 0x and 0 prefixes */
	if (errno == ERANGE) {
		img_err("%s%sValue '%s' is too large for parameter '%s'", file ? file : "",
			file ? ": " : "", arg, key);
		return -ERANGE;
	}
	if (end == arg || *end) {
		img_err("%s%sParameter '%s' expects a number", file ? file : "", file ? ": " : "",
			key);
		return -EINVAL;
	}
	return 0;
}

/* ---- the option table ---- */

#define IMG_MAX_OPTS 24

static void img_bad_opt(const char *cmd, int c, char **argv)
{
	const char *arg = argv[optind - 1];

	fflush(stdout);
	if (c == ':')
		fprintf(stderr, "%s %s: option '%s' requires an argument", IMG_PROG, cmd, arg);
	else if (optopt && strncmp(arg, "--", 2))
		fprintf(stderr, "%s %s: invalid option -- '%c'", IMG_PROG, cmd, optopt);
	else
		fprintf(stderr, "%s %s: unrecognized option '%s'", IMG_PROG, cmd, arg);
	fprintf(stderr, " (try '%s %s --help')\n", IMG_PROG, cmd);
}

/* The options every subcommand may take, each behind its IMG_C_* bit. */
static const struct {
	unsigned bit;
	struct img_opt o;
} img_common[] = {
	{IMG_C_FORMAT, {'f', "format", true}},
	{IMG_C_OUTPUT, {IMG_OPT_OUTPUT, "output", true}},
	{IMG_C_FORCE_SHARE, {'U', "force-share", false}},
	{IMG_C_QUIET, {'q', "quiet", false}},
	{IMG_C_IMAGE_OPTS, {IMG_OPT_IMAGE_OPTS, "image-opts", false}},
};

static void img_opt_add(const struct img_opt *o, char *shorts, size_t *ns, struct option *longs,
			size_t *nl)
{
	if (o->key < 256) {
		shorts[(*ns)++] = (char)o->key;
		if (o->arg)
			shorts[(*ns)++] = ':';
	}
	if (o->name)
		longs[(*nl)++] = (struct option){o->name, o->arg ? required_argument : no_argument,
						 NULL, o->key};
}

/* getopt's short option string and long options for cmd. */
static void img_opts_build(const struct img_cmd *cmd, char *shorts, struct option *longs)
{
	static const struct img_opt help = {'h', "help", false};
	size_t ns = 0, nl = 0, i;

	shorts[ns++] = ':';
	img_opt_add(&help, shorts, &ns, longs, &nl);
	for (i = 0; i < sizeof(img_common) / sizeof(img_common[0]); i++)
		if (cmd->common & img_common[i].bit)
			img_opt_add(&img_common[i].o, shorts, &ns, longs, &nl);
	for (i = 0; cmd->opts && cmd->opts[i].key; i++)
		img_opt_add(&cmd->opts[i], shorts, &ns, longs, &nl);
	shorts[ns] = 0;
	longs[nl] = (struct option){0};
}

static int img_common_opt(int c, const char *arg, struct img_args *a)
{
	switch (c) {
	case 'f':
		a->fmt = arg;
		return 0;
	case 'U':
		a->force_share = true;
		return 0;
	case 'q':
		a->quiet = true;
		return 0;
	case IMG_OPT_IMAGE_OPTS:
		a->image_opts = true;
		return 0;
	case IMG_OPT_OUTPUT:
		return img_parse_output(arg, &a->out);
	default:
		return 1; /* not a common option */
	}
}

int img_parse_args(const struct img_cmd *cmd, int argc, char **argv, void *ctx, struct img_args *a)
{
	char shorts[3 * IMG_MAX_OPTS];
	struct option longs[IMG_MAX_OPTS + 1];
	int c, ret;

	memset(a, 0, sizeof(*a));
	img_opts_build(cmd, shorts, longs);
	optind = 0; /* glibc: full re-initialisation, argv[0] is the subcommand */
	opterr = 0;
	while ((c = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
		if (c == 'h') {
			cmd->usage(stdout);
			return 1;
		}
		if (c == '?' || c == ':') {
			img_bad_opt(cmd->name, c, argv);
			return -EINVAL;
		}
		ret = img_common_opt(c, optarg, a);
		if (ret > 0)
			ret = cmd->opt(ctx, c, optarg);
		if (ret)
			return ret;
	}
	if (a->image_opts && a->fmt) {
		img_err("--image-opts and --format are mutually exclusive");
		return -EINVAL;
	}
	a->files = argv + optind;
	a->nfiles = argc - optind;
	if (a->nfiles < cmd->min_files || a->nfiles > cmd->max_files) {
		img_err("%s (try '%s %s --help')", cmd->files_err, IMG_PROG, cmd->name);
		return -EINVAL;
	}
	return 0;
}
