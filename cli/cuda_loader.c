/* cuda_loader: dlopen of the CUDA module and the driver probe (see
 * cuda_loader.h). */
#include "cuda_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef PAGEDGEN_VERSION
#define PAGEDGEN_VERSION "unknown"
#endif
/* The install layout's module directory relative to the executable's (meson). */
#ifndef CLI_CUDA_MODULE_REL
#define CLI_CUDA_MODULE_REL "../lib/pagedgen"
#endif

/* The directory of the running executable into dir (no trailing '/'); 0 on
 * success. */
static int exe_dir(char *dir, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", dir, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1)
        return -1;
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    return 0;
}

/* Checks the table against this binary's view of the shared structs. */
static int check_table(const cuda_module *m, const char *path, pg_error *err)
{
    if (!m)
        return pg_error_set(err, PG_EFORMAT, "cuda module '%s': expected abi %u, the module refused it",
                            path, CUDA_MODULE_ABI);
    if (m->abi != CUDA_MODULE_ABI || m->table_bytes != sizeof(cuda_module) ||
        m->executor_bytes != sizeof(executor) || m->executor_ops_bytes != sizeof(executor_ops) ||
        m->params_bytes != sizeof(cuda_executor_params) || m->error_bytes != sizeof(pg_error))
        return pg_error_set(err, PG_EFORMAT,
                            "cuda module '%s': expected abi %u with structs of %zu/%zu/%zu/%zu/%zu bytes, "
                            "got abi %u with %u/%u/%u/%u/%u (a module from another build)",
                            path, CUDA_MODULE_ABI, sizeof(cuda_module), sizeof(executor), sizeof(executor_ops),
                            sizeof(cuda_executor_params), sizeof(pg_error), m->abi, m->table_bytes,
                            m->executor_bytes, m->executor_ops_bytes, m->params_bytes, m->error_bytes);
    if (!m->version || strcmp(m->version, PAGEDGEN_VERSION) != 0)
        return pg_error_set(err, PG_EFORMAT, "cuda module '%s': expected pagedgen %s, got %s", path,
                            PAGEDGEN_VERSION, m->version ? m->version : "(none)");
    if (!m->device_count || !m->executor_params_default || !m->executor_create || !m->executor_set_graphs ||
        !m->executor_graph_stats || !m->executor_launch_counts)
        return pg_error_set(err, PG_EFORMAT, "cuda module '%s': expected every entry of the table, got a NULL",
                            path);
    return PG_OK;
}

/* dlopen + dlsym + check of one path. 1 when the file does not exist (the
 * next place is tried), PG_OK when loaded, an error otherwise. */
static int try_path(const cuda_module **out, const char *path, pg_error *err)
{
    if (access(path, F_OK) != 0)
        return 1;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "--device cuda: cannot load the CUDA module %s: %s (are the CUDA runtime "
                            "and cuBLAS libraries installed and on the loader's path?)",
                            path, e ? e : "unknown dlopen error");
    }
    void *sym = dlsym(h, CUDA_MODULE_ENTRY);
    if (!sym) {
        dlclose(h);
        return pg_error_set(err, PG_EFORMAT, "cuda module '%s': expected the symbol %s, not found", path,
                            CUDA_MODULE_ENTRY);
    }
    cuda_module_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry); /* ISO C has no cast from void * to a function pointer */
    const cuda_module *m = entry(CUDA_MODULE_ABI);
    int rc = check_table(m, path, err);
    if (rc != PG_OK) {
        dlclose(h);
        return rc;
    }
    *out = m; /* h stays open: executors the module creates point into it */
    return PG_OK;
}

int cli_cuda_load(const cuda_module **out, pg_error *err)
{
    *out = NULL;
    const char *env = getenv(CLI_CUDA_MODULE_ENV);
    if (env && *env) {
        int rc = try_path(out, env, err);
        if (rc == 1)
            return pg_error_set(err, PG_EUNSUPPORTED, "--device cuda: %s=%s: the file does not exist",
                                CLI_CUDA_MODULE_ENV, env);
        return rc;
    }
    char dir[PATH_MAX], path[2][PATH_MAX + 64];
    if (exe_dir(dir, sizeof dir) != 0)
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "--device cuda: cannot read /proc/self/exe to find %s (set %s to its path)",
                            CUDA_MODULE_FILE, CLI_CUDA_MODULE_ENV);
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            snprintf(path[i], sizeof path[i], "%s/%s", dir, CUDA_MODULE_FILE);
        else if (CLI_CUDA_MODULE_REL[0] == '/') /* an absolute libdir */
            snprintf(path[i], sizeof path[i], "%s/%s", CLI_CUDA_MODULE_REL, CUDA_MODULE_FILE);
        else
            snprintf(path[i], sizeof path[i], "%s/%s/%s", dir, CLI_CUDA_MODULE_REL, CUDA_MODULE_FILE);
        int rc = try_path(out, path[i], err);
        if (rc != 1)
            return rc;
    }
#ifdef CLI_CUDA_MODULE_BUILT
    const char *hint = "this pagedgen was built with CUDA, but its module is missing: install it beside the "
                       "binary, or set " CLI_CUDA_MODULE_ENV;
#else
    const char *hint = "this pagedgen was built without CUDA (meson -Dcuda=enabled builds the module)";
#endif
    return pg_error_set(err, PG_EUNSUPPORTED, "--device cuda: no CUDA module (%s and %s do not exist): %s",
                        path[0], path[1], hint);
}

/* The two driver API calls the probe needs (cuda.h's signatures: CUresult
 * is an int enum, 0 = CUDA_SUCCESS). */
typedef int (*cu_init_fn)(unsigned flags);
typedef int (*cu_device_get_count_fn)(int *count);

int cli_cuda_driver_device_count(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return 0;
    void *sym_init = dlsym(h, "cuInit"), *sym_count = dlsym(h, "cuDeviceGetCount");
    int n = 0;
    if (!sym_init || !sym_count)
        return 0;
    cu_init_fn init;
    cu_device_get_count_fn count;
    memcpy(&init, &sym_init, sizeof init);
    memcpy(&count, &sym_count, sizeof count);
    if (init(0) != 0 || count(&n) != 0 || n < 0)
        n = 0;
    /* not dlclose()d: the module's cudart opens the same driver next */
    return n;
}
