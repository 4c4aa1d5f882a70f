/*
 * guest_tty: pseudo terminals for processes the guest starts with "tty" (guest_proto.h).
 *
 * The slave is reached from the master with TIOCGPTPEER, never through a /dev/pts path (a
 * process in the sandbox could swap that path). The child becomes a session leader with the
 * slave as its controlling terminal and as fds 0, 1 and 2.
 */
#ifndef KA_GUEST_TTY_H
#define KA_GUEST_TTY_H

#include <stdint.h>

#define KA_GT_ROWS 24 /* window size when the request gives none */
#define KA_GT_COLS 80

/* Opens a master (*master, non-blocking, close-on-exec) and its slave (*slave, close-on-exec)
 * sized rows x cols (0: the defaults). 0 or -errno (both closed then). */
int ka_gt_open(uint32_t rows, uint32_t cols, int *master, int *slave);
/* In the forked child: setsid, the slave as controlling terminal and as fds 0-2. 0 or -errno. */
int ka_gt_child(int slave);
/* Sets the window size (the kernel signals SIGWINCH to the foreground group). 0 or -errno. */
int ka_gt_resize(int master, uint32_t rows, uint32_t cols);
/* The terminal's EOF character (VEOF, ^D unless changed). */
char ka_gt_eof_char(int master);

#endif
