/* boot_cmdline: every strata.* key, the defaults, and the errors a bad line must give. */
#include "os/common/boot_cmdline.h"
#include "os/common/errmsg.h"
#include "tests/unit/check.h"

static struct boot_config cfg;
static char err[ERRMSG_LEN];

static int parse(const char *line)
{
    err[0] = 0;
    return boot_cmdline_parse(line, &cfg, err);
}

TEST(defaults_and_kernel_keys_ignored)
{
    CHECK_EQ_INT(parse("BOOT_IMAGE=/vmlinuz console=ttyS0 quiet ip=dhcp initrd=x"), 0);
    CHECK_EQ_INT(cfg.port, 8080);
    CHECK_EQ_INT(cfg.node, -1);
    CHECK_EQ_INT(cfg.hugepages, -1);
    CHECK_EQ_INT(cfg.has_ip, 0);
    CHECK_EQ_INT(cfg.on_error, BOOT_ON_ERROR_HALT);
    CHECK_STR(cfg.model, "");
    CHECK_EQ_INT(parse(""), 0);
    CHECK_EQ_INT(parse(NULL), 0);
}

TEST(all_keys)
{
    CHECK_EQ_INT(parse("console=ttyS0 strata.model=/model.gguf strata.node=3 strata.role=serve "
                       "strata.peers=10.0.0.2:7000,10.0.0.3 strata.api_key=s3cret strata.port=8081 "
                       "strata.hugepages=64 strata.ip=10.0.2.15/24 strata.gw=10.0.2.2 "
                       "strata.dns=10.0.2.3,1.1.1.1 strata.iface=eth1 strata.on_error=reboot "
                       "strata.console=/dev/ttyS1 strata.args=\"--threads 2 --ctx 256\""),
                 0);
    CHECK_STR(cfg.model, "/model.gguf");
    CHECK_EQ_INT(cfg.node, 3);
    CHECK_STR(cfg.role, "serve");
    CHECK_STR(cfg.peers, "10.0.0.2:7000,10.0.0.3");
    CHECK_STR(cfg.api_key, "s3cret");
    CHECK_EQ_INT(cfg.port, 8081);
    CHECK_EQ_INT(cfg.hugepages, 64);
    CHECK_EQ_INT(cfg.has_ip, 1);
    CHECK_EQ_INT(cfg.ip, 0x0a00020f);
    CHECK_EQ_INT(cfg.prefix, 24);
    CHECK_EQ_INT(cfg.gw, 0x0a000202);
    CHECK_EQ_INT(cfg.n_dns, 2);
    CHECK_EQ_INT(cfg.dns[1], 0x01010101);
    CHECK_STR(cfg.iface, "eth1");
    CHECK_EQ_INT(cfg.on_error, BOOT_ON_ERROR_REBOOT);
    CHECK_STR(cfg.console, "/dev/ttyS1");
    CHECK_STR(cfg.args, "--threads 2 --ctx 256");
}

TEST(netmask_and_partition_model)
{
    CHECK_EQ_INT(parse("strata.ip=192.168.1.20/255.255.254.0 strata.model=part:strata-model"), 0);
    CHECK_EQ_INT(cfg.prefix, 23);
    CHECK_STR(cfg.model, "part:strata-model");
    CHECK_EQ_INT(parse("strata.ip=\"10.1.2.3/0\""), 0);
    CHECK_EQ_INT(cfg.prefix, 0);
    CHECK_EQ_INT(parse("strata.ip=10.1.2.3/255.0.255.0"), -1);
}

TEST(pxelinux_ipappend)
{
    CHECK_EQ_INT(
        parse("initrd=initrd.img ip=10.0.2.15:10.0.2.2:10.0.2.2:255.255.255.0 BOOTIF=01-52-54"), 0);
    CHECK_EQ_INT(cfg.has_ip, 1);
    CHECK_EQ_INT(cfg.ip, 0x0a00020f);
    CHECK_EQ_INT(cfg.prefix, 24);
    CHECK_EQ_INT(cfg.has_gw, 1);
    CHECK_EQ_INT(cfg.gw, 0x0a000202);
    /* strata.ip wins, wherever it stands */
    CHECK_EQ_INT(parse("strata.ip=192.168.0.9/16 ip=10.0.2.15:10.0.2.2:10.0.2.2:255.255.255.0"), 0);
    CHECK_EQ_INT(cfg.ip, 0xc0a80009);
    CHECK_EQ_INT(cfg.prefix, 16);
    CHECK_EQ_INT(cfg.has_gw, 0);
    /* an empty gateway, and forms that are the kernel's alone */
    CHECK_EQ_INT(parse("ip=10.0.2.15:10.0.2.2::255.255.0.0"), 0);
    CHECK_EQ_INT(cfg.prefix, 16);
    CHECK_EQ_INT(cfg.has_gw, 0);
    CHECK_EQ_INT(parse("ip=dhcp"), 0);
    CHECK_EQ_INT(cfg.has_ip, 0);
    CHECK_EQ_INT(parse("ip=10.0.2.15:10.0.2.2:10.0.2.2:255.0.255.0"), 0);
    CHECK_EQ_INT(cfg.has_ip, 0);
}

TEST(ip_dhcp_off_and_watchdog)
{
    /* No strata.ip: DHCP (neither static nor off). */
    CHECK_EQ_INT(parse("console=ttyS0"), 0);
    CHECK_EQ_INT(cfg.has_ip + cfg.ip_off, 0);
    CHECK_EQ_INT(cfg.watchdog, 0);
    CHECK_EQ_INT(parse("strata.ip=10.0.2.15/24 strata.ip=dhcp"), 0);
    CHECK_EQ_INT(cfg.has_ip + cfg.ip_off, 0);
    CHECK_EQ_INT(parse("strata.ip=off"), 0);
    CHECK_EQ_INT(cfg.has_ip, 0);
    CHECK_EQ_INT(cfg.ip_off, 1);
    CHECK_EQ_INT(parse("strata.ip=off strata.ip=10.0.2.15/24"), 0);
    CHECK_EQ_INT(cfg.has_ip, 1);
    CHECK_EQ_INT(cfg.ip_off, 0);
    /* strata.ip=dhcp wins over PXELINUX's ip= as a static strata.ip does */
    CHECK_EQ_INT(parse("ip=10.0.2.15:10.0.2.2:10.0.2.2:255.255.255.0 strata.ip=dhcp"), 0);
    CHECK_EQ_INT(cfg.has_ip, 0);
    CHECK_EQ_INT(cfg.has_gw, 0);
    CHECK_EQ_INT(parse("strata.watchdog=30"), 0);
    CHECK_EQ_INT(cfg.watchdog, 30);
    CHECK_EQ_INT(parse("strata.watchdog=30 strata.watchdog=off"), 0);
    CHECK_EQ_INT(cfg.watchdog, 0);
    CHECK_EQ_INT(parse("strata.watchdog=3601"), -1);
    CHECK_STR(err, "strata.watchdog=3601: want a timeout in seconds 1..3600, 0 or off");
    CHECK_EQ_INT(parse("strata.ip=dhcpx"), -1);
    CHECK_STR(err, "strata.ip=dhcpx: malformed address (want A.B.C.D/PREFIX, dhcp or off)");
}

TEST(later_key_wins)
{
    CHECK_EQ_INT(parse("strata.port=1 strata.port=2"), 0);
    CHECK_EQ_INT(cfg.port, 2);
}

TEST(unknown_key)
{
    CHECK_EQ_INT(parse("console=ttyS0 strata.colour=blue"), -1);
    CHECK_STR(err, "strata.colour: unknown key (see boot/cmdline.md)");
}

TEST(malformed_values)
{
    CHECK_EQ_INT(parse("strata.ip=10.0.2.300/24"), -1);
    CHECK_STR(err, "strata.ip=10.0.2.300/24: malformed address (want A.B.C.D/PREFIX, dhcp or off)");
    const char *bad[] = {
        "strata.ip=10.0.2.15",
        "strata.ip=10.0.2.15/33",
        "strata.ip=10.0.2/24",
        "strata.ip=1.2.3.4.5/8",
        "strata.ip=01234.1.1.1/8",
        "strata.ip=-1.2.3.4/8",
        "strata.gw=10.0.2.2/24",
        "strata.gw=",
        "strata.port=0",
        "strata.port=65536",
        "strata.port=80x",
        "strata.node=-1",
        "strata.hugepages=lots",
        "strata.dns=1.1.1.1,",
        "strata.dns=1.1.1.1,2.2.2.2,3.3.3.3,4.4.4.4",
        "strata.on_error=explode",
        "strata.model=",
        "strata.model=relative.gguf",
        "strata.model=part:",
        "strata.peers=10.0.0.1:0",
        "strata.peers=10.0.0.1,,10.0.0.2",
        "strata.cluster=10.0.0.1:7100",
        "strata.cluster=0@10.0.0.1",
        "strata.cluster=1@10.0.0.1:0",
        "strata.cluster=1@10.0.0.1,,2@10.0.0.2",
        "strata.cluster=1@10.0.0.1,2@",
        "strata.cluster=65536@10.0.0.1",
        "strata.role=Serve",
        "strata.rack=",
        "strata.rack=\"row 1\"",
        "strata.rack=a/b",
        "strata.rack=r,1",
        "strata.rack=0123456789012345678901234567890123456789012345678901234567890123",
        "strata.api_key=",
        "strata.console=ttyS0",
        "strata.iface=a/b",
        "strata.port",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECKF(parse(bad[i]) == -1, "'%s' was accepted", bad[i]);
        CHECKF(!strncmp(err, "strata.", 7), "'%s' gave the message '%s'", bad[i], err);
    }
}

TEST(fabric_keys)
{
    static const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    char line[256];
    CHECK_EQ_INT(parse("strata.role=member strata.node=3 "
                       "strata.cluster=1@10.0.0.1:7100,2@10.0.0.2,3@10.0.0.3:7200"),
                 0);
    CHECK_STR(cfg.role, "member");
    CHECK_STR(cfg.cluster, "1@10.0.0.1:7100,2@10.0.0.2,3@10.0.0.3:7200");
    CHECK_STR(cfg.rack, "");
    CHECK_EQ_INT(parse("strata.node=3 strata.cluster=1@10.0.0.1 strata.rack=row2.Rack-7_b"), 0);
    CHECK_STR(cfg.rack, "row2.Rack-7_b");
    CHECK_EQ_INT(parse("strata.role=join strata.peers=10.0.0.2"), 0);
    CHECK_STR(cfg.role, "join");
    CHECK_STR(cfg.fabric, "");
    CHECK_EQ_INT(cfg.fabric_port, 7000);
    CHECK_STR(cfg.key, "");
    snprintf(line, sizeof line, "strata.fabric=rdma strata.fabric_port=7100 strata.key=%s", hex);
    CHECK_EQ_INT(parse(line), 0);
    CHECK_STR(cfg.fabric, "rdma");
    CHECK_EQ_INT(cfg.fabric_port, 7100);
    CHECK_STR(cfg.key, hex);
    CHECK_STR(cfg.key_file, "");
    /* a key file on the model partition; the later key wins */
    snprintf(line, sizeof line, "strata.key=%s strata.key=/mnt/model/cluster.key", hex);
    CHECK_EQ_INT(parse(line), 0);
    CHECK_STR(cfg.key, "");
    CHECK_STR(cfg.key_file, "/mnt/model/cluster.key");
    CHECK_EQ_INT(parse("strata.fabric_ip=10.0.9.2/24 strata.fabric_iface=eth1"), 0);
    CHECK_EQ_INT(cfg.has_fabric_ip, 1);
    CHECK_EQ_INT(cfg.fabric_ip, 0x0a000902);
    CHECK_EQ_INT(cfg.fabric_prefix, 24);
    CHECK_STR(cfg.fabric_iface, "eth1");
    const char *bad[] = {"strata.fabric=udp",
                         "strata.fabric_port=0",
                         "strata.key=s3cretkey",
                         "strata.key=0011",
                         "strata.key=",
                         "strata.fabric_ip=10.0.9.2/24",
                         "strata.fabric_ip=10.0.9",
                         "strata.fabric_iface=a/b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECKF(parse(bad[i]) == -1, "'%s' was accepted", bad[i]);
        CHECKF(!strncmp(err, "strata.", 7), "'%s' gave the message '%s'", bad[i], err);
    }
    /* a malformed key is never repeated in the message */
    CHECK_EQ_INT(parse("strata.key=s3cretkey"), -1);
    CHECKF(!strstr(err, "s3cret"), "the message shows the key: '%s'", err);
}

TEST(on_error_known_despite_earlier_error)
{
    CHECK_EQ_INT(parse("strata.ip=bad strata.on_error=reboot strata.bogus=1"), -1);
    CHECK_EQ_INT(cfg.on_error, BOOT_ON_ERROR_REBOOT);
    CHECKF(strstr(err, "strata.ip=bad") != NULL, "first error reported, got '%s'", err);
}

TEST(init_args_after_double_dash_ignored)
{
    CHECK_EQ_INT(parse("strata.port=9 -- strata.bogus=1"), 0);
    CHECK_EQ_INT(cfg.port, 9);
}

TEST(too_long_value)
{
    char line[2000] = "strata.args=";
    memset(line + 12, 'a', 1500);
    line[1512] = 0;
    CHECK_EQ_INT(parse(line), -1);
    CHECKF(strstr(err, "longer than") != NULL, "got '%s'", err);
}

TEST(ip_str)
{
    char b[16];
    CHECK_STR(boot_ip_str(0x0a00020f, b), "10.0.2.15");
    CHECK_STR(boot_on_error_name(BOOT_ON_ERROR_POWEROFF), "poweroff");
}

int main(void)
{
    RUN(defaults_and_kernel_keys_ignored);
    RUN(all_keys);
    RUN(netmask_and_partition_model);
    RUN(pxelinux_ipappend);
    RUN(ip_dhcp_off_and_watchdog);
    RUN(later_key_wins);
    RUN(unknown_key);
    RUN(malformed_values);
    RUN(fabric_keys);
    RUN(on_error_known_despite_earlier_error);
    RUN(init_args_after_double_dash_ignored);
    RUN(too_long_value);
    RUN(ip_str);
    CHECK_DONE();
}
