/* bench_report: how the bench's figures leave the program — a streaming
 * JSON writer (build/bench/results.json) and a tiny SVG line chart writer
 * (build/bench/<name>.svg). The human table goes to stdout with printf in the
 * sections themselves.
 */
#ifndef PG_BENCH_REPORT_H
#define PG_BENCH_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* ---- JSON ----------------------------------------------------------------
 * Writes indented JSON to a FILE and keeps track of commas. `key` is the
 * member name inside an object and must be NULL inside an array. Non-finite
 * numbers are written as null. */
typedef struct bench_json bench_json;

bench_json *bench_json_open(const char *path); /* NULL if the file cannot be created */
/* Closes every open container, the file, and frees j; 0 on success. */
int bench_json_close(bench_json *j);

void bench_json_obj(bench_json *j, const char *key);   /* opens { */
void bench_json_arr(bench_json *j, const char *key);   /* opens [ */
void bench_json_end(bench_json *j);                    /* closes the innermost */
void bench_json_num(bench_json *j, const char *key, double v);
void bench_json_int(bench_json *j, const char *key, int64_t v);
void bench_json_str(bench_json *j, const char *key, const char *v); /* NULL -> null */
void bench_json_bool(bench_json *j, const char *key, bool v);

/* ---- SVG line chart ------------------------------------------------------ */
#define BENCH_SVG_MAX_SERIES 8

typedef struct bench_series {
    const char *name;
    int32_t n;
    const double *x, *y; /* [n] */
} bench_series;

typedef struct bench_chart {
    const char *title, *x_label, *y_label;
    bool log2_x;          /* x axis in powers of two (max_num_seqs sweeps) */
    int32_t n_series;
    bench_series series[BENCH_SVG_MAX_SERIES];
} bench_chart;

/* Writes the chart as a standalone SVG (640 x 400); 0 on success. */
int bench_svg_write(const char *path, const bench_chart *c);

#endif /* PG_BENCH_REPORT_H */
