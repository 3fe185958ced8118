/* cuda_executor: the executor table over CUDA kernels and cuBLAS (see
 * cuda_executor.h). The executor is plain C compiled by the C compiler;
 * this file holds its table, creation and destruction; the step's path,
 * file by file, is in cuda_exec_internal.h (memory and staging, step
 * metadata, the ops, the logits, CUDA graphs). The executor owns the device,
 * the stream, the cuBLAS wrapper, the step metadata on the device and the
 * small workspaces, and forwards each op to its launcher (cuda_kernels.h).
 *
 * Bytes per decode step (why the design is what it is). At batch B a decode
 * step reads every weight once (Llama-3-8B in bf16: 16 GB), the KV context of
 * every sequence (2 * n_layers * nkv * hd * 2 B = 128 KiB per token for
 * Llama-3-8B) and moves a few MB of activations. On an H100 (≈3.35 TB/s
 * HBM3; ~3 TB/s achievable) the weights alone take ≈5 ms: at B = 1 the step
 * is bandwidth-bound and its floor is ~5 ms (≈200 tok/s); each extra
 * sequence adds only its KV reads (1k context: 128 MiB ≈ 0.04 ms), which is
 * why the scheduler's job is to keep the batch full. GEMMs turn
 * compute-bound around B ≈ 300 (989 TFLOP/s bf16 dense / 3.35 TB/s ≈ 295
 * flops per weight byte, 2 flops per weight per sequence).
 */
#include "cuda_executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_exec_internal.h"

int cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error state */
        return 0;
    }
    return n < 0 ? 0 : n;
}

cuda_executor_params cuda_executor_params_default(void)
{
    cuda_executor_params p = {0, 0, 0, 0};
    return p;
}

static void cuda_destroy(executor *ex)
{
    if (!ex)
        return;
    cuda_exec *c = cx(ex);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    cx_graph_free(c->graphs);
    cuda_sprof_destroy(c->sprof);
    cuda_gemm_destroy(c->gemm);
    cx_pinned_free(&c->meta_h);
    cx_pinned_free(&c->pairs_h);
    cx_pinned_free(&c->logits_h);
    cx_pinned_free(&c->ids_h);
    cx_pinned_free(&c->lp_req_h);
    cuda_smp_free(&c->smp);
    cx_pinned_free(&c->lp_out_h);
    cx_pinned_free(&c->stage[0]);
    cx_pinned_free(&c->stage[1]);
    cx_pinned_free(&c->moe.ids_h);
    cx_pinned_free(&c->moe.plan_h);
    if (c->moe.plan_d)
        cudaFree(c->moe.plan_d);
    if (c->moe.work_d)
        cudaFree(c->moe.work_d);
    free(c->moe.off);
    if (c->meta_d)
        cudaFree(c->meta_d);
    if (c->ws_d)
        cudaFree(c->ws_d);
    if (c->logits_d)
        cudaFree(c->logits_d);
    if (c->pairs_d)
        cudaFree(c->pairs_d);
    if (c->ids_d)
        cudaFree(c->ids_d);
    if (c->lp_req_d)
        cudaFree(c->lp_req_d);
    if (c->lp_out_d)
        cudaFree(c->lp_out_d);
    if (c->lora_u_d)
        cudaFree(c->lora_u_d);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c->allocs);
    free(c);
}

static const char *cuda_last_error(executor *ex)
{
    return cx(ex)->err.msg;
}

cuda_launch_counts cx_counts(const cuda_exec *c)
{
    cuda_launch_counts n = {.kernels = c->lk.kernels};
    if (c->gemm)
        cuda_gemm_counts(c->gemm, &n.gemms, &n.copies);
    n.total = n.kernels + n.gemms + n.copies;
    return n;
}

static const executor_ops cuda_ops;

/* --profile-steps (executor.h set_step_profile, op_mark; cuda_step_profile.h) */
static void cx_set_step_profile(executor *ex, step_profile *p)
{
    cuda_exec *c = cx(ex);
    if (cuda_sprof_set(&c->sprof, p) != 0)
        fprintf(stderr, "pagedgen: warning: cuda: out of memory for the step profile\n");
}

static void cx_op_mark(executor *ex, int op)
{
    cuda_exec *c = cx(ex);
    cuda_sprof_mark(c->sprof, op, c->stream, cx_graph_bound(c), cx_counts(c).total);
}

cuda_exec *cx_as_cuda(executor *ex)
{
    return ex && ex->op == &cuda_ops ? cx(ex) : NULL;
}

/* An asynchronous step (executor.h defer_step / wait_step): the next
 * run_step returns with its copy-out queued (cx_logits_out), wait_step
 * waits for it (cx_logits_finish). */
static int cx_defer_step(executor *ex)
{
    cx(ex)->defer_next = 1;
    return 0;
}

static int cx_wait_step(executor *ex)
{
    return cx_logits_finish(cx(ex));
}

static const executor_ops cuda_ops = {
    .destroy = cuda_destroy,
    .last_error = cuda_last_error,
    .mem_info = cx_mem_info,
    .alloc = cx_alloc,
    .free = cx_free,
    .upload = cx_upload,
    .download_f32 = cx_download_f32,
    .sync = cx_sync,
    .begin_step = cx_begin_step,
    .embed = cx_embed,
    .rmsnorm = cx_rmsnorm,
    .matmul = cx_matmul,
    .add_bias = cx_add_bias,
    .qk_norm = cx_qk_norm,
    .rope = cx_rope,
    .kv_write = cx_kv_write,
    .attention = cx_attention,
    .silu_mul = cx_silu_mul,
    .gather_rows = cx_gather_rows,
    .logits = cx_logits,
    .copy_blocks = cx_copy_blocks,
    .run_step = cx_run_step,
    .greedy_rows = cuda_executor_greedy_next_step,
    .logprob_rows = cuda_executor_logprob_rows,
    .sample_rows = cuda_executor_sample_rows,
    .rope_kv = cx_rope_kv,
    .set_step_profile = cx_set_step_profile,
    .op_mark = cx_op_mark,
    .defer_step = cx_defer_step,
    .wait_step = cx_wait_step,
    .lora_add = cx_lora_add,
    .moe_route = cx_moe_route,
    .moe_experts = cx_moe_experts,
    .moe_shared_add = cx_moe_shared_add,
};

void cuda_executor_launch_counts(executor *ex, cuda_launch_counts *total,
                                 cuda_launch_counts *last_step)
{
    cuda_exec *c = cx_as_cuda(ex);
    const cuda_launch_counts zero = {0, 0, 0, 0};
    if (total)
        *total = c ? cx_counts(c) : zero;
    if (last_step)
        *last_step = c ? c->last_step : zero;
}

int cuda_executor_create(executor **out, const cuda_executor_params *p, pg_error *err)
{
    cuda_executor_params def = cuda_executor_params_default();
    if (!p)
        p = &def;
    if (p->precision != 0 && p->precision != 1)
        return pg_error_set(err, PG_EINVAL, "cuda executor: precision %d: expected 0 (bf16) or 1 (f32)",
                            p->precision);
    if (p->precision == 0 && p->kv_dtype != 0 && p->kv_dtype != 1)
        return pg_error_set(err, PG_EINVAL, "cuda executor: kv_dtype %d: expected 0 (bf16) or 1 (fp16)",
                            p->kv_dtype);
    int n = cuda_device_count();
    if (n == 0)
        return pg_error_set(err, PG_EDEVICE, "cuda executor: no CUDA device (or no driver) found");
    if (p->device < 0 || p->device >= n)
        return pg_error_set(err, PG_EINVAL, "cuda executor: device %d: expected 0 .. %d",
                            (int)p->device, n - 1);
    CUDA_TRY(err, "cudaSetDevice", cudaSetDevice(p->device));

    cuda_exec *c = calloc(1, sizeof *c);
    if (!c)
        return pg_error_set(err, PG_ENOMEM, "cuda executor: out of host memory");
    c->device = p->device;
    c->act_dt = c->wt_dt = p->precision == 1 ? PGK_F32 : PGK_BF16;
    c->kv_dt = p->precision == 1 ? PGK_F32 : (p->kv_dtype == 1 ? PGK_F16 : PGK_BF16);
    const char *sync = getenv("PAGEDGEN_CUDA_SYNC");
    c->lk.sync_each = sync && strcmp(sync, "1") == 0;
    c->base.op = &cuda_ops;
    c->base.name = "cuda";
    c->base.act_bytes = pgk_dtype_bytes(c->act_dt);
    c->base.wt_bytes = pgk_dtype_bytes(c->wt_dt);
    c->base.kv_bytes = pgk_dtype_bytes(c->kv_dt);

    int rc;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        c->stream = NULL;
        rc = cx_fail(err, PG_EDEVICE, "cudaStreamCreate", e);
        goto fail;
    }
    c->lk.st = c->stream;
    c->lk.err = &c->err;
    rc = cuda_gemm_create(&c->gemm, c->stream, err);
    if (rc) {
        pg_error_wrap(err, rc, "cuda executor on device %d", (int)p->device);
        goto fail;
    }
    cuda_gemm_set_fixed_rows(c->gemm, p->fast_gemm ? 0 : CUDA_GEMM_FIXED_ROWS);
    /* small-batch products on gpu/gemv.cu (cuda_gemm.h): off unless asked */
    const char *gemv = getenv("PAGEDGEN_CUDA_GEMV");
    if (gemv && strcmp(gemv, "on") == 0)
        cuda_gemm_set_gemv(c->gemm, CUDA_GEMM_GEMV_ON);
    else if (gemv && strcmp(gemv, "auto") == 0)
        cuda_gemm_set_gemv(c->gemm, CUDA_GEMM_GEMV_AUTO);
    else if (gemv && *gemv && strcmp(gemv, "off") != 0) {
        rc = pg_error_set(err, PG_EINVAL, "cuda executor: PAGEDGEN_CUDA_GEMV=%s: expected off, on or auto",
                          gemv);
        goto fail;
    }
    *out = &c->base;
    return 0;
fail:
    cuda_destroy(&c->base);
    return rc;
}

