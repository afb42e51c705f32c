/* dwarf_inlines_cli.c - for each hex address read from stdin (one a line, a link-time address
 * of the ELF file named by argv[1]), writes what the shim's DWARF reader answers (1 inlined
 * code covers it, 0 none, -1 cannot tell), for tests/integration/test_dwarf_inlines.py. */
#include "dwarf.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    char line[128];
    if (argc != 2)
        return 2;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        printf("%s %d\n", line, ct_dwarf_inlined_at(argv[1], NULL, 0, strtoull(line, NULL, 16)));
    }
    return 0;
}
