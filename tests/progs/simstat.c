/* simstat.c - print the simulated devices' shared state (CUDASIM_STATE), after giving back the
 * memory of processes that ended. Uses the simulator's test entry points; no CUDA calls, so it
 * changes nothing. Run WITHOUT the tracer preloaded.
 *
 * usage: simstat
 * Prints one line per device, then one per process slot in use:
 *     dev D total T used U hwm H free F
 *     pid D P used U hwm H
 */
#include "cudasim_api.h"

int main(void)
{
    for (int d = 0; d < 8; d++) {
        unsigned long long used, hwm, total;
        if (cudasim_device_stats(d, &used, &hwm, &total) < 0)
            break;
        printf("dev %d total %llu used %llu hwm %llu free %llu\n", d, total, used, hwm,
               used < total ? total - used : 0ULL);
    }
    for (int d = 0; d < 8; d++) {
        unsigned long long used, hwm;
        int pid;
        int k;
        for (k = 0; k < 64; k++) {
            int r = cudasim_pid_stats(d, k, &pid, &used, &hwm);
            if (r < 0)
                break;
            if (r > 0)
                printf("pid %d %d used %llu hwm %llu\n", d, pid, used, hwm);
        }
        if (k < 64)
            break;
    }
    return 0;
}
