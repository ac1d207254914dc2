/* Unit tests for internal/net/fanout.c: one buffer to many sockets on one to three lanes, through
 * io_uring and through the send() fallback: every entry gets the whole buffer (a socket listed
 * several times gets it as often), a full socket reports -EAGAIN and gets nothing, a closed peer
 * reports -EPIPE without SIGPIPE, a bad descriptor -EBADF, an answer larger than the room left is
 * written in part, and more sockets than one submission holds; and a split job's helper is kept
 * off the caller's CPU (where it would wait for the caller's whole submission). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal/net/fanout.h"

#define PAIRS 40

static const char msg[] = "HTTP/1.1 200 OK\r\n\r\n{}";

/* Reads everything pending on fd (non-blocking) and returns how many bytes; each must repeat msg. */
static size_t drain_checked(int fd)
{
    char buf[4096];
    size_t total = 0;
    ssize_t r;
    while ((r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
        for (ssize_t i = 0; i < r; i++)
            assert_int_equal(buf[i], msg[(total + (size_t)i) % (sizeof(msg) - 1)]);
        total += (size_t)r;
    }
    return total;
}

static void check_every_entry(int lanes, bool ring)
{
    int sv[PAIRS][2];
    for (int i = 0; i < PAIRS; i++)
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
    /* more entries than one submission holds; each socket appears n / PAIRS times */
    size_t n = FANOUT_DEPTH * 2 + 77;
    int *fds = malloc(n * sizeof(*fds));
    ssize_t *res = malloc(n * sizeof(*res));
    assert_non_null(fds);
    assert_non_null(res);
    for (size_t i = 0; i < n; i++)
        fds[i] = sv[i % PAIRS][0];
    fanout_t *fo = fanout_new(lanes, ring);
    assert_non_null(fo);
    if (!ring)
        assert_false(fanout_batched(fo));
    for (int round = 0; round < 2; round++) { /* the rings are reused */
        fanout_send(fo, fds, n, msg, sizeof(msg) - 1, res);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(res[i], (ssize_t)(sizeof(msg) - 1));
        for (int p = 0; p < PAIRS; p++) {
            size_t times = n / PAIRS + ((size_t)p < n % PAIRS ? 1 : 0);
            assert_int_equal(drain_checked(sv[p][1]), times * (sizeof(msg) - 1));
        }
    }
    fanout_send(fo, fds, 0, msg, sizeof(msg) - 1, res); /* nothing to do */
    fanout_free(fo);
    for (int i = 0; i < PAIRS; i++) {
        close(sv[i][0]);
        close(sv[i][1]);
    }
    free(fds);
    free(res);
}

static void test_every_entry_gets_the_buffer(void **state)
{
    (void)state;
    for (int lanes = 1; lanes <= 3; lanes++) {
        check_every_entry(lanes, true);
        check_every_entry(lanes, false);
    }
}

static void check_failures(bool ring)
{
    int ok[2], full[2], gone[2], part[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, ok), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, full), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, gone), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, part), 0);
    static char fill[1 << 16];
    while (send(full[0], fill, sizeof(fill), MSG_DONTWAIT) > 0)
        ;
    close(gone[1]);
    int bad = 1 << 20; /* above any descriptor this process opens (the rings open some meanwhile) */
    assert_int_equal(fcntl(bad, F_GETFD), -1);
    /* the partial one: a buffer larger than the socket takes */
    size_t big = 4u << 20;
    char *large = malloc(big);
    assert_non_null(large);
    memset(large, 'x', big);

    fanout_t *fo = fanout_new(2, ring);
    assert_non_null(fo);
    int fds[] = {ok[0], full[0], gone[0], bad};
    ssize_t res[4];
    fanout_send(fo, fds, 4, msg, sizeof(msg) - 1, res);
    assert_int_equal(res[0], (ssize_t)(sizeof(msg) - 1));
    assert_int_equal(res[1], -EAGAIN);
    assert_int_equal(res[2], -EPIPE);
    assert_int_equal(res[3], -EBADF);
    assert_int_equal(drain_checked(ok[1]), sizeof(msg) - 1);

    int pfd[] = {part[0]};
    ssize_t pres[1];
    fanout_send(fo, pfd, 1, large, big, pres);
    assert_true(pres[0] > 0 && (size_t)pres[0] < big);
    fanout_free(fo);
    free(large);
    int all[] = {ok[0], ok[1], full[0], full[1], gone[0], part[0], part[1]};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        close(all[i]);
}

static void test_full_closed_bad_and_partial(void **state)
{
    (void)state;
    /* a closed peer must not kill the process: the sends carry MSG_NOSIGNAL */
    assert_true(signal(SIGPIPE, SIG_DFL) != SIG_ERR);
    check_failures(true);
    check_failures(false);
}

static void test_ring_used_where_available(void **state)
{
    (void)state;
    fanout_t *fo = fanout_new(1, true);
    assert_non_null(fo);
    /* not asserted: a kernel or sandbox without io_uring is allowed, and then send() is used */
    print_message("io_uring %s\n", fanout_batched(fo) ? "in use" : "unavailable: send() fallback");
    fanout_free(fo);
}

/* The CPUs thread "fanout-1" of this process may run on, from /proc (the helper is private). */
static bool helper_cpus(cpu_set_t *set)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char path[300], name[64] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(name, sizeof(name), f) && strcmp(name, "fanout-1\n") == 0)
            found = sched_getaffinity(atoi(e->d_name), sizeof(*set), set) == 0;
        fclose(f);
    }
    closedir(d);
    return found;
}

static void test_helper_kept_off_callers_cpu(void **state)
{
    (void)state;
    cpu_set_t mine;
    assert_int_equal(sched_getaffinity(0, sizeof(mine), &mine), 0);
    if (CPU_COUNT(&mine) < 2)
        skip(); /* one CPU: nothing to choose from */
    int sv[PAIRS][2];
    for (int i = 0; i < PAIRS; i++)
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
    size_t n = 200; /* enough to split */
    int fds[200];
    ssize_t res[200];
    for (size_t i = 0; i < n; i++)
        fds[i] = sv[i % PAIRS][0];
    fanout_t *fo = fanout_new(2, true);
    assert_non_null(fo);
    /* the caller on each of two CPUs in turn: the helper follows to wherever the caller is not */
    for (int round = 0; round < 2; round++) {
        int cpu = -1, seen = 0;
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &mine) && seen++ == round)
                cpu = c;
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
        fanout_send(fo, fds, n, msg, sizeof(msg) - 1, res);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(res[i], (ssize_t)(sizeof(msg) - 1));
        for (int i = 0; i < PAIRS; i++)
            assert_int_equal(drain_checked(sv[i][1]), (n / PAIRS) * (sizeof(msg) - 1));
        cpu_set_t helper;
        assert_true(helper_cpus(&helper));
        assert_false(CPU_ISSET(cpu, &helper));
        assert_int_equal(CPU_COUNT(&helper), CPU_COUNT(&mine) - 1);
    }
    assert_int_equal(sched_setaffinity(0, sizeof(mine), &mine), 0);
    fanout_free(fo);
    for (int i = 0; i < PAIRS; i++) {
        close(sv[i][0]);
        close(sv[i][1]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_entry_gets_the_buffer),
        cmocka_unit_test(test_full_closed_bad_and_partial),
        cmocka_unit_test(test_ring_used_where_available),
        cmocka_unit_test(test_helper_kept_off_callers_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
