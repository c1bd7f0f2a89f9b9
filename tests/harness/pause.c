/* The node's sandbox ("pause") process for tests/harness/images.py: PID 1 of every pod sandbox.
 * It holds the pod's namespaces open, reaps children that get reparented to it, and exits on
 * SIGINT/SIGTERM (PID 1 has no default signal actions, so it must ask for them). Built static with
 * the machine's gcc; nothing else is in its image. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction stop = {.sa_handler = quit};
    struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGCHLD, &child, NULL);
    for (;;) pause();
}
