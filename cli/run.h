/* run: the subcommands. Each returns the process exit code
 * (CLI_EXIT_*); nothing here calls exit(). */
#ifndef PG_CLI_RUN_H
#define PG_CLI_RUN_H

#include "options.h"

enum cli_exit {
    CLI_EXIT_OK = 0,
    CLI_EXIT_LINES_FAILED = 1,   /* the run finished, some lines got error records */
    CLI_EXIT_USAGE = 2,
    CLI_EXIT_MODEL = 3,          /* model/tokenizer/chat template load error, or the backend failed */
    CLI_EXIT_IO = 4,             /* input/output file error */
    CLI_EXIT_INTERRUPTED = 130,  /* SIGINT/SIGTERM */
};

/* generate: read prompts, run the engine, write records (run.c). */
int cli_run_generate(const cli_options *o);
/* generate with --device cuda:LIST / cuda:all: one worker process per
 * device, records joined in input order (multi_device.c). */
int cli_run_multi_device(const cli_options *o);
/* tokenize: write {"ids", "count"} per line (tokenize_cmd.c). */
int cli_run_tokenize(const cli_options *o);
/* chat-template: write {"text", "token_ids"} per chat line (chat_template_cmd.c). */
int cli_run_chat_template(const cli_options *o);
/* perplexity: llama-perplexity's estimate over a text file (perplexity_cmd.c). */
int cli_run_perplexity(const cli_options *o);
/* `pagedgen merge` (merge_cmd.c): 0 merged, 1 incomplete (nothing written
 * to -o), 2 refused, 4 I/O. */
int cli_run_merge(const cli_options *o);

/* SIGINT/SIGTERM set a flag read by both loops (signals.c); SIGPIPE is
 * ignored so that a closed stdout is a write error, not a silent death. */
void cli_signals_install(void);
bool cli_signals_stop_requested(void);

#endif /* PG_CLI_RUN_H */
