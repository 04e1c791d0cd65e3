/*
 * log.c: timestamped one-line logs to stderr.
 */

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

int msv_log_level = MSV_LOG_INFO;

static const char *msv_log_names[] = { "error", "warn", "info", "debug" };


void
msv_log(int level, const char *fmt, ...)
{
    char            line[1024];
    size_t          n;
    va_list         ap;
    struct tm       tm;
    struct timeval  tv;

    if (level > msv_log_level) {
        return;
    }

    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    n += snprintf(line + n, sizeof(line) - n, ".%03ld [%s] %d: ",
                  (long) tv.tv_usec / 1000, msv_log_names[level],
                  (int) getpid());

    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);

    n = strlen(line);
    if (n + 1 < sizeof(line)) {
        line[n++] = '\n';
    } else {
        line[sizeof(line) - 1] = '\n';
        n = sizeof(line);
    }

    /* one write per line, so lines of several processes don't mix */
    if (write(STDERR_FILENO, line, n) < 0) {
        /* nothing better to do */
    }
}
