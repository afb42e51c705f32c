/* exitcode.c - exit statuses and signals, for testing that a wrapper passes them through.
 *
 * usage: exitcode N            exit with status N
 *        exitcode --signal S   raise signal S (default action restored first): dies by S
 *        exitcode --sleep      print "ready", sleep until a catchable signal arrives, then print
 *                              "got signal S" and exit with status 0x40 + S
 * No CUDA calls.
 */
#include <signal.h>
#include <unistd.h>

#include "cudasim_api.h"

static volatile sig_atomic_t g_sig;

static void on_signal(int s)
{
    g_sig = s;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && strcmp(argv[1], "--sleep") != 0 && argv[1][0] != '-')
        return atoi(argv[1]);
    if (argc == 3 && !strcmp(argv[1], "--signal")) {
        int s = atoi(argv[2]);
        signal(s, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, s);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(s);
        return 100; /* the signal was ignored or did not kill */
    }
    if (argc == 2 && !strcmp(argv[1], "--sleep")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        for (int s = 1; s < NSIG; s++) {
            if (s == SIGKILL || s == SIGSTOP || s == SIGCHLD || s == SIGTSTP || s == SIGTTIN ||
                s == SIGTTOU || s == SIGWINCH || s == SIGCONT || s == SIGURG)
                continue;
            sigaction(s, &sa, NULL);
        }
        /* every caught signal blocked until the wait: one that comes between the test of g_sig
         * and the wait ends sigsuspend instead of being lost (pause() would sleep for ever) */
        sigset_t all, none;
        sigfillset(&all);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &all, NULL);
        printf("ready\n");
        fflush(stdout);
        while (!g_sig)
            sigsuspend(&none);
        printf("got signal %d\n", (int)g_sig);
        fflush(stdout);
        return 0x40 + g_sig;
    }
    fprintf(stderr, "usage: exitcode N | --signal S | --sleep\n");
    return 2;
}
