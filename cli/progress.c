/* progress: status line, log lines, end summary (see progress.h). */
#include "progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "output.h"

#define TTY_PERIOD_S 0.25

struct cli_progress {
    int fd;
    bool tty, quiet;
    double period_s;
    double start_s, last_s;
    bool drawn;           /* a status line is on screen */
};

double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_progress_create(cli_progress **out, int fd, bool tty, bool quiet, double log_interval_s)
{
    cli_progress *p = calloc(1, sizeof *p);
    if (!p)
        return -2;
    p->fd = fd;
    p->tty = tty;
    p->quiet = quiet;
    p->period_s = tty ? TTY_PERIOD_S : log_interval_s;
    p->start_s = cli_now_s();
    p->last_s = p->start_s;
    *out = p;
    return 0;
}

void cli_progress_destroy(cli_progress *p) { free(p); }

static void say(cli_progress *p, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void say(cli_progress *p, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf)
        n = (int)sizeof buf - 1;
    cli_write_all(p->fd, buf, (size_t)n, NULL);
}

static void fmt_eta(char *buf, size_t cap, double s)
{
    if (s < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%lds", t);
}

void cli_progress_update(cli_progress *p, const cli_progress_counts *c, const engine_stats *s,
                         bool force)
{
    if (p->quiet)
        return;
    double now = cli_now_s();
    if (!force && now - p->last_s < p->period_s)
        return;
    p->last_s = now;
    double el = now - p->start_s;
    if (el <= 0)
        el = 1e-9;
    int64_t done = c->ok + c->failed + c->skipped;
    double rps = (double)(c->ok + c->failed) / el;
    char total[32], eta[32];
    if (c->total >= 0) {
        snprintf(total, sizeof total, "%lld", (long long)c->total);
        fmt_eta(eta, sizeof eta, rps > 0 ? (double)(c->total - done) / rps : -1.0);
    } else {
        snprintf(total, sizeof total, "?");
        snprintf(eta, sizeof eta, "?");
    }
    double kv = s->num_blocks > 0 ? 100.0 * s->blocks_in_use / s->num_blocks : 0.0;
    const char *lead = p->tty ? "\r\033[K" : "";
    say(p, "%spagedgen: %lld/%s requests (%lld failed) | prompt %.0f tok/s, gen %.0f tok/s | "
        "running %d, waiting %d | kv %.1f%% | preemptions %llu | eta %s%s",
        lead, (long long)done, total, (long long)c->failed, (double)s->prompt_tokens / el,
        (double)s->generated_tokens / el, (int)s->running, (int)s->waiting, kv,
        (unsigned long long)s->preemptions, eta, p->tty ? "" : "\n");
    p->drawn = p->tty;
}

/* Seconds since this process started (Linux: /proc/self/stat's starttime,
 * in clock ticks since boot, against CLOCK_BOOTTIME), or -1 when unknown:
 * the wall time the process's CPU time (getrusage, loading included) is
 * spent in. */
static double process_wall_s(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return -1.0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *q = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!q)
        return -1.0;
    /* fields after the name start at 3 (state); starttime is field 22 */
    int field = 2;
    for (q++; *q && field < 22; q++)
        if (*q == ' ')
            field++;
    char *end = NULL;
    unsigned long long ticks = strtoull(q, &end, 10);
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec now;
    if (end == q || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) != 0)
        return -1.0;
    double wall = (double)now.tv_sec + (double)now.tv_nsec * 1e-9 - (double)ticks / (double)hz;
    return wall > 0.0 ? wall : -1.0;
}

void cli_progress_summary(cli_progress *p, const cli_progress_counts *c, const engine_stats *s,
                          bool interrupted)
{
    if (p->quiet)
        return;
    if (p->drawn)
        say(p, "\r\033[K");
    double el = cli_now_s() - p->start_s;
    if (el <= 0)
        el = 1e-9;
    say(p, "pagedgen: %s: %lld requests ok, %lld failed, %lld already answered (--resume) in %.2f s\n",
        interrupted ? "interrupted" : "done", (long long)c->ok, (long long)c->failed,
        (long long)c->skipped, el);
    if (c->lax_lines > 0)
        say(p, "pagedgen: warning: %lld lines had unknown fields (ignored) or loosely typed values "
            "(coerced), as vLLM accepts them; --strict makes them errors\n", (long long)c->lax_lines);
    say(p, "pagedgen: tokens: %llu prompt (computed), %llu generated | %.1f prompt tok/s, %.1f gen tok/s, "
        "%.2f req/s\n",
        (unsigned long long)s->prompt_tokens, (unsigned long long)s->generated_tokens,
        (double)s->prompt_tokens / el, (double)s->generated_tokens / el,
        (double)(c->ok + c->failed) / el);
    /* the process's CPU time (loading included): a large system share is
     * the kernel's work for us (first touch of fresh pages: zeroing the
     * weights' and the KV cache's memory; huge-page compaction), which a
     * user should see beside the throughput */
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        const double user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6;
        const double sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
        const double wall = process_wall_s();
        char busy[96] = "";
        if (wall > 0.0)
            snprintf(busy, sizeof busy, " in %.2f s since the process started, %.2f cores busy on average",
                     wall, (user + sys) / wall);
        /* the page faults and the peak resident set say how much fresh
         * memory the system time went to (a huge-page fault maps 2 MiB) */
        say(p, "pagedgen: cpu time: %.2f s user, %.2f s system (sys %.1f%%; %ld page faults, peak "
            "resident %.0f MiB)%s\n", user, sys, user + sys > 0 ? 100.0 * sys / (user + sys) : 0.0,
            ru.ru_minflt + ru.ru_majflt, (double)ru.ru_maxrss / 1024.0, busy);
    }
    double peak = s->num_blocks > 0 ? 100.0 * s->blocks_in_use_peak / s->num_blocks : 0.0;
    say(p, "pagedgen: kv cache: %d blocks, peak %d in use (%.1f%%), utilization %.1f%% (mean filled "
        "slots of allocated blocks) | peak running %d | preemptions %llu | cow copies %llu\n",
        (int)s->num_blocks, (int)s->blocks_in_use_peak, peak, 100.0 * s->kv_utilization_mean,
        (int)s->peak_running_seqs, (unsigned long long)s->preemptions,
        (unsigned long long)s->cow_copies);
    double hit = s->prefix_cache_queries ? 100.0 * (double)s->prefix_cache_hits / (double)s->prefix_cache_queries
                                         : 0.0;
    say(p, "pagedgen: prefix cache: %.1f%% hit rate (%llu of %llu full prompt blocks)\n", hit,
        (unsigned long long)s->prefix_cache_hits, (unsigned long long)s->prefix_cache_queries);
}
