/* writer.c - the trace sink: an append-only file written through shared mappings.
 *
 * Why mmap: a record is in the page cache the moment it is copied, so a SIGKILL loses nothing
 * that was published, and the hot path makes no syscall. The file grows in chunks of
 * CT_CHUNK_SIZE (fallocate'd, so a full disk is an error here, never a SIGBUS in the target).
 * A record is reserved by one atomic add on the file position (no lock), filled, and published
 * by one release store of its 8-byte header (trace_format.h describes the format). A mutex
 * guards only opening, growing and closing the file.
 *
 * Events go into blocks (RAWBLOCK records) that each thread takes for itself (ct_block_take: one
 * reservation for many events) and fills without any shared write: an event is published by a
 * release store of the block's `used`. A chunk holding a block some thread still fills is
 * never unmapped (chunk_refs); the thread lets go when it takes its next block or exits.
 */
#include "writer.h"

#include <pthread.h>

#include "ledger.h"
#include "trace_format.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_CHUNKS 65536
#define KEEP_MAPPED 4 /* chunks kept mapped behind the current one */

/* recursive: the preamble of a new file is written by the thread that opened it, lock held.
 * The lock guards opening, growing and closing only; reserving a record is one atomic add. */
static pthread_mutex_t mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static int fd = -1;
int ct_writer_state; /* 0: not opened yet, 1: open, -1: failed or closed (writer.h) */
static uint8_t *chunks[MAX_CHUNKS];
static uint32_t busy;    /* reservations not yet published, all chunks (atomic) */
static uint64_t pos;     /* next free byte of the file (atomic) */
static uint32_t nchunks; /* chunks fallocated and mapped so far (under mu) */
static uint32_t unmapped_below;
static uint32_t dropped;
uint64_t ct_events_written;
static ct_preamble_fn preamble;
static uint64_t (*event_count)(void); /* events.c's: the events of the file */
static uint32_t gen_counter;          /* files opened by this image and its forked children */
uint32_t ct_writer_gen;               /* generation of the open file, 0: none (atomic; writer.h) */
static uint32_t nthreads;             /* threads numbered in the open file (atomic) */
static uint32_t chunk_refs[MAX_CHUNKS]; /* event blocks held in each chunk (atomic) */

uint64_t ct_writer_pos(void) { return __atomic_load_n(&pos, __ATOMIC_ACQUIRE); }
uint32_t ct_writer_new_thread(void) { return __atomic_fetch_add(&nthreads, 1, __ATOMIC_RELAXED); }

void ct_writer_set_preamble(ct_preamble_fn fn) { preamble = fn; }
void ct_writer_set_counter(uint64_t (*fn)(void)) { event_count = fn; }

static int stop_errno; /* errno of the failure that stopped the trace, 0: not stopped */

#include "writer_stats.h"

/* A full disk (or quota, or mapping failure): stop writing at once, for good, so that no later
 * event pays for another attempt, and say so in the header (its block is always allocated, so
 * this pwrite needs no new space) and once on stderr. Called with mu held. */
static void stop_writing(int err)
{
    if (stop_errno)
        return;
    stop_errno = err ? err : EIO;
    __atomic_store_n(&ct_writer_state, -1, __ATOMIC_RELEASE);
    /* the three stopped_* fields, in the header's order */
    struct {
        uint64_t ns;
        int32_t err, exit;
    } st = {ct_now_ns(), stop_errno, -1};
    _Static_assert(offsetof(struct ct_file_header, stopped_exit) ==
                       offsetof(struct ct_file_header, stopped_ns) + 12,
                   "stopped_* fields are contiguous");
    if (fd >= 0) {
        ssize_t r = pwrite(fd, &st, sizeof st, (off_t)offsetof(struct ct_file_header, stopped_ns));
        (void)r;
    }
    /* a failure to record is said even under -q: the run's figures are missing something */
    char num[24];
    ct_fmt_u64(num, (uint64_t)getpid());
    ct_log("pid ", num, ": trace stopped, the program goes on untraced: ", strerror(stop_errno));
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
/* A new chunk's pages made present and writable now, by the thread that grows the file, so that
 * no event faults: MAP_POPULATE alone maps a shared file's pages read-only (ext4, xfs and tmpfs
 * alike: the first store to each 4 KiB page then took a write fault on the caller's thread, ~85
 * async pairs apart, and ext4's page_mkwrite starts a journal handle). MADV_POPULATE_WRITE does
 * the write faults in one call; an older kernel gets one store per page (nothing else can write
 * there yet: the chunk is published after this, writer.c's reserve). The chunk is fallocated,
 * so this never meets a full disk. */
static void prefault(uint8_t *m)
{
    if (madvise(m, CT_CHUNK_SIZE, MADV_POPULATE_WRITE) == 0)
        return;
    for (size_t i = 0; i < CT_CHUNK_SIZE; i += 4096) {
        volatile uint8_t *b = m + i;
        *b = *b;
    }
}

static int grow(uint32_t idx)
{
    if (idx >= MAX_CHUNKS)
        return -1;
    off_t off = (off_t)idx * CT_CHUNK_SIZE;
    int r = (int)syscall(SYS_fallocate, fd, 0, (long)off, (long)CT_CHUNK_SIZE);
    if (r != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
        r = ftruncate(fd, off + CT_CHUNK_SIZE);
    }
    if (r != 0) {
        stop_writing(errno);
        return -1;
    }
    void *m = mmap(NULL, CT_CHUNK_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
    if (m == MAP_FAILED) {
        stop_writing(errno);
        return -1;
    }
    prefault(m);
    __atomic_store_n(&chunks[idx], (uint8_t *)m, __ATOMIC_RELEASE);
    return 0;
}

static void unmap_old(void)
{
    /* chunks well behind the current one whose records are all published */
    /* only when the caller's own reservation is the one outstanding: then no thread can be
     * writing into an old chunk (new reservations only land in the current one) */
    if (__atomic_load_n(&busy, __ATOMIC_ACQUIRE) != 1)
        return;
    /* a chunk where a thread still holds its block of events stays mapped until it lets go */
    uint32_t cur = (uint32_t)(__atomic_load_n(&pos, __ATOMIC_ACQUIRE) / CT_CHUNK_SIZE);
    int behind = 1; /* every chunk below i is unmapped */
    for (uint32_t i = unmapped_below; i + KEEP_MAPPED < cur; i++) {
        if (chunks[i] && __atomic_load_n(&chunk_refs[i], __ATOMIC_ACQUIRE) == 0) {
            munmap(chunks[i], CT_CHUNK_SIZE);
            __atomic_store_n(&chunks[i], NULL, __ATOMIC_RELEASE);
        }
        if (behind && !chunks[i])
            unmapped_below = i + 1;
        else
            behind = 0;
    }
    if (stats_hdr) /* sealed: nothing below writes again (the launcher may compress them) */
        __atomic_store_n(&stats_hdr->sealed_chunks, unmapped_below, __ATOMIC_RELEASE);
}

static void fill_header(struct ct_file_header *h)
{
    memcpy(h->magic, "CUDATRC", 8);
    h->version = CT_FORMAT_VERSION;
    h->header_size = CT_HEADER_SIZE;
    h->chunk_size = CT_CHUNK_SIZE;
    h->pointer_size = sizeof(void *);
    h->pid = getpid();
    h->ppid = getppid();
    h->stack_depth = (uint32_t)ct_cfg.stack_depth;
    h->start_monotonic_ns = ct_now_ns();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->start_realtime_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
#if defined(__x86_64__)
    ct_strlcpy(h->arch, "x86_64", sizeof h->arch);
#elif defined(__aarch64__)
    ct_strlcpy(h->arch, "aarch64", sizeof h->arch);
#else
    ct_strlcpy(h->arch, "unknown", sizeof h->arch);
#endif
    ct_strlcpy(h->shim_version, CT_SHIM_VERSION, sizeof h->shim_version);
    /* with the pid, names this process even after pid reuse (the ledger reads it alike) */
    h->process_start_ticks = ct_ledger_proc_start_ticks(getpid());
}

/* CUDATRACE_DIR that does not exist yet: made, with the folders above it that are missing
 * (mode 0700: traces hold argv and the working directory); one that exists is used as it is */
static void make_dir(void)
{
    char p[sizeof ct_cfg.dir];
    size_t n = ct_strlcpy(p, ct_cfg.dir, sizeof p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0)
            continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            return;
        p[i] = c;
    }
}

/* A read lock on byte 0 of the new file, held until the process is gone (the descriptor is
 * never closed before; a fork child closes its copy, which leaves the lock): readers tell a
 * live writer by it in any pid namespace. CT_FH_LIVE_LOCK when taken. */
static uint32_t live_lock(void)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_RDLCK;
    fl.l_whence = SEEK_SET;
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? CT_FH_LIVE_LOCK : 0;
}

/* Called with mu held. Creates <dir>/<pid>.<n>.ctrace, the first n that does not exist. */
static int open_file(void)
{
    char path[1200], num[24];
    int pid = getpid(), made = 0;
    if (!ct_cfg.dir[0]) /* --no-trace */
        return -1;
    for (uint32_t n = 0; n < 1000; n++) {
        size_t l = ct_strlcpy(path, ct_cfg.dir, sizeof path);
        if (l + 48 >= sizeof path)
            return -1;
        path[l++] = '/';
        ct_fmt_u64(num, (uint64_t)pid);
        l += ct_strlcpy(path + l, num, sizeof path - l);
        path[l++] = '.';
        ct_fmt_u64(num, n);
        l += ct_strlcpy(path + l, num, sizeof path - l);
        ct_strlcpy(path + l, ".ctrace", sizeof path - l);
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                  (mode_t)ct_cfg.file_mode);
        if (fd >= 0) {
            uint32_t flags = live_lock();
            if (grow(0) != 0) {
                /* no room for a chunk: keep a header-only file that says so, if even that
                 * fits, so the process is listed with what it lost */
                struct ct_file_header h;
                memset(&h, 0, sizeof h);
                fill_header(&h);
                h.exec_index = n;
                h.stopped_ns = h.start_monotonic_ns;
                h.stopped_errno = stop_errno;
                h.stopped_exit = -1;
                h.flags = flags;
                if (ftruncate(fd, 0) != 0 ||
                    syscall(SYS_fallocate, fd, 0, 0L, (long)sizeof h) != 0 ||
                    pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
                    unlink(path);
                    close(fd);
                    fd = -1;
                } /* else kept open: ct_writer_close notes the exit status in its header */
                return -1;
            }
            nchunks = 1;
            unmapped_below = 0;
            struct ct_file_header *h = (struct ct_file_header *)chunks[0];
            fill_header(h);
            h->exec_index = n;
            h->flags = flags;
            ct_writer_stats_open();
            __atomic_store_n(&pos, CT_HEADER_SIZE, __ATOMIC_RELEASE);
            __atomic_store_n(&nthreads, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&ct_writer_gen, ++gen_counter ? gen_counter : ++gen_counter,
                             __ATOMIC_RELEASE);
            return 0;
        }
        if (errno == ENOENT && !made++) {
            make_dir();
            n--; /* the same name again, in the folder made now */
            continue;
        }
        if (errno != EEXIST)
            break;
    }
    /* even under -q: a process that allocates untraced makes every figure of the run short */
    ct_fmt_u64(num, (uint64_t)pid);
    ct_log("pid ", num,
           ": cannot create its trace file, the program goes on untraced: ", strerror(errno));
    return -1;
}

/* slow path: map chunk idx (and any before it not mapped yet) */
static int ensure_chunk(uint32_t idx)
{
    int ok = 1;
    pthread_mutex_lock(&mu);
    while (ok && nchunks <= idx && ct_writer_state == 1) {
        if (grow(nchunks) == 0)
            nchunks++;
        else
            ok = 0;
    }
    if (ok && ct_writer_state == 1)
        unmap_old();
    ok = ok && ct_writer_state == 1 && __atomic_load_n(&chunks[idx], __ATOMIC_ACQUIRE) != NULL;
    pthread_mutex_unlock(&mu);
    return ok;
}

static void publish(uint8_t *p, uint16_t type, uint32_t size)
{
    struct ct_rec_hdr h = {CT_REC_MAGIC, type, size};
    uint64_t w;
    memcpy(&w, &h, 8);
    __atomic_store_n((uint64_t *)p, w, __ATOMIC_RELEASE);
}

/* Reserve size bytes: one atomic add. A reservation that would cross a chunk boundary fills the
 * rest of the chunk with a PAD record and tries again in the next chunk. */
static uint8_t *reserve(uint32_t size, uint32_t *chunk)
{
    __atomic_add_fetch(&busy, 1, __ATOMIC_SEQ_CST);
    /* closed since the caller looked: a place past END could lie past the file's cut end
     * (ct_writer_close: its store of the state, then its load of busy, pair with these two) */
    if (__atomic_load_n(&ct_writer_state, __ATOMIC_SEQ_CST) < 0) {
        __atomic_sub_fetch(&busy, 1, __ATOMIC_ACQ_REL);
        return NULL;
    }
    for (int tries = 0; tries < 4; tries++) {
        uint64_t p = __atomic_fetch_add(&pos, size, __ATOMIC_ACQ_REL);
        uint32_t idx = (uint32_t)(p / CT_CHUNK_SIZE), off = (uint32_t)(p % CT_CHUNK_SIZE);
        if (idx >= MAX_CHUNKS)
            break;
        uint8_t *base = __atomic_load_n(&chunks[idx], __ATOMIC_ACQUIRE);
        if (!base && !ensure_chunk(idx))
            break;
        base = __atomic_load_n(&chunks[idx], __ATOMIC_ACQUIRE);
        if (off + size <= CT_CHUNK_SIZE) {
            *chunk = idx;
            return base + off;
        }
        /* This reservation crosses the chunk's end: pad both pieces so readers see no hole,
         * then take a fresh place (sizes and offsets are multiples of 8: both pieces >= 8). */
        publish(base + off, CT_REC_PAD, CT_CHUNK_SIZE - off);
        if (idx + 1 >= MAX_CHUNKS ||
            (!__atomic_load_n(&chunks[idx + 1], __ATOMIC_ACQUIRE) && !ensure_chunk(idx + 1)))
            break;
        publish(__atomic_load_n(&chunks[idx + 1], __ATOMIC_ACQUIRE), CT_REC_PAD,
                off + size - CT_CHUNK_SIZE);
    }
    __atomic_sub_fetch(&busy, 1, __ATOMIC_ACQ_REL);
    return NULL;
}

int ct_rec_begin(ct_slot *s, uint32_t size)
{
    size = (size + 7u) & ~7u;
    if (size > CT_CHUNK_SIZE / 2)
        return 0;
    int st = __atomic_load_n(&ct_writer_state, __ATOMIC_ACQUIRE);
    if (st < 0)
        return 0;
    if (st == 0) {
        pthread_mutex_lock(&mu);
        if (ct_writer_state == 0) {
            if (open_file() == 0) {
                __atomic_store_n(&ct_writer_state, 1, __ATOMIC_RELEASE);
                if (preamble)
                    preamble(); /* re-enters ct_rec_begin: mu is recursive */
            } else {
                __atomic_store_n(&ct_writer_state, -1, __ATOMIC_RELEASE);
            }
        }
        st = ct_writer_state;
        pthread_mutex_unlock(&mu);
        if (st != 1)
            return 0;
    }
    uint8_t *p = reserve(size, &s->chunk);
    if (!p) {
        __atomic_add_fetch(&dropped, 1, __ATOMIC_RELAXED);
        return 0;
    }
    s->p = p;
    s->size = size;
    return 1;
}

void ct_rec_commit(ct_slot *s, uint16_t type)
{
    publish(s->p, type, s->size);
    __atomic_sub_fetch(&busy, 1, __ATOMIC_RELEASE);
}

int ct_rec_write(uint16_t type, const void *a, size_t na, const void *b, size_t nb, const void *c,
                 size_t nc)
{
    ct_slot s;
    size_t total = sizeof(struct ct_rec_hdr) + na + nb + nc;
    if (total > CT_CHUNK_SIZE / 2 || !ct_rec_begin(&s, (uint32_t)total))
        return 0;
    uint8_t *p = s.p + sizeof(struct ct_rec_hdr);
    if (na)
        memcpy(p, a, na);
    if (nb)
        memcpy(p + na, b, nb);
    if (nc)
        memcpy(p + na + nb, c, nc);
    /* zero the alignment padding so files are reproducible */
    memset(p + na + nb + nc, 0, s.size - total);
    ct_rec_commit(&s, type);
    return 1;
}

int ct_block_take(ct_block *b, uint32_t size, uint32_t thread, uint32_t seq, uint32_t last_chunk)
{
    ct_slot s;
    if (!ct_rec_begin(&s, size))
        return 0;
    /* still counted busy: the chunk cannot be unmapped before it is counted as held */
    __atomic_add_fetch(&chunk_refs[s.chunk], 1, __ATOMIC_ACQ_REL);
    uint32_t start = s.chunk != last_chunk;
    struct ct_rec_rawblock bh = {0, thread, start ? 0 : seq, start ? CT_RAWB_START : 0};
    memcpy(s.p + sizeof(struct ct_rec_hdr), &bh, sizeof bh);
    ct_rec_commit(&s, CT_REC_RAWBLOCK);
    b->p = s.p;
    b->chunk = s.chunk;
    b->size = s.size;
    b->start = start;
    b->gen = __atomic_load_n(&ct_writer_gen, __ATOMIC_ACQUIRE);
    return 1;
}

void ct_block_drop(ct_block *b)
{
    if (b->p && b->gen == __atomic_load_n(&ct_writer_gen, __ATOMIC_ACQUIRE))
        __atomic_sub_fetch(&chunk_refs[b->chunk], 1, __ATOMIC_ACQ_REL);
    b->p = NULL;
}

void ct_writer_open_now(void)
{
    ct_slot s;
    /* a zero-body PAD record forces the file into existence; readers skip it */
    if (ct_rec_begin(&s, 8))
        ct_rec_commit(&s, CT_REC_PAD);
}

/* The file cut to what was written: no larger at rest than its records. Only once no thread
 * can write past the cut: the state is closed (a reservation made after it gives up, reserve),
 * and no reservation is under way (busy; a thread that stopped inside one, a signal handler
 * that exits, is waited for 10 ms at most). Otherwise the blocks after END are given back and
 * the size stays, so a late writer can never fault. Called without mu (a reservation may be
 * waiting for it to map a chunk: it then sees the state and gives up). */
static void cut_at_end(off_t end, off_t stop)
{
    uint64_t t0 = ct_now_ns();
    while (__atomic_load_n(&busy, __ATOMIC_SEQ_CST) != 0) {
        if (ct_now_ns() - t0 > 10000000ull) {
            if (stop > end)
                fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, end, stop - end);
            return;
        }
        sched_yield();
    }
    off_t used = (off_t)__atomic_load_n(&pos, __ATOMIC_ACQUIRE);
    if (used > stop)
        used = stop; /* reservations that found no chunk wrote nothing there */
    if (used < end)
        used = end;
    if (used < stop && ftruncate(fd, used) != 0)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, end, stop - end);
}

void ct_writer_close(int exit_code)
{
    pthread_mutex_lock(&mu);
    if (ct_writer_state != 1) {
        if (stop_errno && fd >= 0) { /* stopped by a full disk: the header keeps the status */
            int32_t code = exit_code;
            ssize_t r = pwrite(fd, &code, sizeof code,
                               (off_t)offsetof(struct ct_file_header, stopped_exit));
            (void)r;
        }
        __atomic_store_n(&ct_writer_state, -1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&mu);
        return;
    }
    ct_slot s;
    ct_writer_stats_flush();
    struct ct_rec_end e = {ct_now_ns(), exit_code, 0, 0, 0};
    off_t end = 0, stop = (off_t)nchunks * CT_CHUNK_SIZE;
    if (ct_rec_begin(&s, sizeof(struct ct_rec_hdr) + sizeof e)) {
        e.dropped = __atomic_load_n(&dropped, __ATOMIC_RELAXED);
        e.events = __atomic_load_n(&ct_events_written, __ATOMIC_RELAXED) +
                   (event_count ? event_count() : 0);
        memcpy(s.p + sizeof(struct ct_rec_hdr), &e, sizeof e);
        ct_rec_commit(&s, CT_REC_END);
        end = (off_t)(s.p - chunks[s.chunk]) + (off_t)s.chunk * CT_CHUNK_SIZE + s.size;
    }
    __atomic_store_n(&ct_writer_state, -1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&mu);
    if (end)
        cut_at_end(end, stop);
}

void ct_writer_atfork_prepare(void) { pthread_mutex_lock(&mu); }
void ct_writer_atfork_parent(void) { pthread_mutex_unlock(&mu); }

void ct_writer_atfork_child(void)
{
    /* the parent's file is not ours: drop its mappings and descriptor, start lazily anew */
    for (uint32_t i = 0; i < nchunks && i < MAX_CHUNKS; i++) {
        if (chunks[i]) {
            munmap(chunks[i], CT_CHUNK_SIZE);
            chunks[i] = NULL;
        }
    }
    if (fd >= 0)
        close(fd);
    fd = -1;
    memset(chunk_refs, 0, sizeof(uint32_t) * (nchunks < MAX_CHUNKS ? nchunks : MAX_CHUNKS));
    pos = 0;
    nchunks = unmapped_below = dropped = busy = 0;
    stop_errno = 0;
    ct_events_written = 0;
    ct_writer_gen = 0;
    nthreads = 0;
    ct_writer_stats_reset();
    ct_writer_state = ct_cfg.active ? 0 : -1;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&mu, &a);
}
