/*
 * log.h: timestamped one-line logs to stderr.
 */

#ifndef MSV_LOG_H
#define MSV_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum msv_log_level {
    MSV_LOG_ERROR = 0,
    MSV_LOG_WARN  = 1,
    MSV_LOG_INFO  = 2,
    MSV_LOG_DEBUG = 3
};

extern int msv_log_level;

void msv_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define msv_err(...)   msv_log(MSV_LOG_ERROR, __VA_ARGS__)
#define msv_warn(...)  msv_log(MSV_LOG_WARN, __VA_ARGS__)
#define msv_info(...)  msv_log(MSV_LOG_INFO, __VA_ARGS__)
#define msv_debug(...) \
    do { if (msv_log_level >= MSV_LOG_DEBUG) msv_log(MSV_LOG_DEBUG, __VA_ARGS__); } while (0)

#ifdef __cplusplus
}
#endif

#endif /* MSV_LOG_H */
