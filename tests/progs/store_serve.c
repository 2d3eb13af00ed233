/*
 * Test helper: serves the job's store (src/comm/store.h) on 127.0.0.1:PORT until killed, as a
 * multi-machine accel launch's machine 0 launcher does (its processes then get
 * ACCEL_STORE_SERVED=1 and only connect). Prints "ready" once serving.
 *   store_serve PORT
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "comm/store.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: store_serve PORT\n");
        return 2;
    }
    accel__store_config cfg = {
        .addr = "127.0.0.1", .port = atoi(argv[1]), .serve = 1, .timeout_s = 10};
    accel__store *st;
    if (accel__store_open(&st, &cfg) != ACCEL_OK) {
        fprintf(stderr, "store_serve: cannot serve port %s\n", argv[1]);
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        pause();
    }
}
