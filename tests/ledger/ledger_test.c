/* ledger_test.c - a harness that drives native/common/ledger.c directly (no Python, no CUDA).
 *
 *   cc -std=gnu11 -O2 -Wall -Wextra -D_GNU_SOURCE -pthread -Inative/include \
 *      tests/ledger/ledger_test.c native/common/ledger.c native/common/procstat.c -o ledger_test
 *   ./ledger_test DIR hammer [PROCS THREADS ITERS]
 *   ./ledger_test DIR kill | reuse | saturate | security | fork | full | adopt | all
 *
 * Each case prints "ok <case> ..." and exits 0, or prints "FAIL ..." and exits 1.
 * tests/integration/test_ledger.py builds and runs it.
 */
#include "hammer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *dir;
static char errbuf[512];

static void path_of(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s.ledger", dir, name);
}

static ct_ledger *make(const char *name, uint64_t limit0, uint64_t limit1)
{
    char p[4096];
    path_of(p, sizeof p, name);
    unlink(p);
    struct ct_ledger_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.limit[0] = limit0;
    cfg.limit[1] = limit1;
    snprintf(cfg.group, sizeof cfg.group, "%s", name);
    int32_t created = 0;
    ct_ledger *l = ct_ledger_create(p, &cfg, &created, errbuf, sizeof errbuf);
    CHECK(l, "create %s: %s", p, errbuf);
    CHECK(created == 1, "created flag");
    return l;
}

static ct_ledger *reopen(const char *name)
{
    char p[4096];
    path_of(p, sizeof p, name);
    ct_ledger *l = ct_ledger_open(p, 0, errbuf, sizeof errbuf);
    CHECK(l, "open %s: %s", p, errbuf);
    return l;
}

/* ---- hammer: many processes x threads, never over the limit -------------------------------- */

static int case_hammer(int procs, int threads, int n)
{
    h_total = procs * threads, h_iters = n;
    hs = shared_mem(sizeof *hs);
    ct_ledger *l = make("hammer", hlimit[0], hlimit[1]);
    double t0 = now_s();
    pid_t kids[64];
    for (int p = 0; p < procs; p++) {
        pid_t k = fork();
        CHECK(k >= 0, "fork");
        if (k == 0) {
            hl = reopen("hammer");
            CHECK(ct_ledger_join(hl, getpid(), 0) >= 0, "join");
            pthread_t t[256];
            for (int i = 0; i < threads; i++)
                pthread_create(&t[i], NULL, hammer_thread, (void *)(uintptr_t)(p * 1000 + i + 1));
            for (int i = 0; i < threads; i++)
                pthread_join(t[i], NULL);
            /* half the processes leave, half just exit (their slot is reclaimed) */
            if (p % 2 == 0)
                CHECK(ct_ledger_leave(hl) == CT_LEDGER_OK, "leave");
            _exit(0);
        }
        kids[p] = k;
    }
    for (int p = 0; p < procs; p++) {
        int st;
        waitpid(kids[p], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d status %d", p, st);
    }
    double dt = now_s() - t0;
    hammer_verify();
    for (int d = 0; d < 2; d++)
        CHECK(ct_ledger_in_use(l, d) == 0, "in_use %llu after the run",
              (unsigned long long)ct_ledger_in_use(l, d));
    static struct ct_ledger_view v;
    CHECK(ct_ledger_snapshot(l, &v) == 0, "snapshot");
    /* those that exited without leaving, unless another process reclaimed them already */
    CHECK(v.nmembers <= (uint32_t)procs / 2, "%u members left", v.nmembers);
    for (uint32_t i = 0; i < v.nmembers; i++)
        CHECK(v.members[i].alive == CT_LEDGER_DEAD, "exited member not seen dead");
    CHECK(ct_ledger_reclaim(l) == (int)v.nmembers, "reclaim the members that exited without leaving");
    CHECK(ct_ledger_snapshot(l, &v) == 0 && v.nmembers == 0, "%u members left", v.nmembers);
    CHECK(v.peak[0] <= hlimit[0] && v.peak[1] <= hlimit[1], "ledger peak over the limit");
    CHECK(v.denials[0] + v.denials[1] == hs->denials, "denial counters");
    printf("ok hammer procs=%d threads=%d iters=%d grants=%llu denials=%llu max0=%.2f/%.0f MiB "
           "max1=%.2f/%.0f MiB peak0=%.2f MiB %.2fs\n",
           procs, threads, n, (unsigned long long)hs->grants, (unsigned long long)hs->denials,
           hs->max[0] / (double)MiB, hlimit[0] / (double)MiB, hs->max[1] / (double)MiB,
           hlimit[1] / (double)MiB, v.peak[0] / (double)MiB, dt);
    ct_ledger_close(l);
    return 0;
}

/* ---- kill: a SIGKILLed member's bytes come back -------------------------------------------- */

static pid_t holder(const char *name, int dev, uint64_t bytes)
{
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t k = fork();
    CHECK(k >= 0, "fork");
    if (k == 0) {
        close(fds[0]);
        ct_ledger *l = reopen(name);
        CHECK(ct_ledger_join(l, getpid(), 0) >= 0, "join");
        char c = ct_ledger_reserve(l, dev, bytes, NULL, NULL) == CT_LEDGER_GRANTED ? 'y' : 'n';
        CHECK(write(fds[1], &c, 1) == 1, "write");
        for (;;)
            pause();
    }
    close(fds[1]);
    char c = 0;
    CHECK(read(fds[0], &c, 1) == 1, "read");
    close(fds[0]);
    CHECK(c == 'y', "holder's reserve denied");
    return k;
}

static int case_kill(void)
{
    ct_ledger *l = make("kill", 100 * MiB, 0);
    CHECK(ct_ledger_join(l, getpid(), 0) >= 0, "join");
    pid_t k = holder("kill", 0, 60 * MiB);
    CHECK(ct_ledger_in_use(l, 0) == 60 * MiB, "in_use");
    uint64_t in_use = 0, limit = 0;
    CHECK(ct_ledger_reserve(l, 0, 60 * MiB, &in_use, &limit) == CT_LEDGER_DENIED, "should deny");
    CHECK(in_use == 60 * MiB && limit == 100 * MiB, "denial figures %llu %llu",
          (unsigned long long)in_use, (unsigned long long)limit);
    /* killed and left a zombie (not reaped): a denial-bound reserve reclaims it at once */
    kill(k, SIGKILL);
    usleep(50000);
    CHECK(ct_ledger_reserve(l, 0, 60 * MiB, &in_use, NULL) == CT_LEDGER_GRANTED,
          "dead member's bytes not reclaimed before the denial");
    CHECK(in_use == 60 * MiB, "in_use %llu", (unsigned long long)in_use);
    waitpid(k, NULL, 0);
    CHECK(ct_ledger_release(l, 0, 60 * MiB) == 1, "release");

    /* no denial needed: the periodic reclaim brings them back within a second */
    k = holder("kill", 0, 30 * MiB);
    CHECK(ct_ledger_in_use(l, 0) == 30 * MiB, "in_use");
    kill(k, SIGKILL);
    waitpid(k, NULL, 0);
    double t0 = now_s();
    while (ct_ledger_in_use(l, 0) != 0 && now_s() - t0 < 3)
        usleep(10000);
    double dt = now_s() - t0;
    CHECK(ct_ledger_in_use(l, 0) == 0, "bytes of a killed member still counted after %.2fs", dt);
    CHECK(dt < 1.2, "reclaim took %.2fs", dt);
    static struct ct_ledger_view v;
    ct_ledger_snapshot(l, &v);
    CHECK(v.reclaimed >= 2, "reclaimed %llu", (unsigned long long)v.reclaimed);
    printf("ok kill periodic-reclaim=%.2fs\n", dt);
    ct_ledger_leave(l);
    ct_ledger_close(l);
    return 0;
}

/* ---- reuse: a slot recorded for another process (start ticks / dead pid) is not inherited -- */

static int case_reuse(void)
{
    ct_ledger *l = make("reuse", 64 * MiB, 0);
    ct_ledger *fake = reopen("reuse");
    uint64_t real = ct_ledger_proc_start_ticks(getpid());
    CHECK(real != 0, "no start ticks for ourselves");
    /* our pid, but the start time of another process: the pid was reused by us */
    CHECK(ct_ledger_join(fake, getpid(), real + 12345) >= 0, "join fake");
    CHECK(ct_ledger_reserve(fake, 0, 40 * MiB, NULL, NULL) == CT_LEDGER_GRANTED, "reserve");
    CHECK(ct_ledger_join(l, getpid(), 0) >= 0, "join");
    CHECK(ct_ledger_slot(l) != ct_ledger_slot(fake), "same slot");
    CHECK(ct_ledger_held(l, 0) == 0, "inherited %llu", (unsigned long long)ct_ledger_held(l, 0));
    static struct ct_ledger_view v;
    ct_ledger_snapshot(l, &v);
    CHECK(v.nmembers == 2 && v.dead_held[0] == 40 * MiB && v.in_use[0] == 0, "snapshot: %u %llu %llu",
          v.nmembers, (unsigned long long)v.dead_held[0], (unsigned long long)v.in_use[0]);
    CHECK(ct_ledger_reclaim(l) == 1, "reclaim");
    CHECK(ct_ledger_in_use(l, 0) == 0, "in_use after reclaim");
    CHECK(ct_ledger_reserve(fake, 0, 1, NULL, NULL) == CT_LEDGER_ENOTMEMBER, "reclaimed handle still works");

    /* a pid that is gone */
    pid_t k = fork();
    if (k == 0)
        _exit(0);
    waitpid(k, NULL, 0);
    CHECK(ct_ledger_join(fake, k, 777) >= 0, "join dead");
    CHECK(ct_ledger_reserve(fake, 0, 50 * MiB, NULL, NULL) == CT_LEDGER_GRANTED, "reserve");
    CHECK(ct_ledger_reserve(l, 0, 50 * MiB, NULL, NULL) == CT_LEDGER_GRANTED, "dead pid's bytes kept");
    CHECK(ct_ledger_in_use(l, 0) == 50 * MiB, "in_use");
    /* joining again from a new image of the same process evicts the old slot */
    ct_ledger *again = reopen("reuse");
    CHECK(ct_ledger_join(again, getpid(), 0) >= 0, "rejoin");
    CHECK(ct_ledger_in_use(again, 0) == 0, "the earlier image's slot survived an exec-like rejoin");
    CHECK(ct_ledger_reserve(l, 0, 1, NULL, NULL) == CT_LEDGER_ENOTMEMBER, "evicted handle");
    printf("ok reuse\n");
    ct_ledger_close(again);
    ct_ledger_close(fake);
    ct_ledger_close(l);
    return 0;
}

/* ---- saturate, arguments ------------------------------------------------------------------- */

static int case_saturate(void)
{
    ct_ledger *l = make("saturate", 10 * MiB, 0);
    CHECK(ct_ledger_reserve(l, 0, 1, NULL, NULL) == CT_LEDGER_ENOTMEMBER, "reserve before join");
    CHECK(ct_ledger_join(l, getpid(), 0) >= 0, "join");
    CHECK(ct_ledger_reserve(l, 0, 100, NULL, NULL) == 1, "reserve");
    CHECK(ct_ledger_release(l, 0, 300) == 0, "release more than held must clamp");
    CHECK(ct_ledger_held(l, 0) == 0 && ct_ledger_in_use(l, 0) == 0, "held after clamp");
    CHECK(ct_ledger_release(l, 1, 5) == 0, "release on an untouched device");
    CHECK(ct_ledger_in_use(l, 1) == 0, "in_use dev1");
    CHECK(ct_ledger_reserve(l, 0, 11 * MiB, NULL, NULL) == 0, "bigger than the limit");
    CHECK(ct_ledger_reserve(l, 0, 10 * MiB, NULL, NULL) == 1, "exactly the limit");
    CHECK(ct_ledger_reserve(l, 0, 1, NULL, NULL) == 0, "one byte over");
    CHECK(ct_ledger_reserve(l, 0, 0, NULL, NULL) == 1, "zero bytes");
    CHECK(ct_ledger_force(l, 0, 5) == 0, "force over");
    CHECK(ct_ledger_in_use(l, 0) == 10 * MiB + 5, "force counted");
    CHECK(ct_ledger_release(l, 0, 10 * MiB + 5) == 1, "release");
    CHECK(ct_ledger_force(l, 0, 5) == 1, "force within");
    CHECK(ct_ledger_release(l, 0, UINT64_MAX) == 0, "huge release");
    CHECK(ct_ledger_reserve(l, 3, UINT64_MAX, NULL, NULL) == 1, "unlimited device");
    CHECK(ct_ledger_in_use(l, 3) == UINT64_MAX, "huge held");
    CHECK(ct_ledger_release(l, 3, UINT64_MAX) == 1, "release");
    CHECK(ct_ledger_reserve(l, -1, 1, NULL, NULL) == CT_LEDGER_ENODEV, "dev -1");
    CHECK(ct_ledger_reserve(l, CT_LEDGER_MAX_DEVICES, 1, NULL, NULL) == CT_LEDGER_ENODEV, "dev 16");
    CHECK(ct_ledger_reserve(NULL, 0, 1, NULL, NULL) == CT_LEDGER_EINVAL, "NULL");
    CHECK(ct_ledger_release(NULL, 0, 1) == CT_LEDGER_EINVAL, "NULL");
    CHECK(ct_ledger_force(NULL, 0, 1) == CT_LEDGER_EINVAL, "NULL");
    CHECK(ct_ledger_join(NULL, 1, 0) == CT_LEDGER_EINVAL, "NULL");
    CHECK(ct_ledger_join(l, 0, 0) == CT_LEDGER_EINVAL, "pid 0");
    CHECK(ct_ledger_leave(NULL) == CT_LEDGER_EINVAL, "NULL");
    CHECK(ct_ledger_snapshot(NULL, NULL) == CT_LEDGER_EINVAL, "NULL");
    CHECK(ct_ledger_snapshot(l, NULL) == CT_LEDGER_EINVAL, "NULL");
    CHECK(ct_ledger_in_use(NULL, 0) == 0 && ct_ledger_limit(NULL, 0) == 0, "NULL");
    CHECK(ct_ledger_reclaim(NULL) == CT_LEDGER_EINVAL, "NULL");
    CHECK(ct_ledger_open(NULL, 1, NULL, 0) == NULL, "NULL path");
    ct_ledger_close(NULL);
    CHECK(ct_ledger_set_limit(l, 0, 1 * MiB) == 0 && ct_ledger_limit(l, 0) == 1 * MiB, "set_limit");
    CHECK(ct_ledger_leave(l) == 0, "leave");
    CHECK(ct_ledger_leave(l) == CT_LEDGER_ENOTMEMBER, "leave twice");
    printf("ok saturate\n");
    ct_ledger_close(l);
    return 0;
}

/* ---- security: what open refuses ----------------------------------------------------------- */

static void expect_refused(const char *p, const char *needle)
{
    errbuf[0] = 0;
    ct_ledger *l = ct_ledger_open(p, 0, errbuf, sizeof errbuf);
    CHECK(l == NULL, "%s was accepted", p);
    CHECK(strstr(errbuf, needle), "%s: message '%s' lacks '%s'", p, errbuf, needle);
    l = ct_ledger_open(p, 1, errbuf, sizeof errbuf);
    CHECK(l == NULL, "%s was accepted with create", p);
}

static int case_security(void)
{
    char good[4096], p[4096];
    ct_ledger *l = make("good", 1, 0);
    ct_ledger_close(l);
    path_of(good, sizeof good, "good");

    path_of(p, sizeof p, "link");
    unlink(p);
    CHECK(symlink(good, p) == 0, "symlink");
    expect_refused(p, "symbolic link");

    CHECK(chmod(good, 0644) == 0, "chmod");
    expect_refused(good, "group/other permissions");
    CHECK(chmod(good, 0600) == 0, "chmod");
    l = ct_ledger_open(good, 0, errbuf, sizeof errbuf);
    CHECK(l, "0600 refused: %s", errbuf);
    ct_ledger_close(l);

    path_of(p, sizeof p, "magic");
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, CT_LEDGER_FILE_SIZE) == 0 && write(fd, "NOTALEDGER", 10) == 10, "write");
    close(fd);
    expect_refused(p, "bad magic");

    path_of(p, sizeof p, "short");
    fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, "hello", 5) == 5, "write");
    close(fd);
    expect_refused(p, "not a ledger");

    path_of(p, sizeof p, "adir");
    mkdir(p, 0700);
    expect_refused(p, "");

    if (geteuid() == 0) {
        path_of(p, sizeof p, "foreign");
        unlink(p);
        l = make("foreign", 1, 0);
        ct_ledger_close(l);
        CHECK(chown(p, 12345, 12345) == 0, "chown");
        expect_refused(p, "owned by uid 12345");
    }
    printf("ok security\n");
    return 0;
}

/* ---- fork: the child joins again and never touches the parent's slot ---------------------- */

static int case_fork(void)
{
    ct_ledger *l = make("fork", 0, 0);
    CHECK(ct_ledger_join(l, getpid(), 0) >= 0, "join");
    CHECK(ct_ledger_reserve(l, 0, 10, NULL, NULL) == 1, "reserve");
    int parent_slot = ct_ledger_slot(l);
    pid_t k = fork();
    if (k == 0) {
        /* what a pthread_atfork child handler does */
        int s = ct_ledger_join(l, getpid(), 0);
        CHECK(s >= 0 && s != parent_slot, "child slot %d parent %d", s, parent_slot);
        CHECK(ct_ledger_held(l, 0) == 0, "child inherited bytes");
        CHECK(ct_ledger_reserve(l, 0, 5, NULL, NULL) == 1, "child reserve");
        CHECK(ct_ledger_in_use(l, 0) == 15, "in_use in child");
        CHECK(ct_ledger_leave(l) == 0, "child leave");
        _exit(0);
    }
    int st;
    waitpid(k, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed");
    CHECK(ct_ledger_in_use(l, 0) == 10 && ct_ledger_held(l, 0) == 10, "parent's bytes changed");
    /* a child that never rejoins cannot release the parent's slot by leaving */
    k = fork();
    if (k == 0)
        _exit(ct_ledger_leave(l) == CT_LEDGER_ENOTMEMBER ? 0 : 1);
    waitpid(k, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "inherited leave was allowed");
    CHECK(ct_ledger_in_use(l, 0) == 10, "parent's slot lost");
    CHECK(ct_ledger_join(l, getpid(), 0) == parent_slot, "join twice is idempotent");
    printf("ok fork\n");
    ct_ledger_leave(l);
    ct_ledger_close(l);
    return 0;
}

/* ---- full: 256 live members, the 257th is refused until one dies --------------------------- */

static int case_full(void)
{
    ct_ledger *l = make("full", 0, 0);
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    static pid_t kids[CT_LEDGER_MAX_MEMBERS];
    for (int i = 0; i < CT_LEDGER_MAX_MEMBERS; i++) {
        pid_t k = fork();
        CHECK(k >= 0, "fork %d", i);
        if (k == 0) {
            close(fds[0]);
            char c = ct_ledger_join(l, getpid(), 0) >= 0 ? 'y' : 'n';
            if (c == 'y')
                ct_ledger_reserve(l, 0, 1, NULL, NULL);
            if (write(fds[1], &c, 1) != 1)
                _exit(1);
            for (;;)
                pause();
        }
        kids[i] = k;
    }
    close(fds[1]);
    int yes = 0;
    for (int i = 0; i < CT_LEDGER_MAX_MEMBERS; i++) {
        char c;
        CHECK(read(fds[0], &c, 1) == 1, "read");
        yes += c == 'y';
    }
    close(fds[0]);
    CHECK(yes == CT_LEDGER_MAX_MEMBERS, "%d of %d joined", yes, CT_LEDGER_MAX_MEMBERS);
    CHECK(ct_ledger_in_use(l, 0) == CT_LEDGER_MAX_MEMBERS, "in_use");
    CHECK(ct_ledger_join(l, getpid(), 0) == CT_LEDGER_EFULL, "joined a full ledger");
    kill(kids[17], SIGKILL);
    waitpid(kids[17], NULL, 0);
    CHECK(ct_ledger_join(l, getpid(), 0) >= 0, "no slot after a member died");
    for (int i = 0; i < CT_LEDGER_MAX_MEMBERS; i++)
        if (i != 17)
            kill(kids[i], SIGKILL);
    for (int i = 0; i < CT_LEDGER_MAX_MEMBERS; i++)
        if (i != 17)
            waitpid(kids[i], NULL, 0);
    CHECK(ct_ledger_reclaim(l) == CT_LEDGER_MAX_MEMBERS - 1, "reclaim all");
    CHECK(ct_ledger_in_use(l, 0) == 0, "in_use");
    printf("ok full\n");
    ct_ledger_close(l);
    return 0;
}

/* ---- adopt: the group rule under a race. 16 rounds; in each, 16 processes (half asking 1 GiB,
 * half 2 GiB) join a memberless group of 3 GiB at once, each adopts and stays. Every one told
 * OK asks the budget the group ends with; every other was refused for a conflict (or a token
 * held past a second: EBUSY); at least one is told OK. --------------------------------------- */

static int case_adopt(void)
{
    enum { N = 16 };
    for (int round = 0; round < 16; round++) {
        ct_ledger *l = make("adopt", 3072 * MiB, 0);
        uint64_t all = 3072 * MiB;
        for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
            ct_ledger_set_limit(l, d, all);
        int fds[2], go[2];
        CHECK(pipe(fds) == 0 && pipe(go) == 0, "pipe");
        pid_t kids[N];
        for (int i = 0; i < N; i++) {
            pid_t k = fork();
            CHECK(k >= 0, "fork");
            if (k == 0) {
                uint64_t want[CT_LEDGER_MAX_DEVICES];
                for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
                    want[d] = (uint64_t)(1 + i % 2) * 1024 * MiB;
                char c;
                close(go[1]);
                if (read(go[0], &c, 1) != 0) /* EOF: all start together */
                    _exit(1);
                int32_t joined = ct_ledger_join(l, getpid(), 0), rc = -99;
                if (joined >= 0)
                    rc = ct_ledger_adopt(l, want, NULL, errbuf, sizeof errbuf);
                char r = rc == CT_LEDGER_OK ? (char)('1' + i % 2)
                         : rc == CT_LEDGER_ECONFLICT || rc == CT_LEDGER_EBUSY ? 'x'
                                                                               : '?';
                if (rc != CT_LEDGER_OK && joined >= 0)
                    ct_ledger_leave(l);
                if (write(fds[1], &r, 1) != 1)
                    _exit(1);
                for (;;)
                    pause();
            }
            kids[i] = k;
        }
        close(go[0]);
        close(go[1]);
        close(fds[1]);
        int ok1 = 0, ok2 = 0;
        for (int i = 0; i < N; i++) {
            char c;
            CHECK(read(fds[0], &c, 1) == 1, "read");
            CHECK(c != '?', "round %d: an unexpected answer", round);
            ok1 += c == '1';
            ok2 += c == '2';
        }
        close(fds[0]);
        uint64_t fin = ct_ledger_limit(l, 0);
        CHECK(ok1 + ok2 > 0, "round %d: no one was told OK", round);
        CHECK(!(ok1 && ok2), "round %d: %d told OK under 1 GiB, %d under 2 GiB", round, ok1, ok2);
        CHECK(fin == (uint64_t)(ok1 ? 1 : 2) * 1024 * MiB, "round %d: final %llu", round,
              (unsigned long long)fin);
        for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
            CHECK(ct_ledger_limit(l, d) == fin, "device %d differs", d);
        for (int i = 0; i < N; i++)
            kill(kids[i], SIGKILL);
        for (int i = 0; i < N; i++)
            waitpid(kids[i], NULL, 0);
        ct_ledger_close(l);
    }
    printf("ok adopt\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR hammer|kill|reuse|saturate|security|fork|full|adopt|all [...]\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    const char *c = argv[2];
    int all = strcmp(c, "all") == 0;
    setvbuf(stdout, NULL, _IONBF, 0);
    if (all || strcmp(c, "hammer") == 0)
        case_hammer(argc > 3 ? atoi(argv[3]) : 4, argc > 4 ? atoi(argv[4]) : 32,
                    argc > 5 ? atoi(argv[5]) : 2000);
    if (all || strcmp(c, "kill") == 0)
        case_kill();
    if (all || strcmp(c, "reuse") == 0)
        case_reuse();
    if (all || strcmp(c, "saturate") == 0)
        case_saturate();
    if (all || strcmp(c, "security") == 0)
        case_security();
    if (all || strcmp(c, "fork") == 0)
        case_fork();
    if (all || strcmp(c, "full") == 0)
        case_full();
    if (all || strcmp(c, "adopt") == 0)
        case_adopt();
    return 0;
}
