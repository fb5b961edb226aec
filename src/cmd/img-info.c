/* `ioplane img info` and `ioplane img check`, printing what qemu-img prints
 * (human text, or JSON with qemu-img's key names and key order) so that
 * scripts written for one work with the other:
 *   info [-f FMT] [--output=human|json] [--backing-chain] [-U] FILE
 *   check [-f FMT] [--output=human|json] [-r leaks|all] [-q] [-U] FILE
 * check exits like qemu-img check: 0 clean, 1 check not completed,
 * 2 corruptions, 3 leaks only, 63 format without checks.
 *
 * Threading: main thread only. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block/block.h"
#include "block/qcow2/qcow2.h"
#include "cmd/cmd.h"
#include "cmd/img-int.h"
#include "loop/loop.h"
#include "util/path.h"

#define CHECK_EXIT_UNSUPPORTED 63

/* One layer of an image (the top, or one of its backing files). */
struct info_layer {
	const char *filename; /* as shown */
	const char *format;
	uint64_t virtual_size;
	int64_t actual_size; /* -1: unknown */
	bool is_qcow2;
	struct qcow2_info q;
	struct qcow2_bitmap_info *bitmaps;
	unsigned nb_bitmaps;
	char *full_backing; /* backing file path resolved against filename */
};

/* ---- gathering ---- */

static int info_layer_get(struct blk_node *bs, const char *filename, const char *fmt,
			  struct info_layer *l, char *err, size_t errlen)
{
	int ret;

	memset(l, 0, sizeof(*l));
	l->filename = filename;
	l->format = fmt;
	l->virtual_size = img_size(bs);
	l->actual_size = img_allocated_size(filename);
	if (!qcow2_is(bs))
		return 0;
	ret = qcow2_get_info(bs, &l->q);
	if (ret)
		return ret;
	l->is_qcow2 = true;
	ret = qcow2_get_bitmaps(bs, &l->bitmaps, &l->nb_bitmaps, err, errlen);
	if (ret)
		return ret;
	if (l->q.backing_file && !(l->full_backing = path_relative(filename, l->q.backing_file)))
		return -ENOMEM;
	return 0;
}

static void info_layer_free(struct info_layer *l)
{
	if (l->is_qcow2)
		qcow2_info_free(&l->q);
	qcow2_bitmaps_free(l->bitmaps, l->nb_bitmaps);
	free(l->full_backing);
}

/* ---- human ---- */

void img_print_snapshots(const struct qcow2_info *q)
{
	char size[32], date[32], clk[48], icount[32];
	unsigned i;

	printf("Snapshot list:\n%-10s%-17s%8s%20s%13s%11s\n", "ID", "TAG", "VM SIZE", "DATE",
	       "VM CLOCK", "ICOUNT");
	for (i = 0; i < q->nb_snapshots; i++) {
		const struct qcow2_snapshot_info *sn = &q->snapshots[i];
		uint64_t secs = sn->vm_clock_nsec / 1000000000u;
		time_t t = (time_t)sn->date_sec;
		struct tm tm;

		img_size_str(sn->vm_state_size, size, sizeof(size));
		if (!localtime_r(&t, &tm) ||
		    !strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &tm))
			snprintf(date, sizeof(date), "?");
		snprintf(clk, sizeof(clk), "%02d:%02d:%02d.%03d", (int)(secs / 3600),
			 (int)((secs / 60) % 60), (int)(secs % 60),
			 (int)((sn->vm_clock_nsec / 1000000) % 1000));
		icount[0] = 0;
		if (sn->icount != UINT64_MAX)
			snprintf(icount, sizeof(icount), "%" PRId64, (int64_t)sn->icount);
		printf("%-9s %-16s %8s%20s%13s%11s\n", sn->id, sn->name, size, date, clk, icount);
	}
}

/* The qcow2_bitmap_info flags by qemu-img's names, in its order. */
static const struct {
	uint32_t bit;
	const char *name;
} info_bm_flags[] = {{QCOW2_BITMAP_IN_USE, "in-use"}, {QCOW2_BITMAP_AUTO, "auto"}};

static void info_human_bitmaps(const struct info_layer *l)
{
	unsigned i, j, k;

	printf("    bitmaps:\n");
	for (i = 0; i < l->nb_bitmaps; i++) {
		printf("        [%u]:\n            flags:\n", i);
		for (j = 0, k = 0; j < sizeof(info_bm_flags) / sizeof(info_bm_flags[0]); j++)
			if (l->bitmaps[i].flags & info_bm_flags[j].bit)
				printf("                [%u]: %s\n", k++, info_bm_flags[j].name);
		printf("            name: %s\n            granularity: %" PRIu32 "\n",
		       l->bitmaps[i].name, l->bitmaps[i].granularity);
	}
}

static void info_human_specific(const struct info_layer *l)
{
	const struct qcow2_info *q = &l->q;
	bool v3 = q->version >= 3;

	printf("Format specific information:\n");
	printf("    compat: %s\n", v3 ? "1.1" : "0.10");
	printf("    compression type: %s\n",
	       q->compression_type == QCOW2_COMPRESSION_ZSTD ? "zstd" : "zlib");
	if (v3)
		printf("    lazy refcounts: %s\n", q->lazy_refcounts ? "true" : "false");
	if (l->nb_bitmaps)
		info_human_bitmaps(l);
	printf("    refcount bits: %u\n", q->refcount_bits);
	if (!v3)
		return;
	if (q->data_file) {
		printf("    data file: %s\n", q->data_file);
		printf("    data file raw: %s\n", q->data_file_raw ? "true" : "false");
	}
	printf("    corrupt: %s\n", q->corrupt ? "true" : "false");
	printf("    extended l2: %s\n", q->extended_l2 ? "true" : "false");
}

static void info_human(const struct info_layer *l)
{
	char vs[32], ds[32];

	img_size_str(l->virtual_size, vs, sizeof(vs));
	if (l->actual_size >= 0)
		img_size_str((uint64_t)l->actual_size, ds, sizeof(ds));
	else
		snprintf(ds, sizeof(ds), "unavailable");
	printf("image: %s\nfile format: %s\nvirtual size: %s (%" PRIu64 " bytes)\n"
	       "disk size: %s\n",
	       l->filename, l->format, vs, l->virtual_size, ds);
	if (!l->is_qcow2)
		return;
	printf("cluster_size: %" PRIu64 "\n", l->q.cluster_size);
	if (l->q.dirty)
		printf("cleanly shut down: no\n");
	if (l->q.backing_file) {
		printf("backing file: %s", l->q.backing_file);
		if (strcmp(l->q.backing_file, l->full_backing))
			printf(" (actual path: %s)", l->full_backing);
		printf("\n");
		if (l->q.backing_format)
			printf("backing file format: %s\n", l->q.backing_format);
	}
	if (l->q.nb_snapshots)
		img_print_snapshots(&l->q);
	info_human_specific(l);
}

/* ---- JSON (qemu-img's key order) ---- */

static void json_key(int ind, const char *key)
{
	img_indent(stdout, ind);
	img_json_str(stdout, key);
	fputs(": ", stdout);
}

static void json_kstr(int ind, const char *key, const char *val, bool more)
{
	json_key(ind, key);
	img_json_str(stdout, val);
	fputs(more ? ",\n" : "\n", stdout);
}

static void json_knum(int ind, const char *key, int64_t val, bool more)
{
	json_key(ind, key);
	printf("%" PRId64 "%s\n", val, more ? "," : "");
}

static void json_kbool(int ind, const char *key, bool val, bool more)
{
	json_key(ind, key);
	printf("%s%s\n", val ? "true" : "false", more ? "," : "");
}

static void info_json_snapshots(int ind, const struct qcow2_info *q)
{
	unsigned i;

	json_key(ind, "snapshots");
	printf("[\n");
	for (i = 0; i < q->nb_snapshots; i++) {
		const struct qcow2_snapshot_info *sn = &q->snapshots[i];

		img_indent(stdout, ind + 1);
		printf("{\n");
		if (sn->icount != UINT64_MAX)
			json_knum(ind + 2, "icount", (int64_t)sn->icount, true);
		json_knum(ind + 2, "vm-clock-nsec", (int64_t)(sn->vm_clock_nsec % 1000000000u),
			  true);
		json_kstr(ind + 2, "name", sn->name, true);
		json_knum(ind + 2, "date-sec", sn->date_sec, true);
		json_knum(ind + 2, "date-nsec", sn->date_nsec, true);
		json_knum(ind + 2, "vm-clock-sec", (int64_t)(sn->vm_clock_nsec / 1000000000u),
			  true);
		json_kstr(ind + 2, "id", sn->id, true);
		json_knum(ind + 2, "vm-state-size", (int64_t)sn->vm_state_size, false);
		img_indent(stdout, ind + 1);
		printf("}%s\n", i + 1 < q->nb_snapshots ? "," : "");
	}
	img_indent(stdout, ind);
	printf("],\n");
}

static void info_json_bitmap(int ind, const struct qcow2_bitmap_info *b)
{
	bool first = true;

	img_indent(stdout, ind);
	printf("{\n");
	json_key(ind + 1, "flags");
	printf("[\n");
	for (unsigned j = 0; j < sizeof(info_bm_flags) / sizeof(info_bm_flags[0]); j++) {
		if (!(b->flags & info_bm_flags[j].bit))
			continue;
		printf("%s", first ? "" : ",\n");
		img_indent(stdout, ind + 2);
		img_json_str(stdout, info_bm_flags[j].name);
		first = false;
	}
	printf("%s", first ? "" : "\n");
	img_indent(stdout, ind + 1);
	printf("],\n");
	json_kstr(ind + 1, "name", b->name, true);
	json_knum(ind + 1, "granularity", b->granularity, false);
	img_indent(stdout, ind);
	printf("}");
}

static void info_json_bitmaps(int ind, const struct info_layer *l)
{
	json_key(ind, "bitmaps");
	printf("[\n");
	for (unsigned i = 0; i < l->nb_bitmaps; i++) {
		info_json_bitmap(ind + 1, &l->bitmaps[i]);
		printf("%s\n", i + 1 < l->nb_bitmaps ? "," : "");
	}
	img_indent(stdout, ind);
	printf("],\n");
}

static void info_json_specific(int ind, const struct info_layer *l)
{
	const struct qcow2_info *q = &l->q;
	bool v3 = q->version >= 3;

	json_key(ind, "format-specific");
	printf("{\n");
	json_kstr(ind + 1, "type", "qcow2", true);
	json_key(ind + 1, "data");
	printf("{\n");
	json_kstr(ind + 2, "compat", v3 ? "1.1" : "0.10", true);
	json_kstr(ind + 2, "compression-type",
		  q->compression_type == QCOW2_COMPRESSION_ZSTD ? "zstd" : "zlib", true);
	if (v3)
		json_kbool(ind + 2, "lazy-refcounts", q->lazy_refcounts, true);
	if (l->nb_bitmaps)
		info_json_bitmaps(ind + 2, l);
	json_knum(ind + 2, "refcount-bits", q->refcount_bits, v3);
	if (v3 && q->data_file) {
		json_kstr(ind + 2, "data-file", q->data_file, true);
		json_kbool(ind + 2, "data-file-raw", q->data_file_raw, true);
	}
	if (v3) {
		json_kbool(ind + 2, "corrupt", q->corrupt, true);
		json_kbool(ind + 2, "extended-l2", q->extended_l2, false);
	}
	img_indent(stdout, ind + 1);
	printf("}\n");
	img_indent(stdout, ind);
	printf("},\n");
}

static void info_json(int ind, const struct info_layer *l)
{
	const struct qcow2_info *q = &l->q;

	img_indent(stdout, ind);
	printf("{\n");
	if (l->is_qcow2 && q->backing_file && q->backing_format)
		json_kstr(ind + 1, "backing-filename-format", q->backing_format, true);
	if (l->is_qcow2 && q->nb_snapshots)
		info_json_snapshots(ind + 1, q);
	json_knum(ind + 1, "virtual-size", (int64_t)l->virtual_size, true);
	json_kstr(ind + 1, "filename", l->filename, true);
	if (l->is_qcow2)
		json_knum(ind + 1, "cluster-size", (int64_t)q->cluster_size, true);
	json_kstr(ind + 1, "format", l->format, true);
	if (l->actual_size >= 0)
		json_knum(ind + 1, "actual-size", l->actual_size, true);
	if (l->is_qcow2)
		info_json_specific(ind + 1, l);
	if (l->is_qcow2 && q->backing_file) {
		json_kstr(ind + 1, "full-backing-filename", l->full_backing, true);
		json_kstr(ind + 1, "backing-filename", q->backing_file, true);
	}
	json_kbool(ind + 1, "dirty-flag", l->is_qcow2 && q->dirty, false);
	img_indent(stdout, ind);
	printf("}");
}

/* ---- info ---- */

struct info_args {
	struct img_args c;
	const char *file;
	bool chain;
};

static void info_usage(FILE *f)
{
	fprintf(f, "Usage: ioplane img info [-f FMT | --image-opts] [--output=human|json]\n"
		   "         [--backing-chain] [-U] FILE\n");
}

enum { OPT_BACKING_CHAIN = IMG_OPT_LOCAL };

static int info_opt(void *ctx, int key, const char *arg)
{
	struct info_args *a = ctx;

	(void)arg;
	if (key == OPT_BACKING_CHAIN)
		a->chain = true;
	return 0;
}

static const struct img_opt info_opts[] = {
	{OPT_BACKING_CHAIN, "backing-chain", false},
	{0},
};

static const struct img_cmd info_cmd = {
	.name = "info",
	.common = IMG_C_FORMAT | IMG_C_OUTPUT | IMG_C_FORCE_SHARE | IMG_C_IMAGE_OPTS,
	.opts = info_opts,
	.opt = info_opt,
	.usage = info_usage,
	.min_files = 1,
	.max_files = 1,
	.files_err = "Expecting one image file name",
};

/* Print one layer; the chain's layers are separated like qemu-img's. */
static void info_print(const struct info_args *a, const struct info_layer *l, unsigned i, bool last)
{
	if (a->c.out == IMG_OUT_HUMAN) {
		if (i)
			printf("\n");
		info_human(l);
		return;
	}
	if (!a->chain) {
		info_json(0, l);
		printf("\n");
		return;
	}
	if (!i)
		printf("[\n");
	info_json(1, l);
	printf("%s\n", last ? "\n]" : ",");
}

static int info_walk(const struct info_args *a, struct blk_node *bs, const char *fmt)
{
	struct info_layer l;
	char *name = NULL, *next_name, err[256];
	unsigned i;
	int ret = 0;

	for (i = 0; bs && !ret; i++) {
		err[0] = 0;
		ret = info_layer_get(bs, name ? name : a->file, fmt, &l, err, sizeof(err));
		if (ret) {
			img_err("%s: cannot read the image information: %s", name ? name : a->file,
				err[0] ? err : strerror(-ret));
			info_layer_free(&l);
			break;
		}
		bs = a->chain && l.is_qcow2 ? qcow2_backing(bs) : NULL;
		info_print(a, &l, i, !bs);
		next_name = NULL;
		if (bs) { /* the next layer's name: taken over from this one */
			next_name = l.full_backing;
			l.full_backing = NULL;
		}
		info_layer_free(&l);
		free(name);
		name = next_name;
		if (bs)
			fmt = qcow2_is(bs) ? "qcow2" : "raw";
	}
	free(name);
	return ret;
}

int cmd_img_info(int argc, char **argv)
{
	struct info_args a = {0};
	struct img_open_opts oo = {0};
	struct blk_node *bs = NULL;
	struct loop *loop = NULL;
	const char *fmt = NULL;
	int ret = img_parse_args(&info_cmd, argc, argv, &a, &a.c);

	if (ret)
		return ret > 0 ? 0 : 1;
	a.file = a.c.files[0];
	img_open_opts_from(&oo, &a.c);
	oo.flags |= IMG_OPEN_NO_IO | (a.chain ? 0 : IMG_OPEN_NO_BACKING);
	ret = img_loop_start(&loop);
	if (!ret)
		ret = img_open(a.file, &oo, &bs, &fmt);
	if (!ret)
		ret = info_walk(&a, bs, fmt);
	img_loop_end(loop, bs);
	return ret ? 1 : 0;
}

/* ---- check ---- */

struct check_args {
	struct img_args c;
	const char *file, *cache;
	int repair;
};

static void check_usage(FILE *f)
{
	fprintf(f, "Usage: ioplane img check [-f FMT | --image-opts] [--output=human|json]\n"
		   "         [-r leaks|all] [-q] [-T SRC_CACHE] [-U] FILE\n\n"
		   "Exit status: 0 no problem, 1 check not completed, 2 corruptions, 3 leaks,\n"
		   "63 the format has no checks.\n");
}

static int check_parse_repair(const char *arg, int *out)
{
	if (!strcmp(arg, "leaks")) {
		*out = QCOW2_FIX_LEAKS;
	} else if (!strcmp(arg, "all")) {
		*out = QCOW2_FIX_LEAKS | QCOW2_FIX_ERRORS;
	} else {
		img_err("Unknown option value for -r (expecting 'leaks' or 'all'): %s", arg);
		return -EINVAL;
	}
	return 0;
}

static int check_opt(void *ctx, int key, const char *arg)
{
	struct check_args *a = ctx;

	if (key == 'r')
		return check_parse_repair(arg, &a->repair);
	if (img_check_cache(arg, true)) /* -T */
		return -EINVAL;
	a->cache = arg;
	return 0;
}

static const struct img_opt check_opts[] = {
	{'r', "repair", true},
	{'T', NULL, true},
	{0},
};

static const struct img_cmd check_cmd = {
	.name = "check",
	.common = IMG_C_FORMAT | IMG_C_OUTPUT | IMG_C_FORCE_SHARE | IMG_C_QUIET | IMG_C_IMAGE_OPTS,
	.opts = check_opts,
	.opt = check_opt,
	.usage = check_usage,
	.min_files = 1,
	.max_files = 1,
	.files_err = "Expecting one image file name",
};

static void check_human(const struct qcow2_check_result *r)
{
	if (!r->corruptions && !r->leaks && !r->check_errors)
		printf("No errors were found on the image.\n");
	if (r->corruptions)
		printf("\n%" PRIu64 " errors were found on the image.\nData may be corrupted, or "
		       "further writes to the image may corrupt it.\n",
		       r->corruptions);
	if (r->leaks)
		printf("\n%" PRIu64 " leaked clusters were found on the image.\nThis means waste "
		       "of disk space, but no harm to data.\n",
		       r->leaks);
	if (r->check_errors)
		printf("\n%" PRIu64 " internal errors have occurred during the check.\n",
		       r->check_errors);
	if (r->total_clusters && r->allocated_clusters)
		printf("%" PRIu64 "/%" PRIu64 " = %0.2f%% allocated, %0.2f%% fragmented, %0.2f%% "
		       "compressed clusters\n",
		       r->allocated_clusters, r->total_clusters,
		       (double)r->allocated_clusters * 100.0 / (double)r->total_clusters,
		       (double)r->fragmented_clusters * 100.0 / (double)r->allocated_clusters,
		       (double)r->compressed_clusters * 100.0 / (double)r->allocated_clusters);
	if (r->image_end_offset)
		printf("Image end offset: %" PRIu64 "\n", r->image_end_offset);
}

static void check_json(const struct check_args *a, const struct qcow2_check_result *r)
{
	printf("{\n");
	if (r->image_end_offset)
		json_knum(1, "image-end-offset", (int64_t)r->image_end_offset, true);
	if (r->compressed_clusters)
		json_knum(1, "compressed-clusters", (int64_t)r->compressed_clusters, true);
	if (r->total_clusters)
		json_knum(1, "total-clusters", (int64_t)r->total_clusters, true);
	if (r->corruptions)
		json_knum(1, "corruptions", (int64_t)r->corruptions, true);
	if (r->corruptions_fixed)
		json_knum(1, "corruptions-fixed", (int64_t)r->corruptions_fixed, true);
	json_knum(1, "check-errors", (int64_t)r->check_errors, true);
	if (r->leaks)
		json_knum(1, "leaks", (int64_t)r->leaks, true);
	if (r->leaks_fixed)
		json_knum(1, "leaks-fixed", (int64_t)r->leaks_fixed, true);
	if (r->allocated_clusters)
		json_knum(1, "allocated-clusters", (int64_t)r->allocated_clusters, true);
	json_kstr(1, "filename", a->file, true);
	json_kstr(1, "format", "qcow2", r->fragmented_clusters);
	if (r->fragmented_clusters)
		json_knum(1, "fragmented-clusters", (int64_t)r->fragmented_clusters, false);
	printf("}\n");
}

/* Check, and with -r repair then check again (like qemu-img, which reports
 * the second check with the first one's repair counts). */
/* qemu-img check prints its findings on stderr as they come, with no
 * program name, -q or not. */
static void check_line(void *opaque, const char *line)
{
	(void)opaque;
	fflush(stdout);
	fprintf(stderr, "%s\n", line);
}

static int check_do(const struct check_args *a, struct blk_node *bs, struct qcow2_check_result *r)
{
	uint64_t lf, cf;
	int ret = qcow2_check_report(bs, a->repair, r, check_line, NULL);

	if (ret || !(r->leaks_fixed || r->corruptions_fixed))
		return ret;
	lf = r->leaks_fixed;
	cf = r->corruptions_fixed;
	if (a->c.out == IMG_OUT_HUMAN && !a->c.quiet)
		printf("The following inconsistencies were found and repaired:\n\n"
		       "    %" PRIu64 " leaked clusters\n    %" PRIu64 " corruptions\n\n"
		       "Double checking the fixed image now...\n",
		       lf, cf);
	ret = qcow2_check_report(bs, 0, r, check_line, NULL);
	r->leaks_fixed = lf;
	r->corruptions_fixed = cf;
	return ret;
}

static int check_run(const struct check_args *a, struct blk_node *bs)
{
	struct qcow2_check_result r;
	int ret;

	if (!qcow2_is(bs)) {
		img_err("This image format does not support checks");
		return CHECK_EXIT_UNSUPPORTED;
	}
	ret = check_do(a, bs, &r);
	if (ret) {
		img_err("Check failed: %s", strerror(-ret));
		return 1;
	}
	if (a->c.out == IMG_OUT_JSON)
		check_json(a, &r);
	else if (!a->c.quiet)
		check_human(&r);
	return r.check_errors ? 1 : r.corruptions ? 2 : r.leaks ? 3 : 0;
}

int cmd_img_check(int argc, char **argv)
{
	struct check_args a = {0};
	struct img_open_opts oo = {0};
	struct blk_node *bs = NULL;
	struct loop *loop = NULL;
	int ret = img_parse_args(&check_cmd, argc, argv, &a, &a.c);

	if (ret)
		return ret > 0 ? 0 : 1;
	a.file = a.c.files[0];
	img_open_opts_from(&oo, &a.c);
	oo.cache = a.cache;
	/* As qemu-img: the backing chain plays no part in the check, but an
	 * image whose backing file does not open is not checked. */
	oo.flags |= a.repair ? IMG_OPEN_RW | IMG_OPEN_REPAIR : 0;
	ret = img_loop_start(&loop);
	if (!ret)
		ret = img_open(a.file, &oo, &bs, NULL);
	ret = ret ? 1 : check_run(&a, bs);
	img_loop_end(loop, bs);
	return ret;
}
