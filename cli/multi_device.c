/* multi_device: `--device cuda:0,1,...` / `cuda:all` — every GPU of a node
 * in one run (cli/README.md "Several GPUs in one run").
 *
 * One worker process per device, forked before anything touches CUDA: a
 * CUDA context must never exist in a process that forks, so this process
 * never loads the CUDA module; the device count (cuda:all, and the check
 * of the listed ordinals) comes from a short-lived child that loads it.
 * Worker k is the ordinary run (cli_run_generate) as shard k of N on device
 * devices[k] (request i -> worker i mod N, run.c take_line), writing its
 * records to a pipe in input order; this process joins the pipes with the
 * walk `pagedgen merge` uses (merge_walk.h) and writes request i's record
 * from worker i mod N. The output is byte-identical to one device's.
 *
 * Worker stderr goes through a pipe per worker, relayed by one thread each
 * (started after every fork) with the device in front of every line:
 * "pagedgen: cuda:1: ...". A worker that dies: its later requests have no
 * record, every other record is still written in input order, the device
 * is named and the exit code is the worker's (or 3 when it was killed).
 * With -o FILE the result is a normal run's partial output: --resume
 * (with the same device list, or one device) answers what is missing. */
#define _GNU_SOURCE /* F_SETPIPE_SZ (Linux) */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_loader.h"
#include "input.h"
#include "merge_walk.h"
#include "output.h"
#include "progress.h"
#include "request_parse.h"
#include "resume.h"
#include "run.h"

typedef struct md_worker {
    int device;
    pid_t pid;
    int out_r, err_r;     /* read ends of its stdout and stderr pipes; -1 closed */
    char name[24];        /* "cuda:K" */
    pthread_t relay;
    bool relay_started;
    int status;           /* waitpid's */
} md_worker;

/* ---- the device count, from a child ----------------------------------------- */

/* The CUDA module's device count, asked in a child process that exits
 * after answering, so that no CUDA state exists here. PG_OK with *n, or
 * the module's error in err. */
static int query_device_count(int *n, pg_error *err)
{
    int p[2];
    if (pipe(p) != 0)
        return pg_error_set(err, PG_EIO, "pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return pg_error_set(err, PG_EIO, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(p[0]);
        const cuda_module *m = NULL;
        pg_error e;
        char buf[sizeof e.msg + 16];
        int len = cli_cuda_load(&m, &e) == PG_OK ? snprintf(buf, sizeof buf, "N%d", m->device_count())
                                                  : snprintf(buf, sizeof buf, "E%s", e.msg);
        ssize_t w = write(p[1], buf, (size_t)len);
        _exit(w == len ? 0 : 1);
    }
    close(p[1]);
    char buf[sizeof err->msg + 16];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(p[0], buf + got, sizeof buf - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(p[0]);
    buf[got] = '\0';
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (got > 1 && buf[0] == 'N') {
        *n = atoi(buf + 1);
        return PG_OK;
    }
    if (got > 1 && buf[0] == 'E')
        return pg_error_set(err, PG_EUNSUPPORTED, "%s", buf + 1);
    return pg_error_set(err, PG_EDEVICE, "--device cuda: the process that counts the CUDA devices died (%s %d)",
                        WIFSIGNALED(st) ? "signal" : "status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* ---- stderr relay --------------------------------------------------------------- */

/* Writes one line with the device in front: "pagedgen: X" becomes
 * "pagedgen: cuda:K: X", any other line "[cuda:K] line". */
static void relay_line(const md_worker *w, const char *line, size_t len)
{
    char buf[4096];
    static const char tag[] = "pagedgen: ";
    size_t pre;
    if (len >= sizeof tag - 1 && memcmp(line, tag, sizeof tag - 1) == 0) {
        pre = (size_t)snprintf(buf, sizeof buf, "pagedgen: %s: ", w->name);
        line += sizeof tag - 1;
        len -= sizeof tag - 1;
    } else {
        pre = (size_t)snprintf(buf, sizeof buf, "[%s] ", w->name);
    }
    pg_error ignored;
    if (pre + len <= sizeof buf) {
        memcpy(buf + pre, line, len);
        (void)cli_write_all(STDERR_FILENO, buf, pre + len, &ignored); /* one write: lines stay whole */
    } else {
        (void)cli_write_all(STDERR_FILENO, buf, pre, &ignored);
        (void)cli_write_all(STDERR_FILENO, line, len, &ignored);
    }
}

static void *relay_main(void *arg)
{
    md_worker *w = arg;
    char buf[8192];
    size_t have = 0;
    for (;;) {
        ssize_t r = read(w->err_r, buf + have, sizeof buf - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        have += (size_t)r;
        size_t start = 0;
        for (size_t i = 0; i < have; i++) {
            if (buf[i] == '\n' || buf[i] == '\r') {
                if (i > start || buf[i] == '\n')
                    relay_line(w, buf + start, i + 1 - start);
                start = i + 1;
            }
        }
        if (start == 0 && have == sizeof buf) { /* a line longer than the buffer: pass it on in pieces */
            relay_line(w, buf, have);
            have = 0;
        } else {
            memmove(buf, buf + start, have - start);
            have -= start;
        }
    }
    if (have > 0) {
        buf[have < sizeof buf ? have : sizeof buf - 1] = '\n';
        relay_line(w, buf, have < sizeof buf ? have + 1 : have);
    }
    return NULL;
}

/* ---- signals -------------------------------------------------------------------- */

/* The workers' pids for the forwarding handler: like signals.c's flag,
 * process-wide because a signal handler has nowhere else to look. */
static pid_t fwd_pids[CLI_MAX_DEVICES];
static volatile sig_atomic_t fwd_n, fwd_stopped;

static void forward_signal(int sig)
{
    fwd_stopped = 1;
    for (sig_atomic_t k = 0; k < fwd_n; k++)
        kill(fwd_pids[k], sig); /* async-signal-safe */
}

/* SIGINT/SIGTERM to this process go on to every worker (each stops
 * admitting, writes what finished and exits 130: run.c), and the reads of
 * their pipes restart (SA_RESTART) so that this process writes all of it. */
static void forward_signals(void)
{
    fwd_n = 0; /* start_workers adds each worker as it is forked */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- workers ---------------------------------------------------------------------- */

/* The worker's side of the fork: the ordinary run, shard k of n on its
 * device, records to out_w, log lines to err_w. Never returns. */
static void worker_main(const cli_options *o, const cli_resume *kept, int k, int n, int device, int out_w,
                        int err_w)
{
    if (dup2(out_w, STDOUT_FILENO) < 0 || dup2(err_w, STDERR_FILENO) < 0)
        _exit(CLI_EXIT_IO);
    close(out_w);
    close(err_w);
    cli_options w = *o;
    w.device = "cuda";
    w.cuda_device = device;
    w.n_devices = 0;
    w.devices_all = false;
    w.shard_k = k;
    w.shard_n = n;
    w.shard_given = false;
    w.output_path = "-";
    w.resume = false;
    w.resume_kept = kept;
    w.unordered = false; /* the parent's walk needs each worker's records in input order */
    int code = cli_run_generate(&w);
    fflush(NULL);
    _exit(code);
}

/* Forks the workers; on failure the ones started are killed. */
static int start_workers(const cli_options *o, const cli_resume *kept, md_worker *ws, int n, pg_error *err)
{
    for (int k = 0; k < n; k++) {
        int po[2], pe[2];
        if (pipe(po) != 0)
            return pg_error_set(err, PG_EIO, "pipe: %s", strerror(errno));
        if (pipe(pe) != 0) {
            close(po[0]);
            close(po[1]);
            return pg_error_set(err, PG_EIO, "pipe: %s", strerror(errno));
        }
#ifdef F_SETPIPE_SZ
        (void)fcntl(po[0], F_SETPIPE_SZ, 1 << 20); /* room for a worker to run ahead; best effort */
#endif
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            close(po[0]);
            close(po[1]);
            close(pe[0]);
            close(pe[1]);
            return pg_error_set(err, PG_EIO, "fork: %s", strerror(errno));
        }
        if (pid == 0) {
            fwd_n = 0; /* run.c installs the worker's own handlers */
            /* the earlier workers' read ends: not this worker's */
            for (int j = 0; j < k; j++) {
                close(ws[j].out_r);
                close(ws[j].err_r);
            }
            close(po[0]);
            close(pe[0]);
            worker_main(o, kept, k, n, ws[k].device, po[1], pe[1]);
        }
        close(po[1]);
        close(pe[1]);
        ws[k].pid = pid;
        fwd_pids[k] = pid;
        fwd_n = (sig_atomic_t)(k + 1);
        ws[k].out_r = po[0];
        ws[k].err_r = pe[0];
    }
    return PG_OK;
}

/* The input's format: the flag, or detected from the first line as run.c does. */
static int input_format(const cli_options *o, cli_format *fmt, pg_error *err)
{
    *fmt = o->input_format;
    if (*fmt != CLI_FORMAT_AUTO)
        return PG_OK;
    cli_input *in;
    if (cli_input_open(&in, o->input_path, err) != PG_OK)
        return PG_EIO;
    const char *line;
    size_t len;
    int rc = cli_input_peek(in, &line, &len, err);
    *fmt = rc == CLI_INPUT_LINE ? cli_detect_format(line, len) : CLI_FORMAT_JSONL;
    cli_input_close(in);
    return rc < 0 ? PG_EIO : PG_OK;
}

/* The device list: o's, or 0 .. count-1 for cuda:all; listed ordinals are
 * checked against the count. Returns an exit code. */
static int resolve_devices(const cli_options *o, int *devs, int *n)
{
    pg_error err;
    int count = 0;
    if (query_device_count(&count, &err) != PG_OK) {
        fprintf(stderr, "pagedgen: --device %s: %s\n", o->device_arg, err.msg);
        return CLI_EXIT_MODEL;
    }
    if (count <= 0) {
        fprintf(stderr, "pagedgen: --device %s: no CUDA device found\n", o->device_arg);
        return CLI_EXIT_MODEL;
    }
    if (o->devices_all) {
        *n = count < CLI_MAX_DEVICES ? count : CLI_MAX_DEVICES;
        for (int k = 0; k < *n; k++)
            devs[k] = k;
        return CLI_EXIT_OK;
    }
    *n = o->n_devices;
    for (int k = 0; k < *n; k++) {
        devs[k] = o->devices[k];
        if (devs[k] >= count) {
            fprintf(stderr, "pagedgen: --device %s: device %d: expected 0 .. %d (%d device%s found)\n",
                    o->device_arg, devs[k], count - 1, count, count == 1 ? "" : "s");
            return CLI_EXIT_USAGE;
        }
    }
    return CLI_EXIT_OK;
}

int cli_run_multi_device(const cli_options *o)
{
    int devs[CLI_MAX_DEVICES], n = 0;
    int code = resolve_devices(o, devs, &n);
    if (code != CLI_EXIT_OK)
        return code;
    if (n == 1) { /* cuda:all on a one-device machine: the usual run */
        cli_options one = *o;
        one.n_devices = 0;
        one.devices_all = false;
        one.cuda_device = devs[0];
        return cli_run_generate(&one);
    }
    signal(SIGPIPE, SIG_IGN); /* a closed stdout is a write error */
    const double t0 = cli_now_s();
    merge_state ms;
    memset(&ms, 0, sizeof ms);
    ms.o = o;
    ms.label = o->device_arg;
    ms.unit = "device worker";
    ms.cut_partial = true;
    ms.hush = &fwd_stopped; /* after Ctrl-C the missing requests are counted, not listed */
    cli_format fmt;
    cli_resume *kept = NULL;
    md_worker ws[CLI_MAX_DEVICES];
    memset(ws, 0, sizeof ws);
    int out_fd = -1;
    bool to_file = strcmp(o->output_path, "-") != 0;
    if (input_format(o, &fmt, &ms.err) != PG_OK) {
        fprintf(stderr, "pagedgen: %s\n", ms.err.msg);
        return CLI_EXIT_IO;
    }
    if (to_file && o->resume) {
        if (cli_resume_load(&kept, o->output_path, &ms.err) != PG_OK) {
            fprintf(stderr, "pagedgen: %s\n", ms.err.msg);
            return CLI_EXIT_IO;
        }
        if (!o->quiet)
            fprintf(stderr, "pagedgen: --resume: %lld records kept in %s%s\n", (long long)cli_resume_records(kept),
                    o->output_path, cli_resume_cut_bytes(kept) ? " (a partial last line was cut off)" : "");
    }
    if (to_file) {
        out_fd = open(o->output_path, O_WRONLY | O_CREAT | (o->resume ? O_APPEND : O_TRUNC), 0644);
        if (out_fd < 0) {
            fprintf(stderr, "pagedgen: %s: cannot open output: %s\n", o->output_path, strerror(errno));
            cli_resume_destroy(kept);
            return CLI_EXIT_IO;
        }
    } else {
        out_fd = STDOUT_FILENO;
    }
    for (int k = 0; k < n; k++) {
        ws[k].device = devs[k];
        ws[k].out_r = ws[k].err_r = -1;
        snprintf(ws[k].name, sizeof ws[k].name, "cuda:%d", devs[k]);
    }
    if (!o->quiet)
        fprintf(stderr, "pagedgen: --device %s: %d workers, request i on device worker i mod %d\n", o->device_arg,
                n, n);
    ms.kept = kept;
    ms.n = n;
    merge_shard sh[CLI_MAX_DEVICES];
    memset(sh, 0, sizeof sh);
    ms.sh = sh;
    forward_signals();
    int rc = start_workers(o, kept, ws, n, &ms.err);
    int started = 0;
    while (started < n && ws[started].pid > 0)
        started++;
    for (int k = 0; k < started; k++)
        ws[k].relay_started = pthread_create(&ws[k].relay, NULL, relay_main, &ws[k]) == 0;
    int64_t requests = 0;
    if (rc == PG_OK) {
        for (int k = 0; k < n && rc == PG_OK; k++) {
            sh[k].path = ws[k].name;
            if (!(sh[k].f = fdopen(ws[k].out_r, "rb")))
                rc = pg_error_set(&ms.err, PG_ENOMEM, "fdopen: %s", strerror(errno));
            else
                ws[k].out_r = -1; /* the FILE owns it */
        }
        for (int k = 0; k < n && rc == PG_OK; k++)
            rc = cli_merge_advance(&ms, &sh[k]);
        if (rc == PG_OK)
            rc = cli_merge_walk(&ms, fmt, out_fd, &requests);
    }
    if (rc != PG_OK) {
        fprintf(stderr, "pagedgen: --device %s: %s\n", o->device_arg, ms.err.msg);
        for (int k = 0; k < started; k++)
            kill(ws[k].pid, SIGTERM);
    }
    for (int k = 0; k < n; k++) {
        if (sh[k].f)
            fclose(sh[k].f);
        else if (ws[k].out_r >= 0)
            close(ws[k].out_r);
        free(sh[k].line);
        free(sh[k].key);
    }
    /* every worker's end, then its last log lines */
    int worst = CLI_EXIT_OK;
    bool interrupted = false, lines_failed = false;
    for (int k = 0; k < started; k++) {
        while (waitpid(ws[k].pid, &ws[k].status, 0) < 0 && errno == EINTR)
            ;
        if (ws[k].relay_started)
            pthread_join(ws[k].relay, NULL);
        close(ws[k].err_r);
        int st = ws[k].status;
        if (WIFEXITED(st) && WEXITSTATUS(st) == CLI_EXIT_OK)
            continue;
        if (WIFEXITED(st) && WEXITSTATUS(st) == CLI_EXIT_LINES_FAILED) {
            lines_failed = true;
            continue;
        }
        if (WIFEXITED(st) && WEXITSTATUS(st) == CLI_EXIT_INTERRUPTED) {
            interrupted = true;
            continue;
        }
        int c = WIFEXITED(st) ? WEXITSTATUS(st) : CLI_EXIT_MODEL;
        if (WIFSIGNALED(st))
            fprintf(stderr, "pagedgen: --device %s: the worker of device %s (worker %d of %d, pid %ld) was killed "
                            "by signal %d\n", o->device_arg, ws[k].name, k, n, (long)ws[k].pid, WTERMSIG(st));
        else
            fprintf(stderr, "pagedgen: --device %s: the worker of device %s (worker %d of %d, pid %ld) failed "
                            "(exit %d)\n", o->device_arg, ws[k].name, k, n, (long)ws[k].pid, c);
        if (worst == CLI_EXIT_OK)
            worst = c;
    }
    if (rc == PG_OK && to_file && fsync(out_fd) != 0 && errno != EINVAL) {
        fprintf(stderr, "pagedgen: %s: write error: %s\n", o->output_path, strerror(errno));
        rc = PG_EIO;
    }
    if (to_file && close(out_fd) != 0 && rc == PG_OK) {
        fprintf(stderr, "pagedgen: %s: write error: %s\n", o->output_path, strerror(errno));
        rc = PG_EIO;
    }
    if (ms.listed > MERGE_LIST_MAX)
        fprintf(stderr, "pagedgen: %s: ... and %lld more\n", o->device_arg, (long long)(ms.listed - MERGE_LIST_MAX));
    if (!o->quiet || ms.missing > 0)
        fprintf(stderr, "pagedgen: %s: total: %lld requests on %d devices: %lld records written (%lld error "
                        "records), %lld already answered (--resume), %lld missing in %.2f s\n", o->device_arg,
                (long long)requests, n, (long long)ms.written, (long long)ms.written_errors, (long long)ms.skipped,
                (long long)ms.missing, cli_now_s() - t0);
    if (ms.missing > 0)
        fprintf(stderr, "pagedgen: %s: %lld requests have no record%s%s\n", o->device_arg, (long long)ms.missing,
                to_file ? ": rerun with --resume (this device list or one device) to answer them in " : "",
                to_file ? o->output_path : "");
    cli_resume_destroy(kept);
    if (worst != CLI_EXIT_OK)
        return worst;
    if (rc != PG_OK)
        return rc == PG_EIO || rc == PG_ENOMEM ? CLI_EXIT_IO : CLI_EXIT_MODEL;
    if (interrupted)
        return CLI_EXIT_INTERRUPTED;
    if (ms.missing > 0 || ms.duplicate > 0 || ms.extra > 0)
        return CLI_EXIT_MODEL; /* a worker answered out of turn: not expected of a healthy one */
    return lines_failed || ms.written_errors > 0 || ms.skipped_errors > 0 ? CLI_EXIT_LINES_FAILED : CLI_EXIT_OK;
}
