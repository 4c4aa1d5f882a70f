/*
 * Images for the model (mcp_int.h): read_sandbox_file's rules from the reference (section 2.2).
 * An image whose long side is over 2000 px or that is over 500,000 bytes is decoded (PNG with
 * libpng, JPEG with libjpeg-turbo, GIF's first frame with giflib, WebP with libwebp) and
 * re-encoded as JPEG at quality 85, 70, 55, then 40; while that is still over the budget it is
 * shrunk by 0.75 (area average, from the original each time) and tried again. Over 50 M pixels
 * is refused. The bytes come from the sandbox, so every decoder runs with its errors caught and
 * the pixel count is checked against the decoder's own header before anything is allocated.
 */
#include "mcp_int.h"

#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

typedef struct {
    unsigned char *px; /* RGB, 3 bytes per pixel, rows packed */
    unsigned w, h;
} s_rgb_t;

static int s_fail(char *msg, size_t cap, const char *what)
{
    snprintf(msg, cap, "%s", what);
    return -1;
}

static bool s_pixels_ok(uint64_t w, uint64_t h)
{
    return w > 0 && h > 0 && w * h <= KB_MCP_IMAGE_MAX_PIXELS;
}

/* ---- decoders ---------------------------------------------------------------------------------
 */

static int s_decode_png(const unsigned char *p, size_t len, s_rgb_t *out, char *msg, size_t cap)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, p, len))
        return s_fail(msg, cap, img.message);
    if (!s_pixels_ok(img.width, img.height)) {
        png_image_free(&img);
        return s_fail(msg, cap, "too many pixels");
    }
    img.format = PNG_FORMAT_RGB;
    out->w = img.width;
    out->h = img.height;
    out->px = malloc(PNG_IMAGE_SIZE(img));
    if (!out->px) {
        png_image_free(&img);
        return s_fail(msg, cap, "out of memory");
    }
    png_color white = {255, 255, 255}; /* transparency is shown over white */
    if (!png_image_finish_read(&img, &white, out->px, 0, NULL)) {
        free(out->px);
        out->px = NULL;
        return s_fail(msg, cap, img.message);
    }
    return 0;
}

typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf jb;
    char text[JMSG_LENGTH_MAX];
} s_jerr_t;

static void s_jpeg_error_exit(j_common_ptr cinfo)
{
    s_jerr_t *e = (s_jerr_t *)cinfo->err;
    cinfo->err->format_message(cinfo, e->text);
    longjmp(e->jb, 1);
}

static void s_jpeg_silent(j_common_ptr cinfo, int level)
{
    (void)cinfo;
    (void)level;
}

static void s_jpeg_errors(struct jpeg_common_struct *c, s_jerr_t *e)
{
    c->err = jpeg_std_error(&e->mgr);
    e->mgr.error_exit = s_jpeg_error_exit;
    e->mgr.emit_message = s_jpeg_silent;
    e->text[0] = '\0';
}

static int s_decode_jpeg(const unsigned char *p, size_t len, s_rgb_t *out, char *msg, size_t cap)
{
    struct jpeg_decompress_struct d;
    s_jerr_t e;
    s_jpeg_errors((struct jpeg_common_struct *)&d, &e);
    unsigned char *volatile px = NULL;
    if (setjmp(e.jb)) {
        free(px);
        jpeg_destroy_decompress(&d);
        return s_fail(msg, cap, e.text);
    }
    jpeg_create_decompress(&d);
    jpeg_mem_src(&d, p, (unsigned long)len);
    jpeg_read_header(&d, TRUE);
    if (!s_pixels_ok(d.image_width, d.image_height)) {
        jpeg_destroy_decompress(&d);
        return s_fail(msg, cap, "too many pixels");
    }
    d.out_color_space = JCS_RGB;
    jpeg_start_decompress(&d);
    size_t stride = (size_t)d.output_width * 3;
    px = malloc(stride * d.output_height);
    if (!px) {
        jpeg_destroy_decompress(&d);
        return s_fail(msg, cap, "out of memory");
    }
    while (d.output_scanline < d.output_height) {
        JSAMPROW row = px + stride * d.output_scanline;
        jpeg_read_scanlines(&d, &row, 1);
    }
    jpeg_finish_decompress(&d);
    out->w = d.output_width;
    out->h = d.output_height;
    out->px = px;
    jpeg_destroy_decompress(&d);
    return 0;
}

typedef struct {
    const unsigned char *p;
    size_t len, pos;
} s_mem_t;

static int s_gif_read(GifFileType *g, GifByteType *buf, int n)
{
    s_mem_t *m = g->UserData;
    size_t take = m->len - m->pos < (size_t)n ? m->len - m->pos : (size_t)n;
    memcpy(buf, m->p + m->pos, take);
    m->pos += take;
    return (int)take;
}

/* The first frame's pixels into out (the canvas, background white), its rows in order. */
static int s_gif_frame(GifFileType *g, s_rgb_t *out)
{
    const GifImageDesc *d = &g->Image;
    const ColorMapObject *cm = d->ColorMap ? d->ColorMap : g->SColorMap;
    if (!cm || d->Left < 0 || d->Top < 0 || d->Width <= 0 || d->Height <= 0 ||
        (unsigned)d->Left + (unsigned)d->Width > out->w ||
        (unsigned)d->Top + (unsigned)d->Height > out->h)
        return -1;
    GifPixelType *line = malloc((size_t)d->Width);
    if (!line)
        return -1;
    static const int start[] = {0, 4, 2, 1}, step[] = {8, 8, 4, 2};
    int passes = d->Interlace ? 4 : 1, rc = 0;
    for (int pass = 0; pass < passes && !rc; pass++)
        for (int y = d->Interlace ? start[pass] : 0; y < d->Height && !rc;
             y += d->Interlace ? step[pass] : 1) {
            if (DGifGetLine(g, line, d->Width) != GIF_OK) {
                rc = -1;
                break;
            }
            unsigned char *o = out->px + ((size_t)(d->Top + y) * out->w + (size_t)d->Left) * 3;
            for (int x = 0; x < d->Width; x++, o += 3)
                if (line[x] < cm->ColorCount) {
                    o[0] = cm->Colors[line[x]].Red;
                    o[1] = cm->Colors[line[x]].Green;
                    o[2] = cm->Colors[line[x]].Blue;
                }
        }
    free(line);
    return rc;
}

static int s_decode_gif(const unsigned char *p, size_t len, s_rgb_t *out, char *msg, size_t cap)
{
    s_mem_t m = {p, len, 0};
    int err = 0;
    GifFileType *g = DGifOpen(&m, s_gif_read, &err);
    if (!g)
        return s_fail(msg, cap, GifErrorString(err) ?: "not a GIF");
    int rc = -1;
    const char *why = "no image in the GIF";
    if (!s_pixels_ok((uint64_t)g->SWidth, (uint64_t)g->SHeight)) {
        why = "too many pixels";
        goto close;
    }
    out->w = (unsigned)g->SWidth;
    out->h = (unsigned)g->SHeight;
    out->px = malloc((size_t)out->w * out->h * 3);
    if (!out->px) {
        why = "out of memory";
        goto close;
    }
    memset(out->px, 255, (size_t)out->w * out->h * 3);
    GifRecordType t;
    while (DGifGetRecordType(g, &t) == GIF_OK && t != TERMINATE_RECORD_TYPE) {
        if (t == IMAGE_DESC_RECORD_TYPE) {
            if (DGifGetImageDesc(g) == GIF_OK && s_gif_frame(g, out) == 0)
                rc = 0;
            else
                why = "corrupt GIF image data";
            break;
        }
        if (t == EXTENSION_RECORD_TYPE) { /* skip it */
            int code;
            GifByteType *ext;
            if (DGifGetExtension(g, &code, &ext) != GIF_OK)
                break;
            while (ext && DGifGetExtensionNext(g, &ext) == GIF_OK)
                ;
        }
    }
close:
    DGifCloseFile(g, &err);
    if (rc) {
        free(out->px);
        out->px = NULL;
        return s_fail(msg, cap, why);
    }
    return 0;
}

static int s_decode_webp(const unsigned char *p, size_t len, s_rgb_t *out, char *msg, size_t cap)
{
    int w, h;
    if (!WebPGetInfo(p, len, &w, &h))
        return s_fail(msg, cap, "not a WebP image");
    if (!s_pixels_ok((uint64_t)w, (uint64_t)h))
        return s_fail(msg, cap, "too many pixels");
    uint8_t *px = WebPDecodeRGB(p, len, &w, &h);
    if (!px)
        return s_fail(msg, cap, "corrupt WebP image data");
    /* libwebp's buffer is freed with WebPFree: copy into ours */
    out->px = malloc((size_t)w * (size_t)h * 3);
    if (out->px)
        memcpy(out->px, px, (size_t)w * (size_t)h * 3);
    WebPFree(px);
    if (!out->px)
        return s_fail(msg, cap, "out of memory");
    out->w = (unsigned)w;
    out->h = (unsigned)h;
    return 0;
}

static int s_decode(const char *mime, const unsigned char *p, size_t len, s_rgb_t *out, char *msg,
                    size_t cap)
{
    if (strcmp(mime, "image/png") == 0)
        return s_decode_png(p, len, out, msg, cap);
    if (strcmp(mime, "image/jpeg") == 0)
        return s_decode_jpeg(p, len, out, msg, cap);
    if (strcmp(mime, "image/gif") == 0)
        return s_decode_gif(p, len, out, msg, cap);
    if (strcmp(mime, "image/webp") == 0)
        return s_decode_webp(p, len, out, msg, cap);
    return s_fail(msg, cap, "not an image type this server decodes");
}

/* ---- resampling and encoding ----------------------------------------------------------------
 */

/* src shrunk to w x h by averaging the source pixels each output pixel covers. */
static int s_shrink(const s_rgb_t *src, unsigned w, unsigned h, s_rgb_t *dst)
{
    dst->w = w;
    dst->h = h;
    dst->px = malloc((size_t)w * h * 3);
    if (!dst->px)
        return -1;
    for (unsigned y = 0; y < h; y++) {
        unsigned y0 = (unsigned)((uint64_t)y * src->h / h);
        unsigned y1 = (unsigned)((uint64_t)(y + 1) * src->h / h);
        if (y1 <= y0)
            y1 = y0 + 1;
        for (unsigned x = 0; x < w; x++) {
            unsigned x0 = (unsigned)((uint64_t)x * src->w / w);
            unsigned x1 = (unsigned)((uint64_t)(x + 1) * src->w / w);
            if (x1 <= x0)
                x1 = x0 + 1;
            uint64_t sum[3] = {0, 0, 0};
            for (unsigned sy = y0; sy < y1; sy++) {
                const unsigned char *s = src->px + ((size_t)sy * src->w + x0) * 3;
                for (unsigned sx = x0; sx < x1; sx++, s += 3) {
                    sum[0] += s[0];
                    sum[1] += s[1];
                    sum[2] += s[2];
                }
            }
            uint64_t n = (uint64_t)(y1 - y0) * (x1 - x0);
            unsigned char *o = dst->px + ((size_t)y * w + x) * 3;
            for (int c = 0; c < 3; c++)
                o[c] = (unsigned char)((sum[c] + n / 2) / n);
        }
    }
    return 0;
}

/* img as a JPEG at quality q (malloc'd into *out, *out_len). */
static int s_encode_jpeg(const s_rgb_t *img, int q, unsigned char **out, size_t *out_len)
{
    struct jpeg_compress_struct c;
    s_jerr_t e;
    s_jpeg_errors((struct jpeg_common_struct *)&c, &e);
    /* libjpeg writes the buffer and its size here; on the heap, so they survive a longjmp */
    struct {
        unsigned char *buf;
        unsigned long n;
    } *const dst = calloc(1, sizeof *dst);
    if (!dst)
        return -1;
    if (setjmp(e.jb)) {
        jpeg_destroy_compress(&c);
        free(dst->buf);
        free(dst);
        return -1;
    }
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &dst->buf, &dst->n);
    c.image_width = img->w;
    c.image_height = img->h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, q, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = img->px + (size_t)c.next_scanline * img->w * 3;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    *out = dst->buf;
    *out_len = dst->n;
    free(dst);
    return 0;
}

/* Tries the quality ladder on img; 0 with the first JPEG within the byte budget. */
static int s_ladder(const s_rgb_t *img, unsigned char **out, size_t *out_len)
{
    static const int qualities[] = {85, 70, 55, 40};
    for (size_t i = 0; i < sizeof qualities / sizeof qualities[0]; i++) {
        if (s_encode_jpeg(img, qualities[i], out, out_len))
            return -1;
        if (*out_len <= KB_MCP_IMAGE_MAX_BYTES)
            return 0;
        free(*out);
        *out = NULL;
    }
    return 1;
}

/* The JPEG of src within both budgets (long side, bytes), shrinking by 0.75 until it fits. */
static int s_fit(const s_rgb_t *src, kb_mcp_image_t *out)
{
    double scale = 1.0;
    for (;;) {
        unsigned w = (unsigned)(src->w * scale + 0.5), h = (unsigned)(src->h * scale + 0.5);
        if (w < 1 || h < 1)
            return -1; /* nothing small enough: cannot happen for real budgets */
        if ((w > h ? w : h) <= KB_MCP_IMAGE_MAX_SIDE) {
            s_rgb_t small = *src;
            if (scale < 1.0 && s_shrink(src, w, h, &small))
                return -1;
            int rc = s_ladder(&small, &out->data, &out->len);
            if (small.px != src->px)
                free(small.px);
            if (rc <= 0) {
                out->shown_w = w;
                out->shown_h = h;
                return rc;
            }
        }
        scale *= 0.75;
    }
}

int kb_mcp_image_prepare(const unsigned char *p, size_t len, const char *mime, kb_mcp_image_t *out,
                         char *msg, size_t cap)
{
    memset(out, 0, sizeof *out);
    out->mime = mime;
    unsigned w = 0, h = 0;
    if (kb_mcp_image_size(p, len, &w, &h) == 0 && !s_pixels_ok(w, h) && w && h) {
        snprintf(msg, cap, "%s, %u\xc3\x97%u px: too large to read (over %u M pixels)", mime, w, h,
                 (unsigned)(KB_MCP_IMAGE_MAX_PIXELS / 1000000));
        return KB_MCP_IMAGE_TOO_LARGE;
    }
    out->w = w;
    out->h = h;
    bool small_side = w && h && (w > h ? w : h) <= KB_MCP_IMAGE_MAX_SIDE;
    if (small_side && len <= KB_MCP_IMAGE_MAX_BYTES)
        return 0; /* as it is */
    s_rgb_t img = {0};
    char why[200];
    if (s_decode(mime, p, len, &img, why, sizeof why)) {
        snprintf(msg, cap, "cannot decode %s: %s", mime, why);
        return strcmp(why, "too many pixels") == 0 ? KB_MCP_IMAGE_TOO_LARGE : KB_MCP_IMAGE_CORRUPT;
    }
    out->w = img.w;
    out->h = img.h;
    int rc = s_fit(&img, out);
    free(img.px);
    if (rc) {
        snprintf(msg, cap, "cannot re-encode %s", mime);
        return KB_MCP_IMAGE_CORRUPT;
    }
    out->mime = "image/jpeg";
    out->reencoded = true;
    return 0;
}

void kb_mcp_image_free(kb_mcp_image_t *img)
{
    free(img->data);
    img->data = NULL;
}
