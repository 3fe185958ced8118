/* bench_report: JSON and SVG writers (see header). */
#include "bench_report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- JSON ---------------------------------------------------------------- */

#define JSON_MAX_DEPTH 32

struct bench_json {
    FILE *f;
    int depth;
    char closer[JSON_MAX_DEPTH]; /* '}' or ']' per open container */
    bool first[JSON_MAX_DEPTH];  /* no member written yet at this depth */
};

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* comma, newline, indentation and "key": before a value */
static void json_member(bench_json *j, const char *key)
{
    if (j->depth > 0) {
        if (!j->first[j->depth - 1])
            fputc(',', j->f);
        j->first[j->depth - 1] = false;
        fputc('\n', j->f);
        for (int i = 0; i < j->depth; i++)
            fputs("  ", j->f);
    }
    if (key) {
        json_string(j->f, key);
        fputs(": ", j->f);
    }
}

static void json_open(bench_json *j, const char *key, char open, char close)
{
    json_member(j, key);
    fputc(open, j->f);
    if (j->depth < JSON_MAX_DEPTH) {
        j->closer[j->depth] = close;
        j->first[j->depth] = true;
        j->depth++;
    }
}

bench_json *bench_json_open(const char *path)
{
    bench_json *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->f = fopen(path, "w");
    if (!j->f) {
        free(j);
        return NULL;
    }
    return j;
}

void bench_json_obj(bench_json *j, const char *key) { json_open(j, key, '{', '}'); }
void bench_json_arr(bench_json *j, const char *key) { json_open(j, key, '[', ']'); }

void bench_json_end(bench_json *j)
{
    if (j->depth == 0)
        return;
    j->depth--;
    if (!j->first[j->depth]) {
        fputc('\n', j->f);
        for (int i = 0; i < j->depth; i++)
            fputs("  ", j->f);
    }
    fputc(j->closer[j->depth], j->f);
}

void bench_json_num(bench_json *j, const char *key, double v)
{
    json_member(j, key);
    if (isfinite(v))
        fprintf(j->f, "%.6g", v);
    else
        fputs("null", j->f);
}

void bench_json_int(bench_json *j, const char *key, int64_t v)
{
    json_member(j, key);
    fprintf(j->f, "%lld", (long long)v);
}

void bench_json_str(bench_json *j, const char *key, const char *v)
{
    json_member(j, key);
    if (v)
        json_string(j->f, v);
    else
        fputs("null", j->f);
}

void bench_json_bool(bench_json *j, const char *key, bool v)
{
    json_member(j, key);
    fputs(v ? "true" : "false", j->f);
}

int bench_json_close(bench_json *j)
{
    if (!j)
        return 0;
    while (j->depth > 0)
        bench_json_end(j);
    fputc('\n', j->f);
    int rc = fclose(j->f) == 0 ? 0 : -1;
    free(j);
    return rc;
}

/* ---- SVG ----------------------------------------------------------------- */

/* plot area inside the 640 x 400 canvas */
#define SVG_W 640.0
#define SVG_H 400.0
#define PX0 70.0
#define PX1 470.0
#define PY0 40.0
#define PY1 340.0

static const char *const svg_colors[BENCH_SVG_MAX_SERIES] = {
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
};

/* a "nice" step (1, 2 or 5 times a power of ten) for about `ticks` ticks */
static double nice_step(double range, int ticks)
{
    double raw = range / ticks;
    double p = pow(10.0, floor(log10(raw)));
    double f = raw / p;
    return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * p;
}

static void svg_text(FILE *f, double x, double y, const char *anchor, int size, const char *s)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%d\">", x, y, anchor,
            size);
    for (const char *p = s; *p; p++) {
        if (*p == '<')
            fputs("&lt;", f);
        else if (*p == '>')
            fputs("&gt;", f);
        else if (*p == '&')
            fputs("&amp;", f);
        else
            fputc(*p, f);
    }
    fputs("</text>\n", f);
}

int bench_svg_write(const char *path, const bench_chart *c)
{
    double xmin = INFINITY, xmax = -INFINITY, ymax = 0.0;
    for (int32_t s = 0; s < c->n_series; s++)
        for (int32_t i = 0; i < c->series[s].n; i++) {
            double x = c->series[s].x[i], y = c->series[s].y[i];
            if (c->log2_x)
                x = x > 0.0 ? log2(x) : 0.0;
            if (x < xmin)
                xmin = x;
            if (x > xmax)
                xmax = x;
            if (isfinite(y) && y > ymax)
                ymax = y;
        }
    if (!(xmin < xmax)) {
        xmin = isfinite(xmin) ? xmin - 1.0 : 0.0;
        xmax = xmin + 2.0;
    }
    if (!(ymax > 0.0))
        ymax = 1.0;
    double ystep = nice_step(ymax, 5);
    double ytop = ceil(ymax / ystep) * ystep;

    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\">\n", SVG_W, SVG_H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    svg_text(f, (PX0 + PX1) / 2.0, 22.0, "middle", 15, c->title ? c->title : "");
    /* axes */
    fprintf(f, "<path d=\"M%.1f %.1f V%.1f H%.1f\" stroke=\"black\" fill=\"none\"/>\n", PX0, PY0,
            PY1, PX1);
    /* y ticks and grid */
    for (double y = 0.0; y <= ytop + ystep * 0.5; y += ystep) {
        double py = PY1 - (y / ytop) * (PY1 - PY0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                PX0, py, PX1, py);
        char lab[32];
        snprintf(lab, sizeof(lab), "%g", y);
        svg_text(f, PX0 - 6.0, py + 4.0, "end", 11, lab);
    }
    /* x ticks */
    double xstep = c->log2_x ? 1.0 : nice_step(xmax - xmin, 6);
    double xstart = c->log2_x ? ceil(xmin) : ceil(xmin / xstep) * xstep;
    for (double x = xstart; x <= xmax + xstep * 1e-6; x += xstep) {
        double px = PX0 + (x - xmin) / (xmax - xmin) * (PX1 - PX0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                px, PY1, px, PY1 + 5.0);
        char lab[32];
        snprintf(lab, sizeof(lab), "%g", c->log2_x ? exp2(x) : x);
        svg_text(f, px, PY1 + 18.0, "middle", 11, lab);
    }
    svg_text(f, (PX0 + PX1) / 2.0, SVG_H - 22.0, "middle", 12, c->x_label ? c->x_label : "");
    fprintf(f, "<g transform=\"translate(18 %.1f) rotate(-90)\">\n", (PY0 + PY1) / 2.0);
    svg_text(f, 0.0, 0.0, "middle", 12, c->y_label ? c->y_label : "");
    fputs("</g>\n", f);
    /* series + legend */
    for (int32_t s = 0; s < c->n_series; s++) {
        const bench_series *se = &c->series[s];
        const char *col = svg_colors[s % BENCH_SVG_MAX_SERIES];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int32_t i = 0; i < se->n; i++) {
            double x = c->log2_x ? (se->x[i] > 0.0 ? log2(se->x[i]) : 0.0) : se->x[i];
            double y = isfinite(se->y[i]) ? se->y[i] : 0.0;
            fprintf(f, "%.1f,%.1f ", PX0 + (x - xmin) / (xmax - xmin) * (PX1 - PX0),
                    PY1 - y / ytop * (PY1 - PY0));
        }
        fputs("\"/>\n", f);
        for (int32_t i = 0; i < se->n; i++) {
            double x = c->log2_x ? (se->x[i] > 0.0 ? log2(se->x[i]) : 0.0) : se->x[i];
            double y = isfinite(se->y[i]) ? se->y[i] : 0.0;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    PX0 + (x - xmin) / (xmax - xmin) * (PX1 - PX0), PY1 - y / ytop * (PY1 - PY0),
                    col);
        }
        double ly = PY0 + 10.0 + 20.0 * s;
        fprintf(f, "<line x1=\"485\" y1=\"%.1f\" x2=\"505\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2\"/>\n", ly, ly, col);
        svg_text(f, 510.0, ly + 4.0, "start", 11, se->name ? se->name : "");
    }
    fputs("</svg>\n", f);
    return fclose(f) == 0 ? 0 : -1;
}
