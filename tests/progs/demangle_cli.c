/* demangle_cli.c - reads mangled names, one a line, and writes ct_demangle's answer for each
 * (the mangled name itself when it fails), for tests/unit/test_demangle.py. */
#include "demangle.h"
#include <stdio.h>
#include <string.h>

int main(void)
{
    char line[4096], out[2048];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (ct_demangle(line, out, sizeof out))
            puts(out);
        else
            puts(line);
    }
    return 0;
}
