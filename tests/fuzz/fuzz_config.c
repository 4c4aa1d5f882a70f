/*
 * fuzz_config: the node configuration (kagentd --config FILE) as YAML bytes through
 * ka_config_load_buffer (parse, types, validation). An accepted configuration printed with
 * ka_config_print (--print-config) must load again to the same values.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ka_config_t a, b;
    char err[KA_CFG_ERR_CAP];
    memset(&a, 0, sizeof a);
    if (ka_config_load_buffer(&a, "fuzz.yaml", (const char *)data, size, err, sizeof err) != 0) {
        if (!memchr(err, '\0', sizeof err) || !err[0])
            abort(); /* a refusal always says why */
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        abort();
    ka_config_print(&a, f);
    fclose(f);
    memset(&b, 0, sizeof b);
    if (ka_config_load_buffer(&b, "printed", text, len, err, sizeof err) != 0) {
        fprintf(stderr, "printed configuration refused: %s\n%s\n", err, text);
        abort();
    }
    if (memcmp(&a, &b, sizeof a) != 0) {
        fprintf(stderr, "printed configuration loads differently:\n%s\n", text);
        abort();
    }
    free(text);
    return 0;
}
