//go:build mlx

#include <pthread.h>
#include <string.h>

#include "mlx/c/error.h"

static __thread char mlxs_errbuf[4096];
static __thread int mlxs_errset;
static pthread_once_t mlxs_once = PTHREAD_ONCE_INIT;

static void mlxs_handler(const char* msg, void* data) {
  (void)data;
  strncpy(mlxs_errbuf, msg, sizeof(mlxs_errbuf) - 1);
  mlxs_errbuf[sizeof(mlxs_errbuf) - 1] = 0;
  mlxs_errset = 1;
}

static void mlxs_install(void) { mlx_set_error_handler(mlxs_handler, NULL, NULL); }

// mlxs_init installs the error handler once per process. MLX's default
// handler prints and exits; this one records the message for the calling
// thread.
void mlxs_init(void) { pthread_once(&mlxs_once, mlxs_install); }

// mlxs_take_error returns the calling thread's last MLX error message, or
// NULL, and clears it. The buffer stays valid until the thread's next MLX
// error.
const char* mlxs_take_error(void) {
  if (!mlxs_errset) return NULL;
  mlxs_errset = 0;
  return mlxs_errbuf;
}
