/*
 * Structured logging: one entry point, one line per event.
 * text: ts=... level=info path=node-1/store event=connected key=value ...
 * json: {"ts":"...","level":"info","path":"...","event":"...","msg":"key=value ..."}
 */
#include "krt.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

static struct {
    krt_log_level_t level;
    bool json;
    FILE *out; /* NULL means stderr */
    pthread_mutex_t lock;
} s_log = {KRT_LOG_INFO, false, NULL, PTHREAD_MUTEX_INITIALIZER};

static const char *const s_level_names[] = {"debug", "info", "warn", "error"};

void krt_log_configure(krt_log_level_t level, bool json, FILE *out)
{
    pthread_mutex_lock(&s_log.lock);
    s_log.level = level;
    s_log.json = json;
    s_log.out = out;
    pthread_mutex_unlock(&s_log.lock);
}

int krt_log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, s_level_names[i]) == 0)
            return i;
    return -1;
}

bool krt_log_enabled(krt_log_level_t level)
{
    return level >= s_log.level;
}

static void s_timestamp(char *buf, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* Writes s as a JSON string body (without quotes), escaping what JSON requires. */
static void s_json_escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
}

void krt_vlog(krt_log_level_t level, const char *path, const char *event, const char *fmt,
              va_list ap)
{
    if (!krt_log_enabled(level))
        return;
    char ts[40], msg[2048];
    s_timestamp(ts, sizeof ts);
    vsnprintf(msg, sizeof msg, fmt ? fmt : "", ap);
    pthread_mutex_lock(&s_log.lock);
    FILE *f = s_log.out ? s_log.out : stderr;
    if (s_log.json) {
        fprintf(f, "{\"ts\":\"%s\",\"level\":\"%s\",\"path\":\"", ts, s_level_names[level]);
        s_json_escape(f, path ? path : "");
        fputs("\",\"event\":\"", f);
        s_json_escape(f, event ? event : "");
        fputs("\",\"msg\":\"", f);
        s_json_escape(f, msg);
        fputs("\"}\n", f);
    } else {
        fprintf(f, "ts=%s level=%s path=%s event=%s%s%s\n", ts, s_level_names[level],
                path ? path : "-", event ? event : "-", msg[0] ? " " : "", msg);
    }
    fflush(f);
    pthread_mutex_unlock(&s_log.lock);
}

void krt_log(krt_log_level_t level, const char *path, const char *event, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    krt_vlog(level, path, event, fmt, ap);
    va_end(ap);
}
