/*
 * fuzz_image: a file a sandbox offers as an image, as read_sandbox_file prepares it for the model
 * (kb_mcp_image_prepare): the header checks, the PNG/JPEG/GIF/WebP decoders with their errors
 * caught, the GIF frame copy, the shrink and the JPEG ladder. Whatever is shown must fit the
 * budgets.
 *
 * Input: the file (its type sniffed from its first bytes, as the tool does). Files whose header
 * claims over 1 M pixels are skipped: a legitimate decode of that size takes the fuzzer's whole
 * time budget; test_mcp covers those sizes (and the 50 M-pixel refusal).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mcp_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *mime = kb_mcp_sniff(data, size < KB_MCP_SNIFF_LEN ? size : KB_MCP_SNIFF_LEN);
    if (strncmp(mime, "image/", 6) != 0)
        return 0;
    unsigned w = 0, h = 0;
    if (kb_mcp_image_size(data, size, &w, &h) == 0 && (uint64_t)w * h > 1000000)
        return 0;
    kb_mcp_image_t img;
    char msg[256];
    int rc = kb_mcp_image_prepare(data, size, mime, &img, msg, sizeof msg);
    if (rc == 0 && img.reencoded) {
        unsigned side = img.shown_w > img.shown_h ? img.shown_w : img.shown_h;
        if (!img.data || img.len > KB_MCP_IMAGE_MAX_BYTES || side > KB_MCP_IMAGE_MAX_SIDE ||
            memcmp(img.data, "\xff\xd8\xff", 3) != 0)
            abort();
    } else if (rc == 0 && img.data) {
        abort();
    } else if (rc != 0 && (rc != KB_MCP_IMAGE_TOO_LARGE && rc != KB_MCP_IMAGE_CORRUPT)) {
        abort();
    }
    kb_mcp_image_free(&img);
    return 0;
}
