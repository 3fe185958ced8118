/* main: subcommand dispatch and exit codes (run.h lists them). The only
 * place in pagedgen that ends the process. */
#include <stdio.h>
#include <stdlib.h>

#include "options.h"
#include "run.h"

#ifndef PAGEDGEN_VERSION
#define PAGEDGEN_VERSION "unknown"
#endif

int main(int argc, char **argv)
{
    cli_options o;
    pg_error err;
    if (cli_options_parse(&o, argc, argv, &err) != PG_OK) {
        fprintf(stderr, "pagedgen: %s\n", err.msg);
        return CLI_EXIT_USAGE;
    }
    switch (o.cmd) {
    case CLI_CMD_HELP:
        cli_options_help(stdout, o.help_for);
        return fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_IO;
    case CLI_CMD_VERSION:
        printf("pagedgen %s\n", PAGEDGEN_VERSION);
        return fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_IO;
    case CLI_CMD_TOKENIZE:
        return cli_run_tokenize(&o);
    case CLI_CMD_CHAT_TEMPLATE:
        return cli_run_chat_template(&o);
    case CLI_CMD_PERPLEXITY:
        return cli_run_perplexity(&o);
    case CLI_CMD_MERGE:
        return cli_run_merge(&o);
    case CLI_CMD_GENERATE:
        return o.n_devices > 1 || o.devices_all ? cli_run_multi_device(&o) : cli_run_generate(&o);
    }
    return CLI_EXIT_USAGE;
}
