/* lora_rules_driver: lora_config's module rules as a process, for
 * tests/weights/test_lora_rules.py. Usage: lora_rules_driver CONFIG.json...
 * < module names (one a line). For each config in turn prints a line
 * "== CONFIG.json", then per name "TARGETED R ALPHA" (lora_config_targets,
 * lora_config_rank_alpha), or one line "refused: <message>" when the config
 * is refused. One process for all the configs: under ASan a process start
 * costs more than a config's checks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
#include "lora_config.h"

enum { MAX_MODULES = 4096 };

static int check_config(const char *path, char *const *modules, int n_modules)
{
    char *text = NULL;
    size_t len = 0;
    pg_error e;
    printf("== %s\n", path);
    if (pg_read_file(path, (size_t)1 << 20, &text, &len, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    lora_config c;
    if (lora_config_parse(&c, text, len, path, &e)) {
        printf("refused: %s\n", e.msg);
        free(text);
        return 0;
    }
    for (int i = 0; i < n_modules; i++) {
        int32_t r;
        double alpha;
        lora_config_rank_alpha(&c, modules[i], &r, &alpha);
        printf("%d %d %.17g\n", lora_config_targets(&c, modules[i]), r, alpha);
    }
    lora_config_free(&c);
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: lora_rules_driver CONFIG.json... < modules\n");
        return 2;
    }
    static char *modules[MAX_MODULES];
    int n_modules = 0;
    char line[1024];
    while (n_modules < MAX_MODULES && fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (!(modules[n_modules] = strdup(line)))
            return 2;
        n_modules++;
    }
    int rc = 0;
    for (int a = 1; a < argc && rc == 0; a++)
        rc = check_config(argv[a], modules, n_modules);
    for (int i = 0; i < n_modules; i++)
        free(modules[i]);
    return rc;
}
