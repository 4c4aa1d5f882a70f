/*
 * kagent-image: the images CLI as a standalone tool (for deploy scripts, tests and benchmarks
 * before and beside `kagentd image ...`).
 *
 *   kagent-image [--state-dir DIR] COMMAND [ARGS]   (default: $KAGENT_STATE_DIR)
 */
#include "images_cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *state = getenv("KAGENT_STATE_DIR");
    int first = 1;
    if (argc > 2 && !strcmp(argv[1], "--state-dir")) {
        state = argv[2];
        first = 3;
    }
    if (!state || !state[0]) {
        fprintf(stderr, "kagent-image: give --state-dir DIR or set KAGENT_STATE_DIR\n");
        return 2;
    }
    /* ka_images_cli wants argv[0] = the command word, argv[1] = the subcommand */
    argv[first - 1] = "image";
    return ka_images_cli(state, argc - first + 1, argv + first - 1);
}
