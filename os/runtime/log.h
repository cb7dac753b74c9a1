/* log: one line per event on stderr (the console on an appliance), prefixed with the uptime in
 * seconds and the subsystem: "[  1.234] loader: layer 3/5 resident (4.1 MiB)".
 * Not for hot paths: the fabric and compute loops count into metrics instead. */
#ifndef STRATA_LOG_H
#define STRATA_LOG_H

void log_info(const char *subsys, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_warn(const char *subsys, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_error(const char *subsys, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Silence info lines (tests, `strata generate` without -v). Warnings and errors still print. */
void log_set_quiet(int quiet);

#endif
