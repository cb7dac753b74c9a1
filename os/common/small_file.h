/* small_file: the whole of a small file (/proc, /sys, a uevent) in one read(2), as a string.
 *
 * small_file_read(path, buf, cap, err): at most cap - 1 bytes into buf, NUL-terminated; returns how
 * many, or -1 with err ("PATH: reason"; err may be NULL) and buf "" when the file cannot be opened
 * or read. One read: the kernel hands such files over whole. */
#ifndef STRATA_SMALL_FILE_H
#define STRATA_SMALL_FILE_H

#include <stddef.h>

int small_file_read(const char *path, char *buf, size_t cap, char *err);

#endif
