/* guest_tty: see guest_tty.h. */
#include "guest_tty.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

static uint16_t s_dim(uint32_t v, uint16_t def)
{
    return v == 0 ? def : v > 0xffff ? 0xffff : (uint16_t)v;
}

int ka_gt_resize(int master, uint32_t rows, uint32_t cols)
{
    struct winsize ws = {.ws_row = s_dim(rows, KA_GT_ROWS), .ws_col = s_dim(cols, KA_GT_COLS)};
    return ioctl(master, TIOCSWINSZ, &ws) < 0 ? -errno : 0;
}

int ka_gt_open(uint32_t rows, uint32_t cols, int *master, int *slave)
{
    *master = *slave = -1;
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (m < 0)
        return -errno;
    int rc = 0;
    if (grantpt(m) < 0 || unlockpt(m) < 0 || ka_gt_resize(m, rows, cols) < 0)
        rc = -errno;
    int s = rc ? -1 : ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (!rc && s < 0)
        rc = -errno;
    if (!rc && fcntl(m, F_SETFL, O_NONBLOCK) < 0)
        rc = -errno;
    if (rc) {
        if (s >= 0)
            close(s);
        close(m);
        return rc;
    }
    *master = m;
    *slave = s;
    return 0;
}

int ka_gt_child(int slave)
{
    if (setsid() < 0 || ioctl(slave, TIOCSCTTY, 0) < 0)
        return -errno;
    for (int fd = 0; fd < 3; fd++)
        if (dup2(slave, fd) < 0)
            return -errno;
    return 0;
}

char ka_gt_eof_char(int master)
{
    struct termios t;
    if (tcgetattr(master, &t) < 0 || t.c_cc[VEOF] == _POSIX_VDISABLE)
        return 4; /* ^D */
    return (char)t.c_cc[VEOF];
}
