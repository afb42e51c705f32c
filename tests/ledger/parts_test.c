/* parts_test.c - a group of several users in a shared ledger directory, driven through the
 * ledger's own C (native/common/ledger*.c, no Python, no CUDA). Runs as root: each user is a
 * child that drops to a uid of its own (setuid), as the jobs of two users on one GPU are.
 *
 *   cc -std=gnu11 -O2 -Wall -Wextra -D_GNU_SOURCE -pthread -Inative/include \
 *      tests/ledger/parts_test.c native/common/ledger*.c native/common/procstat.c -o parts_test
 *   ./parts_test DIR hammer [USERS PROCS THREADS ITERS [late]]   the group's limit holds across
 *                               users (late: they arrive while the others reserve)
 *   ./parts_test DIR late       hammer 4 2 4 3000 late
 *   ./parts_test DIR forked     late users, each a process whose two forked children share its
 *                               handle (the directory's description with it)
 *   ./parts_test DIR damage     one user truncates, grows, garbles, replaces its own part and
 *                               tries another's: the other user's member runs on, counted
 *   ./parts_test DIR agent      the node agent's figures, written with pwrite, count
 *   ./parts_test DIR setuid     a member that joined as root and runs as another uid since
 *                               keeps its part (its file is still the one it opened)
 *   ./parts_test DIR bench      ns per reserve+release pair: a private directory, a shared one
 *                               alone, beside 1 and 4 other users' parts
 *
 * Each case prints "ok <case> ..." and exits 0, or prints "FAIL ..." and exits 1.
 * tests/integration/test_ledger_damage.py builds and runs it. */
#include "hammer.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define UID0 61001u /* the users of the test: UID0, UID0 + 1, ... */

static const char *dir;
static char shared[2048];
static char errbuf[512];

/* what the members report (ct_ledger_set_report), counted for the checks */
struct said {
    uint32_t fatal, notes;
    char last[400];
};
static struct said *said; /* shared with the parent */

static void report(int32_t fatal, const char *msg)
{
    __atomic_fetch_add(fatal ? &said->fatal : &said->notes, 1, __ATOMIC_SEQ_CST);
    snprintf(said->last, sizeof said->last, "%s", msg);
}

static void make_shared_dir(void)
{
    CHECK(geteuid() == 0, "needs root: each user is a child with a uid of its own");
    snprintf(shared, sizeof shared, "%.1900s/shared", dir);
    mkdir(shared, 0755);
    CHECK(chmod(shared, 01777) == 0, "chmod %s", shared);
}

static void part_path(char *buf, size_t n, const char *group, unsigned uid)
{
    snprintf(buf, n, "%s/%s@%u.ledger", shared, group, uid);
}

/* become uid (a child of the test), as a job's process is that user's */
static void become(unsigned uid)
{
    CHECK(setgroups(0, NULL) == 0 && setgid(uid) == 0 && setuid(uid) == 0, "setuid %u", uid);
    prctl(PR_SET_DUMPABLE, 1); /* as a process exec'd by that user: its /proc is its own */
}

/* this user's part of group, made with the group's limits when missing, joined */
static ct_ledger *member_of(const char *group, uint64_t lim0, uint64_t lim1)
{
    char p[4096];
    part_path(p, sizeof p, group, (unsigned)geteuid());
    struct ct_ledger_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.limit[0] = lim0;
    cfg.limit[1] = lim1;
    snprintf(cfg.group, sizeof cfg.group, "%s", group);
    ct_ledger *l = ct_ledger_create(p, &cfg, NULL, errbuf, sizeof errbuf);
    CHECK(l, "create %s: %s", p, errbuf);
    CHECK(ct_ledger_join(l, getpid(), 0) >= 0, "join");
    return l;
}

/* ---- hammer: users x processes x threads against one limit ----------------------------------- */

static int h_forked; /* the users' processes inherit their handle over fork (as the shim's) */

/* this process's threads hammer its handle; then it checks what it saw, leaves, exits */
static void hammer_threads(unsigned uid, int threads, int users)
{
    pthread_t t[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, hammer_thread, (void *)(uintptr_t)(uid * 1000 + i + 1));
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    uint32_t parts = (uint32_t)ct_ledger_other_parts(hl);
    CHECK(parts == (uint32_t)users - 1, "sees %u other parts, not %d", parts, users - 1);
    ct_ledger_leave(hl);
    _exit(0);
}

static void hammer_child(unsigned uid, int threads, int users)
{
    become(uid);
    hl = member_of("hammer", hlimit[0], hlimit[1]);
    if (!h_forked)
        hammer_threads(uid, threads, users);
    /* two children on this process's handle: its directory's description with it */
    ct_ledger_leave(hl);
    pid_t k[2];
    for (int i = 0; i < 2; i++)
        if ((k[i] = fork()) == 0) {
            CHECK(ct_ledger_join(hl, getpid(), 0) >= 0, "join in the child");
            hammer_threads(uid, threads, users);
        }
    for (int i = 0; i < 2; i++) {
        int st;
        waitpid(k[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "forked child status %d", st);
    }
    _exit(0);
}

static int case_hammer(int users, int procs, int threads, int iters, int late)
{
    h_late = late;
    make_shared_dir();
    hs = shared_mem(sizeof *hs);
    h_total = users * procs * threads * (h_forked ? 2 : 1);
    h_iters = iters;
    double t0 = now_s();
    pid_t kids[256];
    int nk = 0;
    /* the users start one after another: later ones' parts appear while others reserve */
    for (int p = 0; p < procs; p++)
        for (int u = 0; u < users; u++) {
            pid_t k = fork();
            CHECK(k >= 0, "fork");
            if (k == 0)
                hammer_child(UID0 + (unsigned)u, threads, users);
            kids[nk++] = k;
            if (late)
                usleep(2000 + (unsigned)(k % 7) * 1000); /* parts appear while others reserve */
        }
    for (int i = 0; i < nk; i++) {
        int st;
        waitpid(kids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d status %d", i, st);
    }
    hammer_verify();
    printf("ok %s users=%d procs=%d threads=%d iters=%d grants=%llu denials=%llu "
           "max0=%.2f/%.0f MiB max1=%.2f/%.0f MiB %.2fs\n",
           h_forked ? "forked (children on their parent's handle)"
           : late   ? "late (users arrive while others reserve)"
                    : "hammer",
           users, procs, threads, iters, (unsigned long long)hs->grants,
           (unsigned long long)hs->denials, hs->max[0] / (double)MiB, hlimit[0] / (double)MiB,
           hs->max[1] / (double)MiB, hlimit[1] / (double)MiB, now_s() - t0);
    return 0;
}

/* ---- damage: one user damages what it can; the other's member runs on ---------------------- */

struct dsh {
    uint32_t step, stop;
    uint32_t b_rounds, b_errors, a_damaged;
    uint64_t b_in_use; /* what B's last reservation saw in use (its own 10 MiB and more) */
    char b_err[300];
};
static struct dsh *ds;

/* B: holds 10 MiB and reserves 1 MiB more, again and again, until told to stop */
static void member_b(void)
{
    become(UID0 + 1);
    ct_ledger_set_report(report);
    ct_ledger *l = member_of("g", 100 * MiB, 0);
    CHECK(ct_ledger_reserve(l, 0, 10 * MiB, NULL, NULL) == CT_LEDGER_GRANTED, "B's 10 MiB");
    while (!__atomic_load_n(&ds->stop, __ATOMIC_SEQ_CST)) {
        uint64_t in_use = 0;
        int r = ct_ledger_reserve(l, 0, MiB, &in_use, NULL);
        if (r == CT_LEDGER_GRANTED) {
            __atomic_store_n(&ds->b_in_use, in_use, __ATOMIC_SEQ_CST);
            ct_ledger_release(l, 0, MiB);
        } else {
            __atomic_fetch_add(&ds->b_errors, 1, __ATOMIC_SEQ_CST);
            snprintf(ds->b_err, sizeof ds->b_err, "rc %d: %s", r, ct_ledger_damage(l));
        }
        __atomic_fetch_add(&ds->b_rounds, 1, __ATOMIC_SEQ_CST);
        usleep(2000);
    }
    _exit(0);
}

/* A's member: holds 20 MiB, then (its part garbled under it) is refused, said once */
static void member_a(void)
{
    become(UID0);
    ct_ledger_set_report(report);
    ct_ledger *l = member_of("g", 100 * MiB, 0);
    CHECK(ct_ledger_reserve(l, 0, 20 * MiB, NULL, NULL) == CT_LEDGER_GRANTED, "A's 20 MiB");
    __atomic_store_n(&ds->step, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&ds->step, __ATOMIC_SEQ_CST) < 2)
        usleep(1000);
    /* its own part was garbled: within a second of checks its calls are refused, said once */
    double t0 = now_s();
    int r = 0;
    while ((r = ct_ledger_reserve(l, 0, MiB, NULL, NULL)) != CT_LEDGER_EDAMAGED &&
           now_s() - t0 < 3) {
        if (r == CT_LEDGER_GRANTED)
            ct_ledger_release(l, 0, MiB);
        usleep(10000);
    }
    CHECK(r == CT_LEDGER_EDAMAGED, "A's member was not refused: %d", r);
    CHECK(ct_ledger_reserve(l, 0, MiB, NULL, NULL) == CT_LEDGER_EDAMAGED, "refused again");
    CHECK(strstr(ct_ledger_damage(l), "changed under its members"), "%s", ct_ledger_damage(l));
    __atomic_store_n(&ds->a_damaged, 1, __ATOMIC_SEQ_CST);
    _exit(0); /* (a truncation of its own file would kill it: its own user's doing) */
}

/* the parent, as a reader (the agent, status): a damaged part is refused, never read as one */
static void reader_refuses(const char *p, const char *what)
{
    errbuf[0] = 0;
    ct_ledger *r = ct_ledger_open_reader(p, errbuf, sizeof errbuf);
    if (r) { /* opened before: the snapshot refuses */
        static struct ct_ledger_view v;
        CHECK(ct_ledger_snapshot(r, &v) == CT_LEDGER_EDAMAGED, "%s: read as a ledger", what);
        CHECK(*ct_ledger_damage(r), "%s: no reason", what);
        ct_ledger_close(r);
        return;
    }
    CHECK(*errbuf, "%s: no reason", what);
}

/* wait until B has made n more rounds (it saw what was done) and is fine */
static void b_goes_on(const char *after)
{
    uint32_t from = __atomic_load_n(&ds->b_rounds, __ATOMIC_SEQ_CST);
    double t0 = now_s();
    while (__atomic_load_n(&ds->b_rounds, __ATOMIC_SEQ_CST) < from + 20 && now_s() - t0 < 10)
        usleep(2000);
    CHECK(__atomic_load_n(&ds->b_rounds, __ATOMIC_SEQ_CST) >= from + 20, "B stopped after %s",
          after);
    CHECK(ds->b_errors == 0, "B refused after %s: %s", after, ds->b_err);
}

/* as uid A: what it may do to its own part and cannot do to B's */
static void attacker(void (*step)(const char *a, const char *b))
{
    pid_t k = fork();
    CHECK(k >= 0, "fork");
    if (k == 0) {
        become(UID0);
        char a[4096], b[4096];
        part_path(a, sizeof a, "g", UID0);
        part_path(b, sizeof b, "g", UID0 + 1);
        step(a, b);
        _exit(0);
    }
    int st;
    waitpid(k, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "attacker status %d", st);
}

static void cannot_touch_b(const char *a, const char *b)
{
    CHECK(truncate(b, 0) != 0 && errno == EACCES, "truncated B's part");
    CHECK(open(b, O_RDWR) < 0 && errno == EACCES, "opened B's part for writing");
    CHECK(unlink(b) != 0, "removed B's part");
    CHECK(rename(a, b) != 0, "replaced B's part");
}

static void garble_own(const char *a, const char *b)
{
    (void)b;
    int fd = open(a, O_RDWR);
    CHECK(fd >= 0 && pwrite(fd, "GARBAGE!GARBAGE!", 16, 0) == 16, "garble");
    close(fd);
}

static void truncate_own(const char *a, const char *b)
{
    (void)b;
    CHECK(truncate(a, 0) == 0, "truncate own part");
}

static void grow_own(const char *a, const char *b)
{
    (void)b;
    CHECK(truncate(a, 3 * CT_LEDGER_FILE_SIZE) == 0, "grow own part");
}

static void fifo_own(const char *a, const char *b)
{
    (void)b;
    CHECK(unlink(a) == 0 && mkfifo(a, 0644) == 0, "a FIFO in its place");
}

static void link_own(const char *a, const char *b)
{
    CHECK(unlink(a) == 0 && symlink(b, a) == 0, "a link to B's part in its place");
}

static int case_damage(void)
{
    make_shared_dir();
    said = shared_mem(sizeof *said);
    ds = shared_mem(sizeof *ds);
    pid_t a = fork();
    CHECK(a >= 0, "fork");
    if (a == 0)
        member_a();
    while (!__atomic_load_n(&ds->step, __ATOMIC_SEQ_CST))
        usleep(1000);
    pid_t b = fork();
    CHECK(b >= 0, "fork");
    if (b == 0)
        member_b();
    b_goes_on("start");
    CHECK(ds->b_in_use == 31 * MiB, "B sees %llu in use, not A's 20 + its 10 + 1 MiB",
          (unsigned long long)ds->b_in_use);

    char pa[4096], pb[4096];
    part_path(pa, sizeof pa, "g", UID0);
    part_path(pb, sizeof pb, "g", UID0 + 1);
    attacker(cannot_touch_b);
    attacker(garble_own);
    __atomic_store_n(&ds->step, 2, __ATOMIC_SEQ_CST);
    int st;
    waitpid(a, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "A's member status %d", st);
    CHECK(ds->a_damaged && said->fatal == 1, "A's member said %u fatal lines", said->fatal);
    reader_refuses(pa, "garbled");
    b_goes_on("A garbled its part");
    CHECK(ds->b_in_use == 31 * MiB, "B lost A's last figure: %llu",
          (unsigned long long)ds->b_in_use);
    CHECK(said->notes == 1, "B said %u notes about A's part (once): %s", said->notes, said->last);

    static const struct {
        void (*step)(const char *, const char *);
        const char *what;
    } steps[] = {{truncate_own, "truncated"},
                 {grow_own, "grown"},
                 {fifo_own, "a FIFO"},
                 {link_own, "a symbolic link"}};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        attacker(steps[i].step);
        reader_refuses(pa, steps[i].what);
        b_goes_on(steps[i].what);
    }
    /* B's own part was never touched: a reader sees its 10 MiB */
    ct_ledger *r = ct_ledger_open_reader(pb, errbuf, sizeof errbuf);
    CHECK(r, "B's part: %s", errbuf);
    static struct ct_ledger_view v;
    CHECK(ct_ledger_snapshot(r, &v) == CT_LEDGER_OK && v.nmembers == 1, "B's part");
    CHECK(v.in_use[0] >= 10 * MiB && v.members[0].alive == CT_LEDGER_ALIVE, "B counted: %llu",
          (unsigned long long)v.in_use[0]);
    ct_ledger_close(r);
    __atomic_store_n(&ds->stop, 1, __ATOMIC_SEQ_CST);
    waitpid(b, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "B's member status %d (signal %d)", st,
          WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    printf("ok damage B rounds=%u, A refused once, B noted A's part once\n", ds->b_rounds);
    return 0;
}

/* ---- setuid: a member that drops its privileges keeps its part --------------------------- */

static int case_setuid(void)
{
    make_shared_dir();
    pid_t k = fork();
    CHECK(k >= 0, "fork");
    if (k == 0) { /* joins as root, then runs as another uid (a daemon dropping privileges) */
        ct_ledger *l = member_of("s", 100 * MiB, 0);
        CHECK(ct_ledger_reserve(l, 0, MiB, NULL, NULL) == CT_LEDGER_GRANTED, "as root");
        become(UID0);
        usleep(1200000); /* past the member's look at its own file */
        int r = ct_ledger_reserve(l, 0, MiB, NULL, NULL);
        CHECK(r == CT_LEDGER_GRANTED, "after setuid: %d (%s)", r, ct_ledger_damage(l));
        _exit(0);
    }
    int st;
    waitpid(k, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
    printf("ok setuid\n");
    return 0;
}

/* ---- agent: the node agent's figures, with pwrite, count for everyone ---------------------- */

static int case_agent(void)
{
    make_shared_dir();
    ds = shared_mem(sizeof *ds);
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0, "pipe");
    pid_t k = fork();
    CHECK(k >= 0, "fork");
    if (k == 0) { /* a member of another pid namespace, as the agent sees it */
        become(UID0);
        ct_ledger *l = member_of("g", 100 * MiB, 0);
        CHECK(ct_ledger_reserve(l, 0, 10 * MiB, NULL, NULL) == CT_LEDGER_GRANTED, "10 MiB");
        char c = 'r';
        CHECK(write(ready[1], &c, 1) == 1 && read(go[0], &c, 1) == 1, "pipe");
        uint64_t in_use = 0;
        CHECK(ct_ledger_reserve(l, 0, 1, &in_use, NULL) == CT_LEDGER_GRANTED, "reserve");
        CHECK(in_use == 40 * MiB + 1, "its context is not counted: %llu",
              (unsigned long long)in_use);
        CHECK(ct_ledger_reserve(l, 0, 61 * MiB, NULL, NULL) == CT_LEDGER_DENIED, "not denied");
        _exit(0);
    }
    char c;
    CHECK(read(ready[0], &c, 1) == 1, "ready");
    char p[4096];
    part_path(p, sizeof p, "g", UID0);
    int fd = open(p, O_RDWR);
    CHECK(fd >= 0, "open %s", p);
    ct_ledger *r = ct_ledger_open_fd(fd, p, errbuf, sizeof errbuf);
    close(fd);
    CHECK(r, "open_fd: %s", errbuf);
    static struct ct_ledger_view v;
    CHECK(ct_ledger_snapshot(r, &v) == CT_LEDGER_OK && v.nmembers == 1, "snapshot");
    const struct ct_ledger_member_view *m = &v.members[0];
    CHECK(ct_ledger_set_member_context(r, m->slot, m->pid, m->start_ticks + 1, 0, 1) ==
              CT_LEDGER_ENOTMEMBER,
          "another process's start time");
    CHECK(ct_ledger_set_member_context(r, m->slot, m->pid, m->start_ticks, 0, 30 * MiB) ==
              CT_LEDGER_OK,
          "set_member_context");
    CHECK(ct_ledger_snapshot(r, &v) == CT_LEDGER_OK, "snapshot");
    CHECK(v.in_use[0] == 40 * MiB && v.members[0].context[0] == 30 * MiB, "in use %llu",
          (unsigned long long)v.in_use[0]);
    ct_ledger_close(r);
    CHECK(write(go[1], &c, 1) == 1, "go");
    int st;
    waitpid(k, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "member status %d", st);
    printf("ok agent\n");
    return 0;
}

/* ---- bench: what a reservation costs beside other users' parts ------------------------------ */

static double pairs_ns(ct_ledger *l, int n)
{
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        CHECK(ct_ledger_reserve(l, 0, 4096, NULL, NULL) == CT_LEDGER_GRANTED, "reserve");
        ct_ledger_release(l, 0, 4096);
    }
    return (now_s() - t0) * 1e9 / n;
}

static ct_ledger *bench_ledger(const char *path)
{
    struct ct_ledger_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.limit[0] = 1ull << 40;
    snprintf(cfg.group, sizeof cfg.group, "b");
    ct_ledger *l = ct_ledger_create(path, &cfg, NULL, errbuf, sizeof errbuf);
    CHECK(l, "create %s: %s", path, errbuf);
    CHECK(ct_ledger_join(l, getpid(), 0) >= 0, "join");
    return l;
}

static int case_bench(int n)
{
    char p[4096], q[4096];
    snprintf(p, sizeof p, "%.1900s/b.ledger", dir);
    ct_ledger *l = bench_ledger(p);
    double priv = pairs_ns(l, n);
    ct_ledger_close(l);
    make_shared_dir();
    double with[3];
    int others[3] = {0, 1, 4};
    for (int k = 0; k < 3; k++) {
        for (int u = 1; u <= others[k]; u++) { /* another user's part, made by that user */
            part_path(q, sizeof q, "b", UID0 + (unsigned)u);
            if (access(q, F_OK) == 0)
                continue;
            pid_t c = fork();
            CHECK(c >= 0, "fork");
            if (c == 0) {
                become(UID0 + (unsigned)u);
                ct_ledger_close(bench_ledger(q));
                _exit(0);
            }
            int st;
            waitpid(c, &st, 0);
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "part of uid %u", UID0 + (unsigned)u);
        }
        part_path(q, sizeof q, "b", 0);
        l = bench_ledger(q);
        CHECK(ct_ledger_other_parts(l) == others[k], "parts %d", ct_ledger_other_parts(l));
        with[k] = pairs_ns(l, n);
        ct_ledger_close(l);
    }
    printf("ok bench ns per reserve+release pair: private %.0f, shared alone %.0f, "
           "beside 1 user's part %.0f, beside 4 %.0f\n",
           priv, with[0], with[1], with[2]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR hammer|late|forked|damage|agent|setuid|bench [...]\n",
                argv[0]);
        return 2;
    }
    dir = argv[1];
    const char *c = argv[2];
    setvbuf(stdout, NULL, _IONBF, 0);
    if (strcmp(c, "hammer") == 0)
        return case_hammer(argc > 3 ? atoi(argv[3]) : 3, argc > 4 ? atoi(argv[4]) : 2,
                           argc > 5 ? atoi(argv[5]) : 8, argc > 6 ? atoi(argv[6]) : 2000,
                           argc > 7 && strcmp(argv[7], "late") == 0);
    if (strcmp(c, "late") == 0) /* users that arrive while the others reserve */
        return case_hammer(4, 2, 4, 3000, 1);
    if (strcmp(c, "forked") == 0) { /* late users whose processes share a handle over fork */
        h_forked = 1;
        return case_hammer(3, 1, 3, 3000, 1);
    }
    if (strcmp(c, "damage") == 0)
        return case_damage();
    if (strcmp(c, "agent") == 0)
        return case_agent();
    if (strcmp(c, "setuid") == 0)
        return case_setuid();
    if (strcmp(c, "bench") == 0)
        return case_bench(argc > 3 ? atoi(argv[3]) : 200000);
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
}
