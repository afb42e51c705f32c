/* ledger_group.c - the group rule (ct_ledger_adopt: docs/budgets.md, "Groups") and the one
 * grammar of budget amounts (ct_ledger_parse_size, ct_ledger_parse_budget), for the launcher and
 * the preload library alike. In a shared directory the rule reads the other users' parts too
 * (ledger_parts.c): a live member there under another budget is a conflict. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ledger_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- the group rule (ct_ledger_adopt) ------------------------------------------------------ */
/* One member at a time decides a group's budget: it holds budget_token (its slot's state word
 * with the slot number in the low byte). Deciding is a few loads and at most 16 stores; a token
 * whose member has left or died is taken over, so no process waits on one that is gone, and a
 * live holder is waited for at most ADOPT_WAIT_MS. */
#define ADOPT_WAIT_MS 1000

static uint64_t my_token(const struct ct_ledger *l)
{
    return (l->word & ~0xffull) | (uint64_t)(uint32_t)l->slot;
}

/* whether the member named by token t is gone (left, reclaimed or dead) */
static int token_stale(struct ct_ledger *l, uint64_t t)
{
    uint32_t slot = (uint32_t)(t & 0xff);
    uint64_t w = (t & ~0xffull) | CT_LEDGER_ACTIVE;
    struct ct_ledger_member *m = &l->mem[slot];
    if (slot >= CT_LEDGER_MAX_MEMBERS || LD(&m->state) != w)
        return 1;
    return ctl_member_alive(l->pidns, ctl_our_fd(l), (int32_t)slot, W_PID(w), LD(&m->start_ticks),
                            LD(&m->pidns), LD(&m->liveness)) == CT_LEDGER_DEAD;
}

/* "8.00 GiB", "512.0 MiB", "17 B" (as cudatrace/units.py format_bytes writes sizes) */
static void fmt_size(char *buf, size_t n, uint64_t v)
{
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (v < 1024) {
        snprintf(buf, n, "%llu B", (unsigned long long)v);
        return;
    }
    double x = (double)v / 1024.0;
    int i = 0;
    while (x >= 1024.0 && i < 5) {
        x /= 1024.0;
        i++;
    }
    snprintf(buf, n, x < 10 ? "%.2f %s" : "%.1f %s", x, units[i]);
}

/* "8.00 GiB on every device", "8.00 GiB on device 0, 4.00 GiB on device 1" or "none" */
static void limits_text(const uint64_t *lim, char *buf, size_t n)
{
    int all = 1, any = 0;
    char one[32];
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        all &= lim[d] == lim[0];
        any |= lim[d] != 0;
    }
    snprintf(buf, n, "none");
    if (any && all) {
        fmt_size(one, sizeof one, lim[0]);
        snprintf(buf, n, "%s on every device", one);
    }
    size_t o = 0;
    for (int d = 0; any && !all && d < CT_LEDGER_MAX_DEVICES && o < n; d++)
        if (lim[d]) {
            fmt_size(one, sizeof one, lim[d]);
            o += (size_t)snprintf(buf + o, n - o, "%s%s on device %d", o ? ", " : "", one, d);
        }
}

/* the pids of live members other than ourselves, ", "-separated into buf; how many */
static int other_live(struct ct_ledger *l, char *buf, size_t n)
{
    int fd = ctl_our_fd(l), count = 0;
    size_t o = 0;
    buf[0] = 0;
    uint32_t h = ctl_hwm(l);
    for (uint32_t i = 0; i < h; i++) {
        struct ct_ledger_member *m = &l->mem[i];
        uint64_t w = LD(&m->state);
        if ((int32_t)i == l->slot || W_STATE(w) != CT_LEDGER_ACTIVE)
            continue;
        if (ctl_member_alive(l->pidns, fd, (int32_t)i, W_PID(w), LD(&m->start_ticks), LD(&m->pidns),
                             LD(&m->liveness)) == CT_LEDGER_DEAD)
            continue;
        if (o < n)
            o += (size_t)snprintf(buf + o, n - o, "%s%d", count ? ", " : "", W_PID(w));
        count++;
    }
    return count;
}

/* the group rule's verdict for want on the group as it is: CT_LEDGER_OK, _ECONFLICT, _ENOBUDGET
 * (err says why), or 1: want replaces the budget (no live member but this handle's) */
static int32_t own_verdict(struct ct_ledger *l, const uint64_t *want, char *err, uint64_t errlen)
{
    uint64_t cur[CT_LEDGER_MAX_DEVICES];
    int any = 0, same = 1;
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        cur[d] = LD(&l->hdr->limit[d]);
        any |= cur[d] != 0;
        same &= want && cur[d] == want[d];
    }
    const char *g = l->hdr->group;
    char have[400], asked[400], pids[200];
    limits_text(cur, have, sizeof have);
    if (!want) {
        if (any)
            return CT_LEDGER_OK;
        ctl_set_err(err, errlen, "group %s has no budget, and this process names none", g);
        return CT_LEDGER_ENOBUDGET;
    }
    if (same)
        return CT_LEDGER_OK;
    limits_text(want, asked, sizeof asked);
    if (other_live(l, pids, sizeof pids)) {
        ctl_set_err(err, errlen,
                    "group %s has a budget of %s, in use by pids %s; this process asks for %s", g,
                    have, pids, asked);
        return CT_LEDGER_ECONFLICT;
    }
    ctl_set_err(err, errlen, "group %s had a budget of %s and no live member; it is now %s", g,
                have, asked);
    return 1;
}

/* the group rule's verdict: this file's (own_verdict), and in a shared directory the other
 * users' parts: one with live members under another budget than want is a conflict */
static int32_t budget_verdict(struct ct_ledger *l, const uint64_t *want, char *err, uint64_t errlen)
{
    int32_t rc = own_verdict(l, want, err, errlen);
    if (rc < 0 || !l->parts || !want)
        return rc;
    char pids[300], have[400], asked[400];
    uint64_t other[CT_LEDGER_MAX_DEVICES] = {0};
    if (ctl_parts_conflicts(l, want, pids, sizeof pids, other) == 0)
        return rc;
    limits_text(other, have, sizeof have);
    limits_text(want, asked, sizeof asked);
    ctl_set_err(
        err, errlen,
        "group %s has a budget of %s in other users' parts, in use by pids %s; this process "
        "asks for %s",
        l->hdr->group, have, pids, asked);
    return CT_LEDGER_ECONFLICT;
}

/* with the token held: the decision of ct_ledger_adopt */
static int32_t adopt_decide(struct ct_ledger *l, const uint64_t *want, int32_t *replaced, char *err,
                            uint64_t errlen)
{
    int32_t rc = budget_verdict(l, want, err, errlen);
    if (rc != 1)
        return rc;
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        ST(&l->hdr->limit[d], want[d]);
    if (replaced)
        *replaced = 1;
    return CT_LEDGER_OK;
}

int32_t ct_ledger_check_budget(ct_ledger *l, const uint64_t *want, char *err, uint64_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!ctl_valid(l))
        return CT_LEDGER_EINVAL;
    int saved = errno;
    int32_t rc = budget_verdict(l, want, err, errlen);
    errno = saved;
    return rc == 1 ? CT_LEDGER_OK : rc;
}

int32_t ct_ledger_adopt(ct_ledger *l, const uint64_t *want, int32_t *replaced, char *err,
                        uint64_t errlen)
{
    if (replaced)
        *replaced = 0;
    if (err && errlen)
        err[0] = 0;
    if (!ctl_valid(l))
        return CT_LEDGER_EINVAL;
    if (l->slot < 0 || l->slot >= CT_LEDGER_MAX_MEMBERS || LD(&l->mem[l->slot].state) != l->word)
        return CT_LEDGER_ENOTMEMBER;
    int saved = errno;
    uint64_t mine = my_token(l);
    int32_t rc = CT_LEDGER_EBUSY;
    for (int waited = 0;; waited++) {
        uint64_t t = 0;
        if (CAS(&l->hdr->budget_token, &t, mine) || t == mine) {
            ctl_reclaim_scan(l); /* dead members are not "live members" */
            rc = adopt_decide(l, want, replaced, err, errlen);
            CAS(&l->hdr->budget_token, &mine, 0);
            break;
        }
        if (token_stale(l, t)) {
            CAS(&l->hdr->budget_token, &t, 0);
            continue;
        }
        if (waited >= ADOPT_WAIT_MS) {
            ctl_set_err(err, errlen,
                        "pid %d has been deciding group %s's budget for a second; try again",
                        W_PID(t), l->hdr->group);
            break;
        }
        ctl_sleep_ms(1);
    }
    errno = saved;
    return rc;
}

/* ---- the budget grammar -------------------------------------------------------------------- */

static const char *skip_blank(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    return p;
}

/* the multiplier of a unit (case-insensitive), 0 when none matches */
static uint64_t unit_mult(const char *u, size_t n)
{
    static const struct {
        const char *name;
        uint64_t mult;
    } units[] = {
        {"b", 1},
        {"k", 1ull << 10},
        {"kib", 1ull << 10},
        {"kb", 1000ull},
        {"m", 1ull << 20},
        {"mib", 1ull << 20},
        {"mb", 1000000ull},
        {"g", 1ull << 30},
        {"gib", 1ull << 30},
        {"gb", 1000000000ull},
        {"t", 1ull << 40},
        {"tib", 1ull << 40},
        {"tb", 1000000000000ull},
    };
    char low[4];
    if (n == 0 || n > 3)
        return 0;
    for (size_t i = 0; i < n; i++)
        low[i] = (char)(u[i] >= 'A' && u[i] <= 'Z' ? u[i] + 32 : u[i]);
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (strlen(units[i].name) == n && memcmp(units[i].name, low, n) == 0)
            return units[i].mult;
    return 0;
}

/* one amount in [s, end): 0 with *out, else CT_LEDGER_EINVAL with err */
static int32_t parse_amount(const char *s, const char *end, uint64_t *out, char *err,
                            uint64_t errlen)
{
    const char *p = skip_blank(s, end), *q = end;
    while (q > p && (q[-1] == ' ' || q[-1] == '\t'))
        q--;
    int len = (int)(q - p);
    s = p;
    if (p < q && *p == '-') {
        ctl_set_err(err, errlen, "'%.*s': must be positive", len, s);
        return CT_LEDGER_EINVAL;
    }
    if (p < q && *p == '+')
        p++;
    unsigned __int128 whole = 0, frac = 0, scale = 1;
    int digits = 0, fdigits = 0;
    for (; p < q && *p >= '0' && *p <= '9'; p++, digits++)
        if ((whole = whole * 10 + (unsigned)(*p - '0')) > UINT64_MAX)
            goto too_large;
    if (p < q && *p == '.')
        for (p++; p < q && *p >= '0' && *p <= '9'; p++, fdigits++)
            if (fdigits < 18) {
                frac = frac * 10 + (unsigned)(*p - '0');
                scale *= 10;
            }
    if (!digits && !fdigits) {
        ctl_set_err(err, errlen, "'%.*s' is not a size (write e.g. 8GiB, 512MiB, 1.5GiB)", len, s);
        return CT_LEDGER_EINVAL;
    }
    const char *u = skip_blank(p, q);
    uint64_t mult = u == q ? 1 : unit_mult(u, (size_t)(q - u));
    for (const char *x = u; x < q && !mult; x++)
        if (!((*x >= 'a' && *x <= 'z') || (*x >= 'A' && *x <= 'Z'))) {
            ctl_set_err(err, errlen, "'%.*s' is not a size (write e.g. 8GiB, 512MiB, 1.5GiB)", len,
                        s);
            return CT_LEDGER_EINVAL;
        }
    if (!mult) {
        ctl_set_err(
            err, errlen,
            "'%.*s': unknown unit '%.*s' (units: B KiB MiB GiB TiB, K M G T alike, KB MB GB "
            "TB = powers of 1000)",
            len, s, (int)(q - u), u);
        return CT_LEDGER_EINVAL;
    }
    if (mult == 1 && frac) {
        ctl_set_err(err, errlen, "'%.*s': a number of bytes must be whole", len, s);
        return CT_LEDGER_EINVAL;
    }
    unsigned __int128 v = whole * mult + frac * mult / scale;
    if (v > UINT64_MAX)
        goto too_large;
    if (v == 0) {
        ctl_set_err(err, errlen,
                    whole || frac ? "'%.*s' is less than a byte" : "'%.*s' must be more than zero",
                    len, s);
        return CT_LEDGER_EINVAL;
    }
    if (u == q && v < CT_LEDGER_BARE_MIN) {
        ctl_set_err(err, errlen,
                    "'%.*s' has no unit, so it means %llu bytes, which is surely not meant: write "
                    "%.*sGiB or %.*sMiB (or %.*sB for bytes)",
                    len, s, (unsigned long long)v, len, s, len, s, len, s);
        return CT_LEDGER_EINVAL;
    }
    *out = (uint64_t)v;
    return CT_LEDGER_OK;
too_large:
    ctl_set_err(err, errlen, "'%.*s' is too large", len, s);
    return CT_LEDGER_EINVAL;
}

int32_t ct_ledger_parse_size(const char *text, uint64_t *out, char *err, uint64_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!text || !out)
        return CT_LEDGER_EINVAL;
    const char *end = text + strlen(text);
    if (skip_blank(text, end) == end) {
        ctl_set_err(err, errlen, "empty size");
        return CT_LEDGER_EINVAL;
    }
    return parse_amount(text, end, out, err, errlen);
}

/* one item "AMOUNT" or "DEV=AMOUNT" of a budget spec; 0 or CT_LEDGER_EINVAL */
static int32_t parse_item(const char *p, const char *e, uint64_t *all, int *have_all, uint64_t *per,
                          uint32_t *set, char *err, uint64_t errlen)
{
    const char *eq = memchr(p, '=', (size_t)(e - p));
    if (skip_blank(p, e) == e) {
        ctl_set_err(err, errlen, "empty item in the budget");
        return CT_LEDGER_EINVAL;
    }
    if (memchr(p, '%', (size_t)(e - p))) {
        ctl_set_err(err, errlen,
                    "'%.*s': a share of device memory (%%) is resolved by cudatrace run or the "
                    "integration into bytes; give bytes here",
                    (int)(e - p), p);
        return CT_LEDGER_EINVAL;
    }
    if (!eq) {
        if (*have_all) {
            ctl_set_err(err, errlen, "more than one amount for every device in the budget");
            return CT_LEDGER_EINVAL;
        }
        *have_all = 1;
        return parse_amount(p, e, all, err, errlen);
    }
    const char *d = skip_blank(p, eq), *de = eq;
    while (de > d && (de[-1] == ' ' || de[-1] == '\t'))
        de--;
    int dev = 0;
    for (const char *x = d; x < de; x++) {
        if (*x < '0' || *x > '9' || dev >= CT_LEDGER_MAX_DEVICES || d == de)
            dev = -1;
        else
            dev = dev * 10 + (*x - '0');
        if (dev < 0)
            break;
    }
    if (d == de || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES) {
        ctl_set_err(err, errlen, "'%.*s': the device must be an index below %d", (int)(e - p), p,
                    CT_LEDGER_MAX_DEVICES);
        return CT_LEDGER_EINVAL;
    }
    if (*set & (1u << dev)) {
        ctl_set_err(err, errlen, "device %d is given twice in the budget", dev);
        return CT_LEDGER_EINVAL;
    }
    *set |= 1u << dev;
    return parse_amount(eq + 1, e, &per[dev], err, errlen);
}

int32_t ct_ledger_parse_budget(const char *spec, uint64_t *limits, char *err, uint64_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!spec || !limits)
        return CT_LEDGER_EINVAL;
    uint64_t all = 0, per[CT_LEDGER_MAX_DEVICES] = {0};
    uint32_t set = 0;
    int have_all = 0;
    const char *p = spec, *end = spec + strlen(spec);
    if (skip_blank(p, end) == end) {
        ctl_set_err(err, errlen, "empty budget");
        return CT_LEDGER_EINVAL;
    }
    for (;;) {
        const char *e = memchr(p, ',', (size_t)(end - p));
        if (!e)
            e = end;
        if (parse_item(p, e, &all, &have_all, per, &set, err, errlen) != CT_LEDGER_OK)
            return CT_LEDGER_EINVAL;
        if (e == end)
            break;
        p = e + 1;
    }
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        limits[d] = (set & (1u << d)) ? per[d] : have_all ? all : 0;
    return CT_LEDGER_OK;
}
