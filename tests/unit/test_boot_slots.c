/* test_boot_slots: the A/B boot slot names (os/boot_slots.h) and their file operations on a
 * directory standing in for the EFI system partition; the HTTP fetch of `strata update URL`
 * (os/http_fetch.h) against a real server on loopback. */
#include "os/runtime/boot_slots.h"
#include "os/common/errmsg.h"
#include "os/runtime/http_fetch.h"

#include "tests/unit/check.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

TEST(entry_names)
{
    struct boot_entry e;
    CHECK(boot_entry_parse("strata-1-a.efi", &e) == 0);
    CHECK(e.gen == 1 && e.slot == 'a' && e.left == -1 && e.done == -1);
    CHECK(boot_entry_parse("strata-12-b+3.efi", &e) == 0);
    CHECK(e.gen == 12 && e.slot == 'b' && e.left == 3 && e.done == -1);
    CHECK(boot_entry_parse("STRATA-2-B+0-2.EFI", &e) == 0);
    CHECK(e.gen == 2 && e.slot == 'b' && e.left == 0 && e.done == 2);
    const char *bad[] = {"strata-a.efi",    "strata-0-a.efi",    "strata-1-c.efi",
                         "strata-1-a+.efi", "strata-1-a+1-.efi", "strata-1-a.efix",
                         "other-1-a.efi",   "strata-1-a",        "strata-1234567-a.efi"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECKF(boot_entry_parse(bad[i], &e) == -1, "%s parsed", bad[i]);
    char out[64];
    CHECK(boot_entry_blessed_name("strata-2-b+1-1.efi", out, sizeof out) == 0);
    CHECK_STR(out, "strata-2-b.efi");
    CHECK(boot_entry_blessed_name("strata-2-b.efi", out, sizeof out) == -1);
}

TEST(plan_writes_the_slot_that_is_not_the_newest_good_one)
{
    char slot, name[64], err[ERRMSG_LEN];
    int rm[8], nrm;
    /* As built: slot a good; the update goes to b, generation 2. */
    const char *built[] = {"strata-1-a.efi"};
    CHECK(boot_slots_plan(built, 1, 2, &slot, name, sizeof name, rm, &nrm, err) == 0);
    CHECK(slot == 'b' && nrm == 0);
    CHECK_STR(name, "strata-2-b+2.efi");
    /* b was blessed: the next update replaces a, as generation 3. */
    const char *blessed[] = {"strata-1-a.efi", "strata-2-b.efi", "README"};
    CHECK(boot_slots_plan(blessed, 3, 1, &slot, name, sizeof name, rm, &nrm, err) == 0);
    CHECK(slot == 'a' && nrm == 1 && rm[0] == 0);
    CHECK_STR(name, "strata-3-a+1.efi");
    /* b failed (no tries left): a is still the good one, so b is rewritten. */
    const char *failed[] = {"strata-2-b+0-2.efi", "strata-1-a.efi"};
    CHECK(boot_slots_plan(failed, 2, 2, &slot, name, sizeof name, rm, &nrm, err) == 0);
    CHECK(slot == 'b' && nrm == 1 && rm[0] == 0);
    CHECK_STR(name, "strata-3-b+2.efi");
    /* Nothing good: refuse. */
    const char *none[] = {"strata-2-b+1.efi"};
    CHECK(boot_slots_plan(none, 1, 2, &slot, name, sizeof name, rm, &nrm, err) == -1);
    CHECK_STR(err, "boot slots: no good entry in EFI/Linux (nothing to fall back to)");
    CHECK(boot_slots_plan(built, 1, 0, &slot, name, sizeof name, rm, &nrm, err) == -1);
}

static void write_file(const char *path, const char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f);
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

/* A minimal PE: "MZ", e_lfanew = 64, "PE\0\0" at 64. */
static void write_pe(const char *path)
{
    char pe[80] = {'M', 'Z'};
    pe[60] = 64;
    memcpy(pe + 64, "PE\0\0strata", 10);
    write_file(path, pe, sizeof pe);
}

static int exists(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/EFI/Linux/%s", dir, name);
    return access(p, F_OK) == 0;
}

TEST(install_and_bless_on_a_directory)
{
    char esp[] = "/tmp/test_boot_slots.XXXXXX", p[512], name[64], err[ERRMSG_LEN];
    CHECK(mkdtemp(esp));
    snprintf(p, sizeof p, "%s/EFI", esp);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/EFI/Linux", esp);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/EFI/Linux/strata-1-a.efi", esp);
    write_pe(p);
    char img[600];
    snprintf(img, sizeof img, "%s/new.efi", esp);
    write_pe(img);

    CHECK(boot_slots_install(esp, img, 2, name, sizeof name, err) == 0);
    CHECK_STR(name, "strata-2-b+2.efi");
    CHECK(exists(esp, "strata-1-a.efi") && exists(esp, "strata-2-b+2.efi"));
    /* systemd-boot renames before the first try; the server then blesses that name. */
    char from[800], to[800];
    snprintf(from, sizeof from, "%s/EFI/Linux/strata-2-b+2.efi", esp);
    snprintf(to, sizeof to, "%s/EFI/Linux/strata-2-b+1-1.efi", esp);
    CHECK(rename(from, to) == 0);
    CHECK(boot_slots_bless(esp, "\\EFI\\Linux\\strata-2-b+1-1.efi", name, sizeof name, err) == 0);
    CHECK_STR(name, "strata-2-b.efi");
    CHECK(exists(esp, "strata-2-b.efi") && !exists(esp, "strata-2-b+1-1.efi"));
    CHECK(boot_slots_bless(esp, "\\EFI\\Linux\\strata-2-b.efi", name, sizeof name, err) == 0);
    CHECK_STR(name, "");

    /* The next update replaces slot a; a file that is not a PE image is refused. */
    CHECK(boot_slots_install(esp, img, 1, name, sizeof name, err) == 0);
    CHECK_STR(name, "strata-3-a+1.efi");
    CHECK(!exists(esp, "strata-1-a.efi") && exists(esp, "strata-2-b.efi"));
    write_file(img, "<html>not found</html>", 22);
    CHECK(boot_slots_install(esp, img, 1, name, sizeof name, err) == -1);
    CHECKF(strstr(err, "not an EFI (PE) image") != NULL, "err: %s", err);

    DIR *d = opendir(p);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') {
            snprintf(from, sizeof from, "%s/%s", p, e->d_name);
            unlink(from);
        }
    if (d) closedir(d);
    rmdir(p);
    snprintf(p, sizeof p, "%s/EFI", esp);
    rmdir(p);
    unlink(img);
    rmdir(esp);
}

TEST(http_url_and_head)
{
    struct http_url u;
    char err[ERRMSG_LEN];
    CHECK(http_url_parse("http://10.0.0.2:8000/img/strata.efi", &u, err) == 0);
    CHECK_STR(u.host, "10.0.0.2");
    CHECK_STR(u.port, "8000");
    CHECK(!strcmp(u.path, "/img/strata.efi"));
    CHECK(http_url_parse("http://peer", &u, err) == 0);
    CHECK_STR(u.port, "80");
    CHECK(!strcmp(u.path, "/"));
    CHECK(http_url_parse("https://peer/x", &u, err) == -1);
    CHECK(http_url_parse("http://peer:99999/x", &u, err) == -1);
    CHECK(http_url_parse("http://peer/a b", &u, err) == -1);

    int status;
    long long len;
    size_t hl;
    const char *h = "HTTP/1.0 200 OK\r\nServer: x\r\nContent-Length: 1234\r\n\r\nbody";
    CHECK(http_head_parse(h, strlen(h), &status, &len, &hl, err) == 0);
    CHECK(status == 200 && len == 1234 && hl == strlen(h) - 4);
    CHECK(http_head_parse(h, 20, &status, &len, &hl, err) == 1);
    const char *h404 = "HTTP/1.1 404 Not Found\r\n\r\n";
    CHECK(http_head_parse(h404, strlen(h404), &status, &len, &hl, err) == 0);
    CHECK(status == 404 && len == -1);
    const char *bad = "HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n";
    CHECK(http_head_parse(bad, strlen(bad), &status, &len, &hl, err) == -1);
    CHECK(http_head_parse("SSH-2.0\r\n\r\n", 11, &status, &len, &hl, err) == -1);
}

/* One response, then close: a peer serving a file. */
static int srv_fd;
static const char *srv_reply;
static void *serve_one(void *arg)
{
    (void)arg;
    int c = accept(srv_fd, NULL, NULL);
    if (c < 0) return NULL;
    char buf[2048];
    ssize_t r = read(c, buf, sizeof buf);
    (void)r;
    if (write(c, srv_reply, strlen(srv_reply)) < 0) (void)0;
    close(c);
    return NULL;
}

static int fetch_from_loopback(const char *reply, const char *dest, long long *bytes, char *err)
{
    srv_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(srv_fd, (struct sockaddr *)&a, sizeof a) || listen(srv_fd, 1) ||
        getsockname(srv_fd, (struct sockaddr *)&a, &al))
        return errmsg_set(err, "loopback listen failed");
    srv_reply = reply;
    pthread_t t;
    pthread_create(&t, NULL, serve_one, NULL);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/strata.efi", ntohs(a.sin_port));
    int rc = http_fetch(url, dest, bytes, err);
    pthread_join(t, NULL);
    close(srv_fd);
    return rc;
}

TEST(http_fetch_over_loopback)
{
    char dest[] = "/tmp/test_boot_slots_fetch.XXXXXX", err[ERRMSG_LEN], got[64] = {0};
    int fd = mkstemp(dest);
    CHECK(fd >= 0);
    close(fd);
    long long n;
    CHECK(fetch_from_loopback("HTTP/1.0 200 OK\r\nContent-Length: 11\r\n\r\nhello world", dest, &n,
                              err) == 0);
    CHECK(n == 11);
    FILE *f = fopen(dest, "rb");
    CHECK(f && fread(got, 1, sizeof got, f) == 11);
    fclose(f);
    CHECK_STR(got, "hello world");
    CHECK(fetch_from_loopback("HTTP/1.0 200 OK\r\nContent-Length: 99\r\n\r\nshort", dest, &n,
                              err) == -1);
    CHECKF(strstr(err, "body is 5 bytes, Content-Length says 99") != NULL, "err: %s", err);
    CHECK(fetch_from_loopback("HTTP/1.0 404 Not Found\r\n\r\n", dest, &n, err) == -1);
    CHECKF(strstr(err, "HTTP status 404") != NULL, "err: %s", err);
    unlink(dest);
}

int main(void)
{
    RUN(entry_names);
    RUN(plan_writes_the_slot_that_is_not_the_newest_good_one);
    RUN(install_and_bless_on_a_directory);
    RUN(http_url_and_head);
    RUN(http_fetch_over_loopback);
    CHECK_DONE();
}
