/* lora_rules_driver: lora_config's module rules as a process, for
 * tests/weights/test_lora_rules.py. Usage: lora_rules_driver CONFIG.json
 * < module names (one a line). Prints, per name, "TARGETED R ALPHA"
 * (lora_config_targets, lora_config_rank_alpha), or one line
 * "refused: <message>" when the config is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
#include "lora_config.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: lora_rules_driver CONFIG.json < modules\n");
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    pg_error e;
    if (pg_read_file(argv[1], (size_t)1 << 20, &text, &len, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    lora_config c;
    if (lora_config_parse(&c, text, len, argv[1], &e)) {
        printf("refused: %s\n", e.msg);
        free(text);
        return 0;
    }
    char line[1024];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        int32_t r;
        double alpha;
        lora_config_rank_alpha(&c, line, &r, &alpha);
        printf("%d %d %.17g\n", lora_config_targets(&c, line), r, alpha);
    }
    lora_config_free(&c);
    free(text);
    return 0;
}
