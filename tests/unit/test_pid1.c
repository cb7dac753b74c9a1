/* pid1 outside PID 1: everything is a no-op, the process count sees at least this process and
 * never a kernel thread. (PID-1 behaviour itself: tests/integration/pid1_namespace.sh and the
 * boot tests.) */
#include "os/common/errmsg.h"
#include "os/runtime/pid1.h"
#include "tests/unit/check.h"

#include <dirent.h>
#include <unistd.h>

TEST(not_pid1_is_a_no_op)
{
    char err[ERRMSG_LEN] = "";
    CHECK_EQ_INT(pid1_active(), getpid() == 1);
    if (getpid() == 1) SKIP("running as PID 1");
    CHECK_EQ_INT(pid1_init(NULL, NULL, err), 0);
    CHECK_EQ_INT(pid1_shutdown_requested(), 0);
}

TEST(process_count_skips_kernel_threads)
{
    int n = pid1_process_count();
    CHECKF(n >= 1, "pid1_process_count() = %d", n);
    /* Where kernel threads are visible (kthreadd is PID 2 in the initial namespace), every /proc
     * entry outnumbers the user-space processes counted. */
    FILE *f = fopen("/proc/2/comm", "r");
    char comm[64] = "";
    if (!f) SKIP("no kernel threads visible in /proc");
    if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
    fclose(f);
    if (strncmp(comm, "kthreadd", 8)) SKIP("PID 2 is not kthreadd");
    int all = 0;
    DIR *d = opendir("/proc");
    CHECK(d != NULL);
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9') all++;
    closedir(d);
    CHECKF(n < all, "%d counted of %d /proc entries, kernel threads included", n, all);
}

int main(void)
{
    RUN(not_pid1_is_a_no_op);
    RUN(process_count_skips_kernel_threads);
    CHECK_DONE();
}
