/* The pod sandbox's process (containerd's sandbox image): PID 1 of the pod, holding its
 * namespaces. It waits for signals: SIGINT/SIGTERM end it (exit 0), SIGCHLD reaps every exited
 * child (processes re-parented to PID 1 when the pod shares its PID namespace). Built with
 * `gcc -static` so the image holds this one file. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("meshctl pause 1");
        return 0;
    }
    if (getpid() != 1) {
        fputs("pause: warning: not PID 1; orphans will not be reaped here\n", stderr);
    }
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    sigaction(SIGINT, &on_stop, NULL);
    sigaction(SIGTERM, &on_stop, NULL);
    sigaction(SIGCHLD, &on_child, NULL);
    for (;;) {
        pause();
    }
}
