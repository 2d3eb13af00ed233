/*
 * The config file in the library (src/core/config.c): accel_init reads it with the shared
 * reader (base/config.h) and logs what it has to say about it, once per process.
 */
#ifndef ACCEL_CORE_CONFIG_H
#define ACCEL_CORE_CONFIG_H

#include "base/config.h"
#include "internal.h"

/* Logs the file's notes as warnings, each once per process (calls with the same lines stay
 * silent), unless accel launch already printed them (ACCEL_CONFIG_CHECKED names this file).
 * `launched`: a launcher set the process layout; when not, a file asking for several
 * processes or machines gets a warning saying how to start them. Call on the main process. */
void accel__config_warn(const accel__config *c, int launched);

#endif
