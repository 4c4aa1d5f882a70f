/* Mesh frames: a batch of envelopes in one ZeroMQ message (see krt_mesh_frame.h). */
#include "krt_mesh_frame.h"
#include "krt_codec.h"

static void s_be(uint8_t *d, uint64_t v, int n)
{
    for (int i = n; i-- > 0; v >>= 8)
        d[i] = (uint8_t)v;
}

static uint64_t s_get_be(const uint8_t *d, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | d[i];
    return v;
}

void krt_mframe_header(uint8_t *d, uint64_t src_inc, uint64_t dst_inc)
{
    d[0] = 'K';
    d[1] = 'F';
    d[2] = KRT_MFRAME_VERSION;
    d[3] = 0;
    s_be(d + 4, src_inc, 8);
    s_be(d + 12, dst_inc, 8);
}

void krt_mframe_len(uint8_t *d, uint32_t len)
{
    s_be(d, len, KRT_MFRAME_LEN);
}

int krt_mframe_open(krt_mframe_t *f, const void *data, size_t len)
{
    const uint8_t *d = data;
    if (!d || len < KRT_MFRAME_HEADER || d[0] != 'K' || d[1] != 'F' || d[2] != KRT_MFRAME_VERSION ||
        d[3] != 0)
        return KRT_CODEC_EBADMSG;
    f->src_inc = s_get_be(d + 4, 8);
    f->dst_inc = s_get_be(d + 12, 8);
    f->p = d + KRT_MFRAME_HEADER;
    f->end = d + len;
    return 0;
}

int krt_mframe_next(krt_mframe_t *f, const uint8_t **env, size_t *len)
{
    size_t left = (size_t)(f->end - f->p);
    if (left == 0)
        return 0;
    if (left < KRT_MFRAME_LEN)
        return KRT_CODEC_ETRUNC;
    uint64_t n = s_get_be(f->p, KRT_MFRAME_LEN);
    if (n > left - KRT_MFRAME_LEN)
        return KRT_CODEC_ETRUNC;
    *env = f->p + KRT_MFRAME_LEN;
    *len = (size_t)n;
    f->p += KRT_MFRAME_LEN + n;
    return 1;
}
