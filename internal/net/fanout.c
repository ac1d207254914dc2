/*
 * fanout — see fanout.h. Each lane is one thread with its own io_uring: lane 0 is the caller's,
 * lanes 1.. are helper threads that wait for a job (a generation counter under mu) and take
 * their slice of it. A lane queues up to FANOUT_DEPTH send requests, submits them in one
 * io_uring_enter that also waits, and reaps them before its next batch, so the completion ring
 * (twice the submission ring) never overflows. A request's user data is its index in the
 * caller's arrays.
 */
#include "internal/net/fanout.h"

#include <assert.h>
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "internal/util/log.h"

#define FANOUT_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL)
#define FANOUT_UNSET INT64_MIN /* no result yet */
#define FANOUT_RETRIES 8       /* refused submissions in a row before a ring is given up */
#define FANOUT_SPLIT 64        /* fewer sockets than this are not worth waking a helper */

typedef struct {
    struct io_uring ring;
    bool ring_ok;
    fanout_t *fo;
    int index;
} fanout_lane_t;

/* One fanout_send: its arrays, split into `parts` equal slices (slice k is lane k's). */
typedef struct {
    const int *fds;
    size_t n;
    const void *buf;
    size_t len;
    ssize_t *res;
    int parts;
} fanout_job_t;

struct fanout {
    fanout_lane_t *lanes;
    int nlanes; /* lane 0 and the helpers that started */
    pthread_t *helpers;
    /* the job, guarded by mu: helpers run lanes 1..nlanes-1 of generation gen */
    pthread_mutex_t mu;
    pthread_cond_t cv, done_cv;
    uint64_t gen;
    int pending;
    bool stop;
    fanout_job_t job;
    /* Where the helpers may run: the CPUs the process had at fanout_new, less the one the caller
     * ran on at the last split (placed_cpu; -1 before the first, or when there is nothing to
     * choose from). Without this the scheduler wakes a helper on the caller's CPU, where it
     * waits for the caller's whole submission before sending anything: the lanes then run one
     * after the other, not side by side. */
    cpu_set_t allowed;
    int placed_cpu;
};

static void fanout_send_each(const int *fds, size_t n, const void *buf, size_t len, ssize_t *res)
{
    for (size_t i = 0; i < n; i++) {
        if (res[i] != FANOUT_UNSET)
            continue;
        ssize_t w = send(fds[i], buf, len, FANOUT_FLAGS);
        res[i] = w < 0 ? -errno : w;
    }
}

/* One batch (n <= FANOUT_DEPTH) through the lane's ring; every res[i] starts FANOUT_UNSET.
 * Returns 0, or a negative errno when the ring refused the batch; the caller then sends what is
 * still unset. Non-blocking sends run to completion inside the submit, so a refused ring holds
 * none of them. */
static int fanout_ring_batch(fanout_lane_t *ln, const int *fds, size_t n, const void *buf, size_t len, ssize_t *res)
{
    assert(n <= FANOUT_DEPTH);
    for (size_t i = 0; i < n; i++) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ln->ring);
        assert(sqe); /* the ring is empty between batches and holds FANOUT_DEPTH */
        io_uring_prep_send(sqe, fds[i], buf, len, FANOUT_FLAGS);
        io_uring_sqe_set_data64(sqe, i);
    }
    size_t got = 0;
    int refused = 0;
    while (got < n) {
        int rc = io_uring_submit_and_wait(&ln->ring, 1);
        if (rc < 0 && rc != -EINTR && ((rc != -EAGAIN && rc != -EBUSY) || ++refused > FANOUT_RETRIES))
            return rc;
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ln->ring, head, cqe)
        {
            uint64_t i = io_uring_cqe_get_data64(cqe);
            assert(i < n && res[i] == FANOUT_UNSET);
            res[i] = cqe->res;
            seen++;
        }
        io_uring_cq_advance(&ln->ring, seen);
        got += seen;
    }
    return 0;
}

static void fanout_lane_send(fanout_lane_t *ln, const int *fds, size_t n, const void *buf, size_t len, ssize_t *res)
{
    for (size_t at = 0; ln->ring_ok && at < n; at += FANOUT_DEPTH) {
        size_t k = n - at < FANOUT_DEPTH ? n - at : FANOUT_DEPTH;
        int rc = fanout_ring_batch(ln, fds + at, k, buf, len, res + at);
        if (rc < 0) {
            log_warn("fanout", "io_uring submission failed: this lane answers with one send() per socket from now on",
                     LF_I("lane", ln->index), LF_I("errno", -rc));
            io_uring_queue_exit(&ln->ring);
            ln->ring_ok = false;
        }
    }
    fanout_send_each(fds, n, buf, len, res);
}

/* Lane k's slice of the current job (mu held or the job otherwise stable). */
static void fanout_lane_run(fanout_t *fo, int k)
{
    const fanout_job_t *j = &fo->job;
    size_t lo = j->n * (size_t)k / (size_t)j->parts, hi = j->n * (size_t)(k + 1) / (size_t)j->parts;
    fanout_lane_send(&fo->lanes[k], j->fds + lo, hi - lo, j->buf, j->len, j->res + lo);
}

static void *fanout_helper_main(void *arg)
{
    fanout_lane_t *ln = arg;
    fanout_t *fo = ln->fo;
    char name[16];
    snprintf(name, sizeof(name), "fanout-%d", ln->index);
    pthread_setname_np(pthread_self(), name);
    uint64_t seen = 0;
    pthread_mutex_lock(&fo->mu);
    for (;;) {
        while (fo->gen == seen && !fo->stop)
            pthread_cond_wait(&fo->cv, &fo->mu);
        if (fo->stop)
            break;
        seen = fo->gen;
        bool mine = ln->index < fo->job.parts;
        pthread_mutex_unlock(&fo->mu);
        if (mine)
            fanout_lane_run(fo, ln->index);
        pthread_mutex_lock(&fo->mu);
        if (--fo->pending == 0)
            pthread_cond_signal(&fo->done_cv);
    }
    pthread_mutex_unlock(&fo->mu);
    return NULL;
}

fanout_t *fanout_new(int lanes, bool use_ring)
{
    assert(lanes >= 1);
    fanout_t *fo = calloc(1, sizeof(*fo));
    if (!fo)
        return NULL;
    fo->lanes = calloc((size_t)lanes, sizeof(*fo->lanes));
    fo->helpers = calloc((size_t)lanes, sizeof(*fo->helpers));
    if (!fo->lanes || !fo->helpers) {
        free(fo->lanes);
        free(fo->helpers);
        free(fo);
        return NULL;
    }
    fo->placed_cpu = -1;
    if (sched_getaffinity(0, sizeof(fo->allowed), &fo->allowed) != 0)
        CPU_ZERO(&fo->allowed);
    pthread_mutex_init(&fo->mu, NULL);
    pthread_cond_init(&fo->cv, NULL);
    pthread_cond_init(&fo->done_cv, NULL);
    int rc = 0;
    for (int k = 0; k < lanes; k++) {
        fanout_lane_t *ln = &fo->lanes[k];
        ln->fo = fo;
        ln->index = k;
        rc = use_ring ? io_uring_queue_init(FANOUT_DEPTH, &ln->ring, 0) : -EOPNOTSUPP;
        ln->ring_ok = rc == 0;
        if (k > 0 && pthread_create(&fo->helpers[k - 1], NULL, fanout_helper_main, ln) != 0) {
            if (ln->ring_ok)
                io_uring_queue_exit(&ln->ring);
            break; /* fewer lanes */
        }
        fo->nlanes = k + 1;
    }
    if (rc != 0 && use_ring)
        log_info("fanout", "io_uring unavailable: answering with one send() per socket", LF_I("errno", -rc));
    return fo;
}

void fanout_free(fanout_t *fo)
{
    if (!fo)
        return;
    pthread_mutex_lock(&fo->mu);
    fo->stop = true;
    pthread_cond_broadcast(&fo->cv);
    pthread_mutex_unlock(&fo->mu);
    for (int k = 1; k < fo->nlanes; k++)
        pthread_join(fo->helpers[k - 1], NULL);
    for (int k = 0; k < fo->nlanes; k++)
        if (fo->lanes[k].ring_ok)
            io_uring_queue_exit(&fo->lanes[k].ring);
    pthread_mutex_destroy(&fo->mu);
    pthread_cond_destroy(&fo->cv);
    pthread_cond_destroy(&fo->done_cv);
    free(fo->lanes);
    free(fo->helpers);
    free(fo);
}

bool fanout_batched(const fanout_t *fo)
{
    return fo && fo->lanes[0].ring_ok;
}

/* Keeps the helpers off the CPU the caller is on (see allowed): one affinity call per helper,
 * only when the caller has moved since the last split. */
static void fanout_place_helpers(fanout_t *fo)
{
    int cpu = sched_getcpu();
    if (cpu < 0 || cpu == fo->placed_cpu || cpu >= CPU_SETSIZE || CPU_COUNT(&fo->allowed) < 2)
        return;
    cpu_set_t set = fo->allowed;
    CPU_CLR(cpu, &set);
    if (CPU_COUNT(&set) == 0)
        return; /* the caller runs outside the set it started with: leave the helpers be */
    int failed = 0;
    for (int k = 1; k < fo->nlanes; k++)
        failed |= pthread_setaffinity_np(fo->helpers[k - 1], sizeof(set), &set);
    /* a set that no longer fits (the cgroup's CPUs changed) is tried again next time, harmlessly */
    fo->placed_cpu = failed ? -1 : cpu;
}

void fanout_send(fanout_t *fo, const int *fds, size_t n, const void *buf, size_t len, ssize_t *res)
{
    for (size_t i = 0; i < n; i++)
        res[i] = FANOUT_UNSET;
    int parts = n >= FANOUT_SPLIT ? fo->nlanes : 1;
    fo->job = (fanout_job_t){.fds = fds, .n = n, .buf = buf, .len = len, .res = res, .parts = parts};
    if (parts > 1) {
        fanout_place_helpers(fo);
        pthread_mutex_lock(&fo->mu);
        fo->pending = fo->nlanes - 1;
        fo->gen++;
        pthread_cond_broadcast(&fo->cv);
        pthread_mutex_unlock(&fo->mu);
    }
    fanout_lane_run(fo, 0);
    if (parts > 1) {
        pthread_mutex_lock(&fo->mu);
        while (fo->pending > 0)
            pthread_cond_wait(&fo->done_cv, &fo->mu);
        pthread_mutex_unlock(&fo->mu);
    }
}
