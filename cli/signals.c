/* signals: SIGINT/SIGTERM -> "stop admitting, flush, exit 130".
 * The flag is the one piece of process-wide state in pagedgen: a signal
 * handler has nowhere else to write. Installed without SA_RESTART so that a
 * blocking read of stdin returns EINTR and the loop sees the flag. */
#include <signal.h>
#include <stdbool.h>
#include <string.h>

#include "run.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

void cli_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

bool cli_signals_stop_requested(void) { return stop_requested != 0; }
