/* demangle.c - a small Itanium C++ ABI demangler (see demangle.h).
 *
 * Recursive descent over the grammar of the ABI's "Mangling" chapter, writing c++filt's
 * spelling. Every piece of text is built in a fixed buffer on the stack (PIECE bytes) and
 * substitution candidates are copied into a fixed pool, in the order the ABI numbers them:
 * each prefix of a nested name (template prefixes included), each unscoped template name, each
 * non-builtin type (qualified, pointer and reference types too). Anything outside the subset
 * (function and array types, pointers to members, expressions, packs, conversion operators)
 * fails the whole name: the caller prints the mangled one, never a wrong one. */
#include "demangle.h"

#include <sched.h>
#include <string.h>

#define PIECE 512
#define POOL 6144
#define SUBS_MAX 64
#define TARGS_MAX 24
#define DEPTH_MAX 14

struct buf {
    char s[PIECE];
    size_t n;
    int bad; /* overflowed */
};

struct dm {
    const char *p;
    char pool[POOL];
    size_t pool_used;
    const char *subs[SUBS_MAX];
    int nsubs;
    const char *targs[TARGS_MAX];
    int ntargs;
    int depth;
    int in_type; /* > 0: template arguments met now are a type's, not the name's (T_) */
};

static void bput(struct buf *b, const char *s, size_t n)
{
    if (b->n + n >= sizeof b->s) {
        b->bad = 1;
        return;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void bputs(struct buf *b, const char *s) { bput(b, s, strlen(s)); }

static void binit(struct buf *b)
{
    b->n = 0;
    b->s[0] = 0;
    b->bad = 0;
}

static const char *save(struct dm *d, const char *s, size_t n)
{
    if (d->pool_used + n + 1 > sizeof d->pool)
        return NULL;
    char *o = d->pool + d->pool_used;
    memcpy(o, s, n);
    o[n] = 0;
    d->pool_used += n + 1;
    return o;
}

static int add_sub(struct dm *d, const struct buf *b)
{
    if (d->nsubs >= SUBS_MAX)
        return 0;
    const char *s = save(d, b->s, b->n);
    if (!s)
        return 0;
    d->subs[d->nsubs++] = s;
    return 1;
}

static int number(struct dm *d, unsigned long *out)
{
    if (*d->p < '0' || *d->p > '9')
        return 0;
    unsigned long n = 0;
    while (*d->p >= '0' && *d->p <= '9') {
        n = n * 10 + (unsigned long)(*d->p++ - '0');
        if (n > 1u << 20)
            return 0;
    }
    *out = n;
    return 1;
}

/* <seq-id>: base 36 (digits, then upper-case letters) */
static int seq_id(struct dm *d, unsigned long *out)
{
    unsigned long n = 0;
    int any = 0;
    for (;; d->p++) {
        char c = *d->p;
        if (c >= '0' && c <= '9')
            n = n * 36 + (unsigned long)(c - '0');
        else if (c >= 'A' && c <= 'Z')
            n = n * 36 + (unsigned long)(c - 'A' + 10);
        else
            break;
        any = 1;
        if (n > 1u << 20)
            return 0;
    }
    *out = any ? n + 1 : 0;
    return 1;
}

static int type(struct dm *d, struct buf *b);
static int encoding(struct dm *d, struct buf *b);

static int enter(struct dm *d) { return ++d->depth <= DEPTH_MAX; }

/* <source-name> ::= <length> <identifier>; _GLOBAL__N... is the anonymous namespace */
static int source_name(struct dm *d, struct buf *b, struct buf *last)
{
    unsigned long n;
    if (!number(d, &n) || n == 0 || strnlen(d->p, n) < n)
        return 0;
    if (n >= 10 && strncmp(d->p, "_GLOBAL__N", 10) == 0) {
        bputs(b, "(anonymous namespace)");
        if (last)
            binit(last);
    } else {
        bput(b, d->p, n);
        if (last) {
            binit(last);
            bput(last, d->p, n);
        }
    }
    d->p += n;
    return 1;
}

static const char *const operators[][2] = {
    {"nw", " new"}, {"na", " new[]"}, {"dl", " delete"}, {"da", " delete[]"}, {"ps", "+"},
    {"ng", "-"},    {"ad", "&"},      {"de", "*"},       {"co", "~"},         {"pl", "+"},
    {"mi", "-"},    {"ml", "*"},      {"dv", "/"},       {"rm", "%"},         {"an", "&"},
    {"or", "|"},    {"eo", "^"},      {"aS", "="},       {"pL", "+="},        {"mI", "-="},
    {"mL", "*="},   {"dV", "/="},     {"rM", "%="},      {"aN", "&="},        {"oR", "|="},
    {"eO", "^="},   {"ls", "<<"},     {"rs", ">>"},      {"lS", "<<="},       {"rS", ">>="},
    {"eq", "=="},   {"ne", "!="},     {"lt", "<"},       {"gt", ">"},         {"le", "<="},
    {"ge", ">="},   {"ss", "<=>"},    {"nt", "!"},       {"aa", "&&"},        {"oo", "||"},
    {"pp", "++"},   {"mm", "--"},     {"cm", ","},       {"pm", "->*"},       {"pt", "->"},
    {"cl", "()"},   {"ix", "[]"},
};

/* {lambda(int)#2}: Ul <parameter types> E [<number>] _ */
static int lambda(struct dm *d, struct buf *b)
{
    struct buf sig;
    binit(&sig);
    d->p += 2;
    int first = 1;
    if (*d->p == 'v' && d->p[1] == 'E')
        d->p++;
    while (*d->p && *d->p != 'E') {
        if (!first)
            bputs(&sig, ", ");
        first = 0;
        d->in_type++;
        int ok = type(d, &sig);
        d->in_type--;
        if (!ok)
            return 0;
    }
    if (*d->p++ != 'E')
        return 0;
    unsigned long n = 0;
    int has = number(d, &n);
    if (*d->p++ != '_')
        return 0;
    char num[24];
    unsigned long k = has ? n + 2 : 1;
    int i = (int)sizeof num - 1;
    num[i] = 0;
    do
        num[--i] = (char)('0' + k % 10);
    while ((k /= 10) && i > 0);
    bputs(b, "{lambda(");
    bput(b, sig.s, sig.n);
    bputs(b, ")#");
    bputs(b, num + i);
    bputs(b, "}");
    return !sig.bad;
}

/* <unqualified-name>, then any ABI tags; *kind: 1 ctor/dtor (no return type) */
static int unqualified_name(struct dm *d, struct buf *b, struct buf *last, int *kind)
{
    const char *p = d->p;
    if (*p >= '0' && *p <= '9') {
        if (!source_name(d, b, last))
            return 0;
    } else if (p[0] == 'C' && p[1] >= '1' && p[1] <= '5') { /* C4: GCC's unified ctor */
        if (!last || !last->n)
            return 0;
        bput(b, last->s, last->n);
        d->p += 2;
        *kind = 1;
    } else if (p[0] == 'D' && p[1] >= '0' && p[1] <= '5' && p[1] != '3') {
        if (!last || !last->n)
            return 0;
        bputs(b, "~");
        bput(b, last->s, last->n);
        d->p += 2;
        *kind = 1;
    } else if (p[0] == 'U' && p[1] == 'l') {
        if (!lambda(d, b))
            return 0;
    } else if (p[0] == 'U' && p[1] == 't') {
        d->p += 2;
        unsigned long n = 0;
        int has = number(d, &n);
        if (*d->p++ != '_')
            return 0;
        bputs(b, has ? "{unnamed type#2+}" : "{unnamed type#1}");
        if (has)
            return 0; /* numbering beyond the first: leave it to the mangled name */
    } else if (p[0] >= 'a' && p[0] <= 'z' && p[1]) {
        size_t i;
        for (i = 0; i < sizeof operators / sizeof operators[0]; i++)
            if (p[0] == operators[i][0][0] && p[1] == operators[i][0][1])
                break;
        if (i == sizeof operators / sizeof operators[0])
            return 0; /* cv (conversion), li (literal), v (vendor): not read */
        bputs(b, "operator");
        bputs(b, operators[i][1]);
        d->p += 2;
        if (last)
            binit(last);
    } else
        return 0;
    while (*d->p == 'B') { /* <abi-tag> ::= B <source-name> */
        d->p++;
        bputs(b, "[abi:");
        if (!source_name(d, b, NULL))
            return 0;
        bputs(b, "]");
    }
    return 1;
}

/* <expr-primary> ::= L <type> <value> E (integers and booleans) */
static int literal(struct dm *d, struct buf *b)
{
    d->p++;
    char t = *d->p++;
    const char *suffix;
    switch (t) {
    case 'i':
        suffix = "";
        break;
    case 'j':
        suffix = "u";
        break;
    case 'l':
        suffix = "l";
        break;
    case 'm':
        suffix = "ul";
        break;
    case 'x':
        suffix = "ll";
        break;
    case 'y':
        suffix = "ull";
        break;
    case 'b':
        if ((d->p[0] == '0' || d->p[0] == '1') && d->p[1] == 'E') {
            bputs(b, d->p[0] == '1' ? "true" : "false");
            d->p += 2;
            return 1;
        }
        return 0;
    default:
        return 0;
    }
    if (*d->p == 'n') {
        bputs(b, "-");
        d->p++;
    }
    const char *s = d->p;
    while (*d->p >= '0' && *d->p <= '9')
        d->p++;
    if (d->p == s || *d->p != 'E')
        return 0;
    bput(b, s, (size_t)(d->p - s));
    bputs(b, suffix);
    d->p++;
    return 1;
}

/* <template-args> ::= I <template-arg>+ E, written <a, b>; store: the name's own arguments */
static int template_args(struct dm *d, struct buf *b, int store)
{
    if (!enter(d))
        return 0;
    d->p++;
    if (b->n && b->s[b->n - 1] == '<')
        bputs(b, " "); /* operator< <int> */
    bputs(b, "<");
    int first = 1, n = 0;
    const char *args[TARGS_MAX];
    while (*d->p && *d->p != 'E') {
        struct buf a;
        binit(&a);
        if (*d->p == 'J') { /* an argument pack: its arguments, in line */
            d->p++;
            int pf = 1;
            while (*d->p && *d->p != 'E') {
                if (!pf)
                    bputs(&a, ", ");
                pf = 0;
                d->in_type++;
                int ok = *d->p == 'L' ? literal(d, &a) : type(d, &a);
                d->in_type--;
                if (!ok)
                    return 0;
            }
            if (*d->p++ != 'E')
                return 0;
            if (pf) /* an empty pack: spelled <> by c++filt, not read here */
                return 0;
        } else if (*d->p == 'L') {
            if (!literal(d, &a))
                return 0;
        } else {
            d->in_type++;
            int ok = type(d, &a);
            d->in_type--;
            if (!ok)
                return 0;
        }
        if (a.bad)
            return 0;
        if (!first)
            bputs(b, ", ");
        first = 0;
        bput(b, a.s, a.n);
        if (store) {
            if (n >= TARGS_MAX || !(args[n] = save(d, a.s, a.n)))
                return 0;
            n++;
        }
    }
    if (*d->p++ != 'E' || first)
        return 0;
    if (b->s[b->n - 1] == '>')
        bputs(b, " ");
    bputs(b, ">");
    if (store) {
        memcpy(d->targs, args, sizeof args[0] * (size_t)n);
        d->ntargs = n;
    }
    d->depth--;
    return 1;
}

static const char *const std_abbrev[][3] = {
    {"St", "std", ""},
    {"Sa", "std::allocator", "allocator"},
    {"Sb", "std::basic_string", "basic_string"},
    {"Ss", "std::basic_string<char, std::char_traits<char>, std::allocator<char> >",
     "basic_string"},
    {"Si", "std::basic_istream<char, std::char_traits<char> >", "basic_istream"},
    {"So", "std::basic_ostream<char, std::char_traits<char> >", "basic_ostream"},
    {"Sd", "std::basic_iostream<char, std::char_traits<char> >", "basic_iostream"},
};

/* the last component of a qualified name, without template arguments (a constructor's name) */
static void last_component(const char *s, struct buf *last)
{
    int depth = 0;
    const char *start = s;
    for (const char *c = s; *c; c++) {
        if (*c == '<')
            depth++;
        else if (*c == '>' && depth)
            depth--;
        else if (!depth && c[0] == ':' && c[1] == ':')
            start = c + 2;
    }
    binit(last);
    bput(last, start, strcspn(start, "<"));
}

/* <substitution> (not St, which prefixes a name); last (may be NULL): its last component */
static int substitution(struct dm *d, struct buf *b, struct buf *last)
{
    for (size_t i = 1; i < sizeof std_abbrev / sizeof std_abbrev[0]; i++)
        if (d->p[1] == std_abbrev[i][0][1]) {
            bputs(b, std_abbrev[i][1]);
            if (last) {
                binit(last);
                bputs(last, std_abbrev[i][2]);
            }
            d->p += 2;
            return 1;
        }
    d->p++;
    unsigned long id;
    if (!seq_id(d, &id) || *d->p++ != '_' || id >= (unsigned long)d->nsubs)
        return 0;
    bputs(b, d->subs[id]);
    if (last)
        last_component(d->subs[id], last);
    return 1;
}

/* <template-param> ::= T_ | T <number> _ */
static int template_param(struct dm *d, struct buf *b)
{
    d->p++;
    unsigned long n = 0;
    if (*d->p != '_') {
        if (!number(d, &n))
            return 0;
        n++;
    }
    if (*d->p++ != '_' || n >= (unsigned long)d->ntargs)
        return 0;
    bputs(b, d->targs[n]);
    return 1;
}

/* <nested-name> ::= N [<CV-qualifiers>] [<ref-qualifier>] <prefix> <unqualified-name> E */
static int nested_name(struct dm *d, struct buf *b, struct buf *quals, int *templ, int *kind)
{
    struct buf last;
    binit(&last);
    d->p++;
    while (*d->p == 'r' || *d->p == 'V' || *d->p == 'K') {
        const char *q = *d->p == 'r' ? " restrict" : *d->p == 'V' ? " volatile" : " const";
        if (quals)
            bputs(quals, q);
        d->p++;
    }
    if (*d->p == 'R' || *d->p == 'O') {
        if (quals)
            bputs(quals, *d->p == 'R' ? " &" : " &&");
        d->p++;
    }
    int first = 1;
    while (*d->p && *d->p != 'E') {
        *templ = 0;
        if (*d->p == 'I') {
            if (first || !template_args(d, b, d->in_type == 0))
                return 0;
            *templ = 1;
        } else if (*d->p == 'S' && d->p[1] == 't') {
            if (!first)
                return 0;
            bputs(b, "std");
            d->p += 2;
            first = 0;
            continue; /* std alone is not a candidate */
        } else if (*d->p == 'S') {
            if (!first || !substitution(d, b, &last))
                return 0;
            first = 0;
            continue; /* already a candidate */
        } else if (*d->p == 'T') {
            if (!first || !template_param(d, b))
                return 0;
        } else {
            if (!first)
                bputs(b, "::");
            int k = 0;
            if (!unqualified_name(d, b, &last, &k))
                return 0;
            *kind = k;
        }
        first = 0;
        if (*d->p != 'E' && !add_sub(d, b))
            return 0;
    }
    if (*d->p++ != 'E' || first)
        return 0;
    return !b->bad;
}

/* <local-name> ::= Z <function encoding> E <entity name> [<discriminator>]
 *              |   Z <function encoding> E s [<discriminator>] */
static int local_name(struct dm *d, struct buf *b, struct buf *quals, int *templ, int *kind)
{
    d->p++;
    if (!encoding(d, b) || *d->p++ != 'E')
        return 0;
    bputs(b, "::");
    if (*d->p == 's') {
        bputs(b, "string literal");
        d->p++;
    } else if (*d->p == 'N') { /* its qualifiers are the whole function's (a lambda's const) */
        if (!nested_name(d, b, quals, templ, kind))
            return 0;
    } else {
        int k = 0;
        struct buf last;
        binit(&last);
        if (!unqualified_name(d, b, &last, &k))
            return 0;
        if (*d->p == 'I') {
            if (!template_args(d, b, d->in_type == 0))
                return 0;
            *templ = 1;
        }
    }
    if (*d->p == '_') { /* <discriminator> ::= _ <digit> | __ <number> _ */
        d->p++;
        unsigned long n;
        if (*d->p == '_') {
            d->p++;
            if (!number(d, &n) || *d->p++ != '_')
                return 0;
        } else if (!number(d, &n))
            return 0;
    }
    return !b->bad;
}

/* <name>; *templ: it ends in template arguments (a function template: return type first) */
static int name(struct dm *d, struct buf *b, struct buf *quals, int *templ, int *kind)
{
    *templ = 0;
    if (*d->p == 'L' && d->p[1] >= '0' && d->p[1] <= '9')
        d->p++; /* internal linkage (a static function): not spelled */
    if (*d->p == 'N')
        return nested_name(d, b, quals, templ, kind);
    if (*d->p == 'Z')
        return local_name(d, b, quals, templ, kind);
    if (*d->p == 'S' && d->p[1] == 't') {
        d->p += 2;
        bputs(b, "std::");
        struct buf last;
        binit(&last);
        if (!unqualified_name(d, b, &last, kind))
            return 0;
    } else if (*d->p == 'S') {
        if (!substitution(d, b, NULL))
            return 0;
        if (*d->p != 'I')
            return 1;
        if (!template_args(d, b, d->in_type == 0))
            return 0;
        *templ = 1;
        return !b->bad;
    } else {
        struct buf last;
        binit(&last);
        if (!unqualified_name(d, b, &last, kind))
            return 0;
    }
    if (*d->p == 'I') { /* <unscoped-template-name> <template-args> */
        if (!add_sub(d, b) || !template_args(d, b, d->in_type == 0))
            return 0;
        *templ = 1;
    }
    return !b->bad;
}

static const char *builtin(char c)
{
    switch (c) {
    case 'v':
        return "void";
    case 'w':
        return "wchar_t";
    case 'b':
        return "bool";
    case 'c':
        return "char";
    case 'a':
        return "signed char";
    case 'h':
        return "unsigned char";
    case 's':
        return "short";
    case 't':
        return "unsigned short";
    case 'i':
        return "int";
    case 'j':
        return "unsigned int";
    case 'l':
        return "long";
    case 'm':
        return "unsigned long";
    case 'x':
        return "long long";
    case 'y':
        return "unsigned long long";
    case 'n':
        return "__int128";
    case 'o':
        return "unsigned __int128";
    case 'f':
        return "float";
    case 'd':
        return "double";
    case 'e':
        return "long double";
    case 'g':
        return "__float128";
    case 'z':
        return "...";
    default:
        return NULL;
    }
}

/* <type>: builtin, qualified, pointer/reference, class (nested, unscoped, substituted),
 * template parameter; function, array and member-pointer types are not read */
static int type(struct dm *d, struct buf *b)
{
    if (!enter(d))
        return 0;
    struct buf t;
    binit(&t);
    char c = *d->p;
    const char *bt = builtin(c);
    int ok = 1, candidate = 1;
    if (bt) {
        bputs(b, bt);
        d->p++;
        d->depth--;
        return 1;
    }
    if (c == 'D') {
        const char *x = d->p[1] == 'n'   ? "decltype(nullptr)"
                        : d->p[1] == 'i' ? "char32_t"
                        : d->p[1] == 's' ? "char16_t"
                        : d->p[1] == 'u' ? "char8_t"
                                         : NULL;
        if (!x)
            return 0;
        bputs(b, x);
        d->p += 2;
        d->depth--;
        return 1;
    }
    if (c == 'r' || c == 'V' || c == 'K') {
        const char *q[3];
        int nq = 0;
        while ((*d->p == 'r' || *d->p == 'V' || *d->p == 'K') && nq < 3) {
            q[nq++] = *d->p == 'r' ? " restrict" : *d->p == 'V' ? " volatile" : " const";
            d->p++;
        }
        if (*d->p == 'F')
            return 0;
        ok = type(d, &t);
        for (int i = nq - 1; i >= 0; i--) /* written K V r order: const volatile restrict */
            bputs(&t, q[i]);
    } else if (c == 'P' || c == 'R' || c == 'O') {
        d->p++;
        if (*d->p == 'F' || *d->p == 'A' || *d->p == 'M')
            return 0;
        ok = type(d, &t);
        if (c != 'P' && t.n >= 2 && t.s[t.n - 1] == '&' && t.s[t.n - 2] == '&') {
            if (c == 'R') /* reference collapsing: & to && is & */
                t.s[--t.n] = 0;
        } else if (c != 'P' && t.n && t.s[t.n - 1] == '&')
            ; /* & or && to & is & */
        else
            bputs(&t, c == 'P' ? "*" : c == 'R' ? "&" : "&&");
    } else if (c == 'S' && d->p[1] != 't') {
        ok = substitution(d, &t, NULL);
        candidate = 0;
        if (ok && *d->p == 'I') { /* a substituted template name with arguments */
            ok = template_args(d, &t, 0);
            candidate = 1;
        }
    } else if (c == 'T') {
        ok = template_param(d, &t);
        if (ok && *d->p == 'I') { /* <template-template-param> <template-args> */
            ok = add_sub(d, &t) && template_args(d, &t, 0);
        }
    } else if (c == 'F') { /* a function type, as a template argument: void (int, char) */
        d->p++;
        if (*d->p == 'Y')
            d->p++;
        ok = type(d, &t);
        bputs(&t, " (");
        if (d->p[0] == 'v' && d->p[1] == 'E')
            d->p++;
        for (int first = 1; ok && *d->p && *d->p != 'E'; first = 0) {
            if (!first)
                bputs(&t, ", ");
            if (*d->p == 'R' && d->p[1] == 'E')
                return 0; /* a ref-qualified function type */
            ok = type(d, &t);
        }
        if (!ok || *d->p++ != 'E')
            return 0;
        bputs(&t, ")");
    } else if (c == 'N' || c == 'Z' || (c >= '0' && c <= '9') || (c == 'S' && d->p[1] == 't')) {
        int templ = 0, kind = 0;
        struct buf q;
        binit(&q);
        ok = name(d, &t, &q, &templ, &kind) && !q.n; /* a type's name has no qualifiers */
    } else
        return 0;
    if (!ok || t.bad)
        return 0;
    if (candidate && !add_sub(d, &t))
        return 0;
    bput(b, t.s, t.n);
    d->depth--;
    return !b->bad;
}

/* <encoding> ::= <function name> <bare-function-type> | <data name> | <special-name> */
static int encoding(struct dm *d, struct buf *b)
{
    if (!enter(d))
        return 0;
    const char *special = NULL;
    if (d->p[0] == 'T' && d->p[1] == 'V')
        special = "vtable for ";
    else if (d->p[0] == 'T' && d->p[1] == 'I')
        special = "typeinfo for ";
    else if (d->p[0] == 'T' && d->p[1] == 'S')
        special = "typeinfo name for ";
    else if (d->p[0] == 'G' && d->p[1] == 'V')
        special = "guard variable for ";
    if (special) {
        d->p += 2;
        bputs(b, special);
        int templ = 0, kind = 0;
        struct buf q;
        binit(&q);
        int ok = special[0] == 'g' ? name(d, b, &q, &templ, &kind) && !q.n : type(d, b);
        d->depth--;
        return ok && !b->bad;
    }
    if (d->p[0] == 'T' && d->p[1] == 'h') { /* non-virtual thunk: Th <offset> _ <encoding> */
        d->p += 2;
        if (*d->p == 'n')
            d->p++;
        unsigned long n;
        if (!number(d, &n) || *d->p++ != '_')
            return 0;
        bputs(b, "non-virtual thunk to ");
        int ok = encoding(d, b);
        d->depth--;
        return ok;
    }
    struct buf nm, quals;
    binit(&nm);
    binit(&quals);
    int templ = 0, kind = 0;
    if (!name(d, &nm, &quals, &templ, &kind))
        return 0;
    if (!*d->p || *d->p == 'E' || *d->p == '.') { /* a data name */
        if (quals.n)
            return 0;
        bput(b, nm.s, nm.n);
        d->depth--;
        return !b->bad;
    }
    struct buf ret, params;
    binit(&ret);
    binit(&params);
    d->in_type++; /* template arguments in the signature are the types', not the name's */
    if (templ && !kind) {
        if (!type(d, &ret))
            return 0;
        bputs(&ret, " ");
    }
    if (d->p[0] == 'v' && (!d->p[1] || d->p[1] == 'E' || d->p[1] == '.')) {
        d->p++;
    } else {
        int first = 1;
        while (*d->p && *d->p != 'E' && *d->p != '.') {
            if (!first)
                bputs(&params, ", ");
            first = 0;
            if (!type(d, &params))
                return 0;
        }
    }
    d->in_type--;
    bput(b, ret.s, ret.n);
    bput(b, nm.s, nm.n);
    bputs(b, "(");
    bput(b, params.s, params.n);
    bputs(b, ")");
    bput(b, quals.s, quals.n);
    d->depth--;
    return !b->bad && !params.bad && !ret.bad;
}

int ct_demangle(const char *mangled, char *out, size_t cap)
{
    static struct dm state; /* one at a time: the pool is too large for a thread's stack */
    static char busy;
    if (!mangled || mangled[0] != '_' || mangled[1] != 'Z' || !cap)
        return 0;
    while (__atomic_test_and_set(&busy, __ATOMIC_ACQUIRE))
        sched_yield();
    struct dm *d = &state;
    struct buf b;
    d->pool_used = 0;
    d->nsubs = d->ntargs = d->depth = d->in_type = 0;
    d->p = mangled + 2;
    binit(&b);
    int ok = encoding(d, &b);
    while (ok && *d->p == '.') { /* clone suffixes: .cold, .isra.0, .constprop.0 */
        const char *s = d->p++;
        while (*d->p && *d->p != '.')
            d->p++;
        while (d->p[0] == '.' && d->p[1] >= '0' && d->p[1] <= '9') {
            d->p++;
            while (*d->p >= '0' && *d->p <= '9')
                d->p++;
        }
        bputs(&b, " [clone ");
        bput(&b, s, (size_t)(d->p - s));
        bputs(&b, "]");
    }
    ok = ok && !*d->p && !b.bad && b.n + 1 <= cap;
    if (ok)
        memcpy(out, b.s, b.n + 1);
    __atomic_clear(&busy, __ATOMIC_RELEASE);
    return ok;
}
