/*
 * kagent: the command-line client. All logic lives in kb_cli (cli.c and cmd_*.c).
 */
#include <stdio.h>

#include "cli.h"

int main(int argc, char **argv)
{
    kb_cli_install_signals();
    return kb_cli_main(argc, argv, stdout, stderr);
}
