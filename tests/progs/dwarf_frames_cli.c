/* dwarf_frames_cli.c - for each hex address read from stdin (one a line, a link-time address
 * of the ELF file named by argv[1]), writes the frames the shim's DWARF reader gives
 * (native/shim/dwarf.c ct_dwarf_frames, the line table of dwline.c): the address, how many (-1
 * cannot tell), then each frame innermost first as NAME<TAB>FILE<TAB>LINE, NAME demangled by
 * the shim's own demangler ("-" for the concrete function or a name not read), for
 * tests/integration/test_dwarf_inlines.py. */
#include "demangle.h"
#include "dwarf.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    char line[128], name[1024];
    struct ct_dwarf_frame fr[16];
    if (argc != 2)
        return 2;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        int n = ct_dwarf_frames(argv[1], NULL, 0, strtoull(line, NULL, 16), fr, 16);
        printf("%s %d\n", line, n);
        for (int k = 0; k < n; k++) {
            const char *nm = fr[k].name[0] ? fr[k].name : "-";
            if (!strncmp(nm, "_Z", 2) && ct_demangle(nm, name, sizeof name))
                nm = name;
            printf("\t%s\t%s\t%u\n", nm, fr[k].file[0] ? fr[k].file : "-", fr[k].line);
        }
    }
    return 0;
}
