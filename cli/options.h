/* options: the command line of pagedgen (getopt_long), its help text and
 * the size/number parsers behind it. Pure: parsing never prints, never
 * exits; main.c turns a PG_EINVAL into exit code 2. Every string in
 * cli_options is borrowed from argv. */
#ifndef PG_CLI_OPTIONS_H
#define PG_CLI_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "pg_error.h"
#include "reasoning.h"
#include "sampling_params.h"

#define CLI_MAX_STOP 64            /* --stop may be given this many times */
#define CLI_MAX_LORAS 64           /* --lora may be given this many times */
#define CLI_DEFAULT_MAX_TOKENS 256 /* documented in --help and README */

typedef enum cli_command {
    CLI_CMD_GENERATE = 0,
    CLI_CMD_TOKENIZE,
    CLI_CMD_CHAT_TEMPLATE, /* `pagedgen chat-template`: render chat lines, no model */
    CLI_CMD_PERPLEXITY,    /* `pagedgen perplexity`: llama-perplexity over a text file */
    CLI_CMD_MERGE,         /* `pagedgen merge`: shard outputs -> one file in input order */
    CLI_CMD_HELP,      /* --help: print help for `help_for` */
    CLI_CMD_VERSION,
} cli_command;

/* --pooling: how embedding lines pool the final hidden states (core/pooling.h). */
typedef enum cli_pooling {
    CLI_POOLING_AUTO = 0,   /* modules.json + 1_Pooling/config.json, else LAST */
    CLI_POOLING_LAST,
    CLI_POOLING_MEAN,
    CLI_POOLING_CLS,
} cli_pooling;

/* --kv-cache-dtype: the element type of the KV cache. AUTO follows the
 * compute dtype on cuda (bf16 with --dtype bfloat16, f32 with --dtype
 * float32) and the weight storage on the cpu (f32 for f32 weights, bf16 for
 * bf16 and int8 weights). */
typedef enum cli_kv_dtype {
    CLI_KV_DTYPE_AUTO = 0,
    CLI_KV_DTYPE_BF16,
    CLI_KV_DTYPE_FP16,
    CLI_KV_DTYPE_F32,
} cli_kv_dtype;

/* --dtype: on cuda the compute precision of activations and weights (AUTO
 * = bfloat16); on the cpu the storage of the weights, which it always
 * computes with in float32 (AUTO = bfloat16 for a bf16 checkpoint, float32
 * for f32 and f16 ones: f16 -> bf16 would round away 3 mantissa bits). */
typedef enum cli_dtype {
    CLI_DTYPE_AUTO = 0,
    CLI_DTYPE_BF16,
    CLI_DTYPE_F32,
} cli_dtype;

/* --quantization: int8 weights (cpu only): symmetric, one f32 scale per
 * block of 32 weights, quantized while loading. */
typedef enum cli_quant {
    CLI_QUANT_NONE = 0,
    CLI_QUANT_INT8,
} cli_quant;

/* --matmul-precision (cpu only; after PyTorch's set_float32_matmul_precision):
 * the arithmetic of every matrix product (cpu/cpu_gemm_modes.h). EXACT is
 * f32 in the canonical order; BF16 rounds activations to bf16 and sums
 * bf16 pairs as VDPBF16PS does, on bf16 weights; INT8 quantizes
 * activations per block of 32 and sums int8 products in int32 (W8A8), on
 * int8 weights. Each keeps its own canonical order. */
typedef enum cli_matmul_precision {
    CLI_MATMUL_EXACT = 0,
    CLI_MATMUL_BF16,
    CLI_MATMUL_INT8,
} cli_matmul_precision;

typedef enum cli_format {
    CLI_FORMAT_AUTO = 0, /* decided from the first non-blank line */
    CLI_FORMAT_TEXT,     /* one prompt per line */
    CLI_FORMAT_JSONL,    /* one request object per line */
    CLI_FORMAT_OPENAI,   /* OpenAI batch lines (vllm run-batch) */
} cli_format;

/* Which sampling flags were given on the command line (bit per field). */
enum cli_sampling_flag {
    CLI_SET_MAX_TOKENS = 1u << 0, CLI_SET_TEMPERATURE = 1u << 1, CLI_SET_TOP_P = 1u << 2,
    CLI_SET_TOP_K = 1u << 3, CLI_SET_MIN_P = 1u << 4, CLI_SET_N = 1u << 5,
    CLI_SET_MIN_TOKENS = 1u << 6, CLI_SET_PRESENCE = 1u << 7, CLI_SET_FREQUENCY = 1u << 8,
    CLI_SET_REPETITION = 1u << 9, CLI_SET_LOGPROBS = 1u << 10, CLI_SET_IGNORE_EOS = 1u << 11,
};

typedef struct cli_options {
    cli_command cmd;
    cli_command help_for;          /* with CLI_CMD_HELP: GENERATE, TOKENIZE, CHAT_TEMPLATE, or
                                      HELP (overview) */

    /* files */
    const char *model_dir;         /* -m; required by generate */
    const char *tokenizer_dir;     /* --tokenizer; default: the model folder */
    const char *input_path;        /* -i; "-" = stdin (default) */
    const char *output_path;       /* -o; "-" = stdout (default) */
    cli_format input_format;

    /* engine */
    const char *device;            /* "auto" | "cpu" | "cuda" */
    int32_t threads;               /* 0 = one per online core */
    int32_t block_size;            /* 16 */
    uint64_t kv_cache_bytes;       /* 0 = automatic (see device.h) */
    int32_t num_kv_blocks;         /* 0 = from kv_cache_bytes */
    int32_t max_num_seqs;          /* 256 */
    int32_t max_num_batched_tokens;/* 2048 */
    int32_t max_model_len;         /* 0 = config max_position_embeddings */
    bool prefix_caching;           /* true */
    bool free_window_blocks;       /* true: free KV blocks behind a sliding window */
    uint64_t seed;                 /* 0 */
    kv_layout layout;              /* paged */
    bool check_invariants;         /* hidden: engine pool checks after every step */
    cli_pooling pooling;           /* --pooling; AUTO: the model folder's (run.c) */
    bool prompt_logprobs_per_step; /* engine_params prompt_logprobs_per_step (tests) */
    /* perplexity */
    const char *ppl_file;          /* -f TEXT (required) */
    int32_t ppl_ctx;               /* --ctx N: window length; 512 */

    /* cuda (accepted everywhere; checked against the device in device.c) */
    double gpu_memory_utilization; /* (0, 1]; 0.9 */
    cli_kv_dtype kv_cache_dtype;   /* auto */
    cli_dtype dtype;               /* auto */
    cli_quant quantization;        /* none (cpu: int8) */
    cli_matmul_precision matmul_precision; /* exact (cpu only) */
    int32_t cuda_device;           /* 0 */
    /* --device cuda:LIST / cuda:all (multi_device.c): one worker process
     * per device; n_devices 0 = one device, the usual run */
#define CLI_MAX_DEVICES 64
    int32_t n_devices;             /* entries of devices; 0 with devices_all */
    int32_t devices[CLI_MAX_DEVICES];
    bool devices_all;              /* cuda:all: every device the module reports */
    const char *device_arg;        /* the --device value as given, for messages */
    /* a multi_device worker: the parent's --resume scan of -o (borrowed,
     * inherited through fork); its requests are skipped, records go to -o */
    const struct cli_resume *resume_kept;
    bool fast_gemm;                /* false: batch-invariant GEMMs */
    bool enforce_eager;            /* false: CUDA graphs for decode steps */

    /* default sampling (applies to lines that do not set their own) */
    unsigned sampling_set;         /* cli_sampling_flag bits */
    sampling_params sampling;      /* values of the flags in sampling_set */
    const char *stop[CLI_MAX_STOP];
    int32_t n_stop;
    /* --generation-config auto (true, the default): generation_config.json's
     * sampling keys are the defaults under the flags; vllm (false): they are
     * not read for sampling (vLLM's get_diff_sampling_param returns {}), its
     * eos ids still are */
    bool generation_config_defaults;

    /* output and run control */
    bool include_prompt, unordered, resume, metrics, quiet;
    bool profile_ops;              /* --profile-ops: per-op times on stderr (cpu) */
    bool profile_steps;            /* --profile-steps: step phases, device op times and
                                      launches per decode step on stderr (core/step_profile.h) */
    double log_interval_s;         /* non-TTY progress line period; 10 */
    int32_t shard_k, shard_n;      /* 0/1 = everything */
    bool shard_given;              /* --shard given (K/N or auto): the output gets a marker */
    bool shard_auto;               /* --shard auto[/N]: K, N from the scheduler (shard.h) */
    int32_t shard_auto_n;          /* N of auto/N; 0 = the scheduler's count */
    /* the flags that shape the output bytes, "--flag=value\n" each in
     * command-line order (-m as its folder's name); what a shard's marker
     * records so that merge refuses shards run differently. Everything but
     * the flags documented not to change a record (files, --shard,
     * --resume, -q, threads, pool and batch sizes, progress) */
    char shaping[4096];
    const char *served_model_name; /* --served-model-name; NULL = the -m folder's name */
    /* --lora NAME=DIR (repeatable; issue 33): a line's "model" NAME runs
     * under the PEFT adapter in DIR (cli/README.md "LoRA adapters") */
    const char *lora_name[CLI_MAX_LORAS]; /* NAME: the argument, lora_name_len bytes */
    int32_t lora_name_len[CLI_MAX_LORAS];
    const char *lora_dir[CLI_MAX_LORAS];  /* DIR: the argument after '=' */
    int32_t n_loras;
    int32_t max_loras;             /* --max-loras: adapters in one step; 1 (vLLM's) */
    int32_t max_lora_rank;         /* --max-lora-rank: larger adapters refused; 16 (vLLM's) */
    bool strict;                   /* --strict: unknown fields / lax types are line errors */
    bool truncate_max_tokens;      /* --truncate-max-tokens: clamp instead of a line error */

    /* chat (generate and chat-template) */
    const char *chat_template_path;/* --chat-template FILE: always wins over the tokenizer's */
    bool has_chat_date;            /* --chat-template-date given */
    int64_t chat_date_unix;        /* its day at 12:00:00 UTC, seconds since the epoch */
    cli_reasoning_parser reasoning_parser; /* --reasoning-parser (generate); NONE = off */

    /* tokenize */
    bool no_special;

    /* merge: the shard outputs named after the flags (borrowed from argv) */
    char **merge_files;
    int32_t n_merge_files;
} cli_options;

/* Defaults for every field (what --help prints). */
void cli_options_init(cli_options *o);

/* Parses argv (argv[0] is the program). On PG_EINVAL err says what was
 * wrong ("--block-size: expected a power of two in [1, 256], got 12"). */
int cli_options_parse(cli_options *o, int argc, char **argv, pg_error *err);

/* The --dtype / --kv-cache-dtype combinations device ("cpu", "cuda", or
 * "auto" = not known yet: only the combinations no device accepts) cannot
 * run, as PG_EINVAL with a message naming the flag. cli_options_parse calls
 * it with --device; cli_device_open again with the device it picked. */
int cli_options_check_dtypes(const cli_options *o, const char *device, pg_error *err);

/* Writes the help of `cmd` (GENERATE, TOKENIZE, CHAT_TEMPLATE, or HELP for
 * the overview). */
void cli_options_help(FILE *f, cli_command cmd);

/* Long option names of a command, NULL-terminated (for tests that check the
 * help lists every flag). */
const char *const *cli_options_names(cli_command cmd);

/* "2GiB", "512MiB", "1.5G", "1000000" -> bytes. KiB/MiB/GiB/TiB and the bare
 * K/M/G/T are powers of 1024; KB/MB/GB/TB are powers of 1000; B or no suffix
 * = bytes. Must be > 0 and fit in 64 bits. */
int cli_parse_size(const char *s, uint64_t *out, pg_error *err);
/* Whole decimal number in [lo, hi]; `what` names the flag in messages. */
int cli_parse_int(const char *s, int64_t lo, int64_t hi, const char *what, int64_t *out,
                  pg_error *err);
/* Finite number in [lo, hi]. */
int cli_parse_double(const char *s, double lo, double hi, const char *what, double *out,
                     pg_error *err);

/* "YYYY-MM-DD" (a real calendar day, years 1970..9999) -> that day at
 * 12:00:00 UTC in seconds since the epoch (noon: the time the chat
 * template goldens pin strftime_now to). */
int cli_parse_date(const char *s, int64_t *out, pg_error *err);

const char *cli_format_name(cli_format f);
const char *cli_matmul_precision_name(cli_matmul_precision p); /* "exact", "bf16", "int8" */
const char *cli_kv_dtype_name(cli_kv_dtype d); /* "auto", "bf16", "fp16", "f32" */
const char *cli_dtype_name(cli_dtype d);       /* "auto", "bfloat16", "float32" */

#endif /* PG_CLI_OPTIONS_H */
