/* model: the LLaMA forward over a ragged step_batch (see model.h).
 *
 * Names: H hidden_size, I intermediate_size, nh / nkv query / kv heads, hd
 * head_dim, V vocab_size, NL layers, T step tokens, S step sequences, L rows
 * that need logits. Q = nh*hd, KVD = nkv*hd, QKV = Q + 2*KVD.
 *
 * The math follows llama2.c run.c's forward() (which made the goldens) and
 * Hugging Face's LlamaDecoderLayer, with the residual adds fused into the
 * following rmsnorm (executor rmsnorm with a residual argument):
 *
 *   x = embed(tokens)                                      residual stream
 *   for each layer l:
 *     h = rmsnorm(x) * w_in                                (l > 0: x += mlp_out first)
 *     q,k,v = h @ w_qkv^T (+ b_qkv: Qwen2)
 *     q,k = rmsnorm over each head * w_qn, w_kn            (Qwen3)
 *     rope(q, k) ; cache[l] <- k, v
 *     a = attention(q, cache[l], the layer's window) @ w_o^T
 *     h = rmsnorm(x += a) * w_post
 *     m = (silu(h @ w_gate^T) * (h @ w_up^T)) @ w_down^T    = mlp_out
 *   rows = the L sampling rows of (x + mlp_out), final rmsnorm, @ lm_head^T
 *
 * A mixture-of-experts layer (llama_layer_moe: Mixtral, Qwen2-MoE, Qwen3-MoE)
 * replaces the last line (forward_moe):
 *     ids, w = top-k of softmax_f32(h @ w_router^T)          (moe_route)
 *     m = sum over ranks r of w_r * expert_{ids_r}(h)          (moe_experts)
 *     [Qwen2-MoE: m += sigmoid(h @ w_sgate^T) * shared_expert(h)]
 *
 * What a family changes is data (cfg->family, config.h): the bracketed
 * steps run only where the family's struct asks for them, so a Llama runs
 * exactly the ops it always did. Qwen2: modeling_qwen2.py Qwen2Attention
 * (q/k/v_proj bias=True); Qwen3: modeling_qwen3.py Qwen3Attention
 * (q_norm(q_proj(x).view(.., head_dim)) before apply_rotary_pos_emb).
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lora_adapter.h"
#include "rope_table.h"

/* One projection of one layer across the resident LoRA slots
 * (model_lora_add): host arrays [lora_cap] of device pointers. */
typedef struct model_lora_proj {
    void **A;           /* [slot] [rank][in] act, NULL: the slot does not adapt it */
    void **B;           /* [slot] [out][rank] act */
    float *scale;       /* [slot] */
    int32_t *rank;      /* [slot] */
    int32_t n_adapted;  /* slots that adapt it (0: no lora_add call) */
} model_lora_proj;

typedef struct model_layer {
    float *attn_norm;   /* [H] f32  input_layernorm.weight */
    void *w_qkv;        /* [QKV][H] wt  rows: q_proj (Q), k_proj (KVD), v_proj (KVD) */
    float *b_qkv;       /* [QKV] f32  q_proj.bias | k_proj.bias | v_proj.bias (family.qkv_bias), else NULL */
    float *q_norm;      /* [hd] f32   self_attn.q_norm.weight (family.qk_norm), else NULL */
    float *k_norm;      /* [hd] f32   self_attn.k_norm.weight (family.qk_norm), else NULL */
    void *w_o;          /* [H][Q] wt    o_proj */
    float *mlp_norm;    /* [H] f32  post_attention_layernorm.weight */
    void *w_gate_up;    /* [2I][H] wt   rows: gate_proj (I), up_proj (I) */
    void *w_down;       /* [H][I] wt    down_proj */
    /* A mixture-of-experts layer (llama_layer_moe), else all NULL. Its
     * w_gate_up / w_down above are Qwen2-MoE's shared expert
     * (mlp.shared_expert.*, [2Is][H], [H][Is]) or NULL (no shared expert). */
    void *w_router;     /* [E][H] wt    mlp.gate.weight (Mixtral: block_sparse_moe.gate.weight) */
    void **w_exp_gate_up; /* [E] host array of [2Ie][H] wt: experts.e.gate_proj | up_proj (Mixtral w1 | w3) */
    void **w_exp_down;  /* [E] host array of [H][Ie] wt: experts.e.down_proj (Mixtral w2) */
    void *w_sgate;      /* [1][H] wt    mlp.shared_expert_gate.weight (Qwen2-MoE), else NULL */
    /* The experts' matrices in two buffers, [E][2Ie][H] and [E][H][Ie] wt,
     * that w_exp_gate_up / w_exp_down point into (one allocation each: huge
     * pages, where 1.5 MB experts alone would stream through 4 KiB pages);
     * NULL when an expert's size is not whole weight blocks (then each
     * expert has its own buffer). */
    void *w_exp_gate_up_all, *w_exp_down_all;
} model_layer;

struct model {
    executor *ex;                 /* borrowed */
    const llama_config *cfg;      /* borrowed */
    model_params p;
    int32_t H, I, NL, nh, nkv, hd, V, Q, KVD, QKV;

    /* weights (device) */
    void *embed;                  /* [V][H] wt  model.embed_tokens.weight */
    void *lm_head;                /* [V][H] wt  lm_head.weight, or == embed when tied, or
                                     NULL: a headless embedding checkpoint (see pfx) */
    const char *pfx;              /* tensor names' prefix: "model.", or "" for a base model
                                     saved alone (sentence-transformers: Qwen3-Embedding) */
    float *final_norm;            /* [H] f32    model.norm.weight */
    model_layer *layers;          /* [NL] (host array of device pointers) */
    float *inv_freq;              /* [hd/2] f32 RoPE inverse frequencies, scaling folded in */

    /* KV cache (device): [NL][2][num_blocks][block_size][nkv][hd] kv;
     * plane 2l is layer l's K, plane 2l+1 its V. */
    void *kv;
    size_t plane_elems;           /* num_blocks * block_size * nkv * hd */
    size_t block_elems;           /* block_size * nkv * hd */

    /* workspace (device), Tmax = max_num_batched_tokens, Smax = max_num_seqs */
    void *x;                      /* [Tmax][H] act    residual stream */
    void *normed;                 /* [Tmax][H] act    rmsnorm output */
    void *proj;                   /* [Tmax][H] act    o_proj / down_proj output */
    void *qkv;                    /* [Tmax][QKV] act */
    void *attn;                   /* [Tmax][Q] act    attention output */
    void *gate_up;                /* [Tmax][2I] act */
    void *mlp;                    /* [Tmax][I] act    silu(gate) * up */
    void *rows_x;                 /* [Smax][H] act    gathered residual rows */
    void *rows_mlp;               /* [Smax][H] act    gathered last mlp_out rows */
    void *rows_out;               /* [Smax][H] act    final-normed rows */
    /* MoE workspace (NULL for dense models); E experts, k per token */
    void *router;                 /* [Tmax][E] act    router logits */
    int32_t *moe_ids;             /* [Tmax][k] i32    routed experts, rank order */
    float *moe_wts;               /* [Tmax][k] f32    their weights */
    void *sgate;                  /* [Tmax][1] act    shared-expert gate logit (Qwen2-MoE) */
    void *shared;                 /* [Tmax][H] act    shared-expert output (Qwen2-MoE) */
    int32_t I_mlp;                /* max(I, shared expert's): gate_up / mlp widths */

    /* LoRA adapters (model_lora_add): n_lora resident slots, arrays of
     * lora_cap; per layer and projection (lora_proj order) */
    int32_t n_lora, lora_cap;
    model_lora_proj *lora;        /* [NL * LORA_NPROJ], NULL before the first adapter */

    op_profile *prof;             /* borrowed, NULL: no timing (model_set_op_profile) */
    int op_marks;                 /* the executor times ops on the device (model_set_step_profile) */
    int prof_kind;                /* OPP_PREFILL or OPP_DECODE: the step being run */
    /* logprob rows of the next forward (model_logprob_rows; borrowed) */
    pg_lsm_row *lp_rows;          /* [lp_L] */
    int32_t lp_L;                 /* 0: none pending */
};

/* ---- sizes ---------------------------------------------------------------- */

size_t model_kv_bytes_per_block(const llama_config *cfg, const executor *ex, int32_t block_size)
{
    return (size_t)cfg->num_hidden_layers * 2u * (size_t)block_size *
           (size_t)cfg->num_key_value_heads * (size_t)cfg->head_dim * ex->kv_bytes;
}

size_t model_weight_bytes(const llama_config *cfg, const executor *ex)
{
    size_t H = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size;
    size_t Q = (size_t)cfg->num_attention_heads * (size_t)cfg->head_dim;
    size_t KVD = (size_t)cfg->num_key_value_heads * (size_t)cfg->head_dim;
    size_t V = (size_t)cfg->vocab_size;
    size_t per_layer_wt = (Q + 2 * KVD) * H + H * Q;
    size_t wt = V * H * (cfg->tie_word_embeddings ? 1u : 2u) +
                (size_t)cfg->num_hidden_layers * per_layer_wt;
    const llama_family *f = &cfg->family;
    for (int32_t l = 0; l < cfg->num_hidden_layers; l++) {
        if (!llama_layer_moe(cfg, l)) {
            wt += 3u * I * H;
            continue;
        }
        /* router, experts, shared expert + its gate */
        wt += (size_t)f->n_experts * H * (1u + 3u * (size_t)f->moe_intermediate_size);
        if (f->shared_expert_intermediate_size > 0)
            wt += 3u * (size_t)f->shared_expert_intermediate_size * H + H;
    }
    size_t f32 = (size_t)cfg->num_hidden_layers * 2u * H + H + (size_t)cfg->head_dim / 2u;
    if (cfg->family.qkv_bias)
        f32 += (size_t)cfg->num_hidden_layers * (Q + 2 * KVD);
    if (cfg->family.qk_norm)
        f32 += (size_t)cfg->num_hidden_layers * 2u * (size_t)cfg->head_dim;
    return exec_wt_bytes(ex, wt) + f32 * 4u;
}

/* ---- load ----------------------------------------------------------------- */

static const char *kind_name(exec_buf_kind k)
{
    switch (k) {
    case EXEC_ACT: return "act";
    case EXEC_WT: return "weight";
    case EXEC_KV: return "kv";
    case EXEC_F32: return "f32";
    case EXEC_I32: return "i32";
    }
    return "?";
}

/* Allocates n elements of kind for `what`; on failure the message gives the
 * sizes and what the device reports as free. */
static void *model_alloc(model *m, exec_buf_kind kind, size_t n, const char *what, int *rc,
                         pg_error *err)
{
    executor *ex = m->ex;
    size_t eb = exec_kind_bytes(ex, kind);
    if (n == 0 || n > SIZE_MAX / eb) {
        *rc = pg_error_set(err, PG_ENOMEM, "model: %s: %zu %s elements overflow size_t",
                           what, n, kind_name(kind));
        return NULL;
    }
    void *p = ex->op->alloc(ex, kind, n);
    if (!p) {
        size_t free_b = 0, total_b = 0;
        int have = ex->op->mem_info(ex, &free_b, &total_b) == 0;
        char mem[160] = "";
        if (have)
            snprintf(mem, sizeof mem, " (%s device: %zu bytes free of %zu)", ex->name,
                     free_b, total_b);
        *rc = pg_error_set(err, PG_ENOMEM,
                           "model: out of memory allocating %s: %zu %s elements x %zu bytes = "
                           "%zu bytes%s: %s",
                           what, n, kind_name(kind), eb, n * eb, mem, ex->op->last_error(ex));
    }
    return p;
}

/* Loading without a second copy of the weights (issue 13): a tensor is
 * uploaded in chunks of MODEL_UPLOAD_CHUNK elements (a multiple of every
 * block size an executor stores weights in), and the pages of the
 * checkpoint's read-only mapping that a chunk came from are dropped from
 * this process right after (MADV_DONTNEED on a clean file mapping: they
 * stay in the page cache, and reading them again faults them back in). So
 * the resident set while loading is the executor's copy plus one chunk, not
 * the executor's copy plus the whole mapped file. */
#define MODEL_UPLOAD_CHUNK ((size_t)1 << 22)

static void release_source(const void *p, size_t bytes)
{
#if defined(MADV_DONTNEED)
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (page == 0 || page == (uintptr_t)-1)
        return;
    /* only whole pages inside the range: the neighbours' bytes stay mapped in */
    const uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + bytes) / page * page;
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
    (void)p;
    (void)bytes;
#endif
}

/* Checks tensor `name` is [d0] or [d0][d1] of a float dtype and uploads it
 * to dst (a buffer of kind) at element offset dst_off (in chunks, see
 * above). */
static int load_tensor(model *m, const st_file *w, const char *name, int ndim, int64_t d0,
                       int64_t d1, void *dst, exec_buf_kind kind, size_t dst_off, pg_error *err)
{
    int64_t shape[2] = {d0, d1};
    const st_tensor *t = NULL;
    int rc = st_get(w, name, 1, ST_F32, ndim, shape, &t, err);
    if (rc)
        return pg_error_wrap(err, rc, "model");
    size_t n = (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1u);
    const size_t es = st_dtype_size(t->dtype);
    for (size_t i = 0; i < n; i += MODEL_UPLOAD_CHUNK) {
        const size_t c = n - i < MODEL_UPLOAD_CHUNK ? n - i : MODEL_UPLOAD_CHUNK;
        const char *src = (const char *)t->data + i * es;
        rc = m->ex->op->upload(m->ex, dst, kind, dst_off + i, src, t->dtype, c);
        if (rc)
            return pg_error_set(err, rc, "model: uploading tensor '%s' (%zu elements): %s", name, n,
                                m->ex->op->last_error(m->ex));
        release_source(src, c * es);
    }
    return PG_OK;
}

static int check_config(const llama_config *c, const model_params *p, pg_error *err)
{
    if (c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_hidden_layers <= 0 ||
        c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 || c->head_dim <= 0 ||
        c->vocab_size <= 0 || c->head_dim % 2 != 0 ||
        c->num_attention_heads % c->num_key_value_heads != 0)
        return pg_error_set(err, PG_EINVAL,
                            "model: invalid config: hidden_size %d, intermediate_size %d, "
                            "layers %d, heads %d, kv heads %d, head_dim %d, vocab %d",
                            (int)c->hidden_size, (int)c->intermediate_size,
                            (int)c->num_hidden_layers, (int)c->num_attention_heads,
                            (int)c->num_key_value_heads, (int)c->head_dim, (int)c->vocab_size);
    if (p->num_kv_blocks <= 0 || p->block_size <= 0 || p->max_num_batched_tokens <= 0 ||
        p->max_num_seqs <= 0)
        return pg_error_set(err, PG_EINVAL,
                            "model: invalid params: num_kv_blocks %d, block_size %d, "
                            "max_num_batched_tokens %d, max_num_seqs %d (all must be > 0)",
                            (int)p->num_kv_blocks, (int)p->block_size,
                            (int)p->max_num_batched_tokens, (int)p->max_num_seqs);
    return PG_OK;
}

/* A fresh buffer of kind holding tensor `name` ([d0], or [d0][d1] when
 * ndim = 2; checked as in load_tensor), or NULL with *rc and err set
 * (nothing left allocated). */
static void *load_new(model *m, const st_file *w, const char *name, int ndim, int64_t d0,
                      int64_t d1, exec_buf_kind kind, int *rc, pg_error *err)
{
    size_t n = (size_t)d0 * (ndim == 2 ? (size_t)d1 : 1u);
    void *p = model_alloc(m, kind, n, name, rc, err);
    if (p && (*rc = load_tensor(m, w, name, ndim, d0, d1, p, kind, 0, err))) {
        m->ex->op->free(m->ex, p);
        return NULL;
    }
    return p;
}

/* One MLP's fused gate|up [2I][H] (gate rows, then up rows) and down
 * [H][I] from the tensors PREFIX{gate,up,down}.weight, into *w_gate_up and
 * *w_down, each allocated here when NULL. */
static int load_mlp(model *m, const st_file *w, const char *prefix, const char *gate, const char *up,
                    const char *down, int64_t I, void **w_gate_up, void **w_down, pg_error *err)
{
    const int64_t H = m->H;
    char name[224];
    int rc = PG_OK;
    snprintf(name, sizeof name, "%sgate_up (fused)", prefix);
    if (!*w_gate_up && !(*w_gate_up = model_alloc(m, EXEC_WT, (size_t)(2 * I) * (size_t)H, name, &rc, err)))
        return rc;
    snprintf(name, sizeof name, "%s%s.weight", prefix, gate);
    if ((rc = load_tensor(m, w, name, 2, I, H, *w_gate_up, EXEC_WT, 0, err)))
        return rc;
    snprintf(name, sizeof name, "%s%s.weight", prefix, up);
    if ((rc = load_tensor(m, w, name, 2, I, H, *w_gate_up, EXEC_WT, (size_t)I * (size_t)H, err)))
        return rc;
    snprintf(name, sizeof name, "%s%s.weight", prefix, down);
    if (*w_down)
        return load_tensor(m, w, name, 2, H, I, *w_down, EXEC_WT, 0, err);
    if (!(*w_down = load_new(m, w, name, 2, H, I, EXEC_WT, &rc, err)))
        return rc;
    return PG_OK;
}

/* Layer l's mixture of experts, with the hub's per-expert keys:
 *   Mixtral (modeling_mixtral.py, transformers v4 layout):
 *     block_sparse_moe.gate.weight [E][H], block_sparse_moe.experts.e.w1 (gate),
 *     w3 (up) [Ie][H], w2 (down) [H][Ie]
 *   Qwen2-MoE / Qwen3-MoE: mlp.gate.weight [E][H], mlp.experts.e.gate_proj,
 *     up_proj [Ie][H], down_proj [H][Ie]; Qwen2-MoE also
 *     mlp.shared_expert.{gate,up,down}_proj [Is][H] / [H][Is] and
 *     mlp.shared_expert_gate.weight [1][H].
 * transformers 5 fuses the experts in memory (experts.gate_up_proj
 * [E][2Ie][H], experts.down_proj [E][H][Ie]); a checkpoint that stores
 * them so is refused by name. */
static int load_moe(model *m, const st_file *w, int32_t l, model_layer *ly, pg_error *err)
{
    const llama_family *f = &m->cfg->family;
    const int64_t H = m->H, E = f->n_experts, Ie = f->moe_intermediate_size;
    const char *blk = f->moe_mixtral_keys ? "block_sparse_moe" : "mlp";
    char pre[160], name[224];
    int rc = PG_OK;
    snprintf(pre, sizeof pre, "%slayers.%d.%s.", m->pfx, (int)l, blk);
    snprintf(name, sizeof name, "%sexperts.gate_up_proj", pre);
    if (st_find(w, name))
        return pg_error_set(err, PG_EUNSUPPORTED, "model: tensor '%s': fused expert tensors (transformers 5's "
                            "in-memory layout) are not supported: expected per-expert tensors "
                            "'%sexperts.0.%s.weight', ...", name, pre, f->moe_mixtral_keys ? "w1" : "gate_proj");
    snprintf(name, sizeof name, "%sgate.weight", pre);
    if (!(ly->w_router = load_new(m, w, name, 2, E, H, EXEC_WT, &rc, err)))
        return rc;
    ly->w_exp_gate_up = calloc((size_t)E, sizeof *ly->w_exp_gate_up);
    ly->w_exp_down = calloc((size_t)E, sizeof *ly->w_exp_down);
    if (!ly->w_exp_gate_up || !ly->w_exp_down)
        return pg_error_set(err, PG_ENOMEM, "model: out of host memory for layer %d's expert table", (int)l);
    const size_t n_gu = (size_t)(2 * Ie) * (size_t)H, n_down = (size_t)H * (size_t)Ie;
    const size_t wblk = m->ex->wt_block_elems;
    if (!wblk || (n_gu % wblk == 0 && n_down % wblk == 0)) {
        snprintf(name, sizeof name, "%sexperts [E][2Ie][H]", pre);
        if (!(ly->w_exp_gate_up_all = model_alloc(m, EXEC_WT, (size_t)E * n_gu, name, &rc, err)))
            return rc;
        snprintf(name, sizeof name, "%sexperts [E][H][Ie]", pre);
        if (!(ly->w_exp_down_all = model_alloc(m, EXEC_WT, (size_t)E * n_down, name, &rc, err)))
            return rc;
        for (int64_t e = 0; e < E; e++) {
            ly->w_exp_gate_up[e] = (char *)ly->w_exp_gate_up_all + exec_wt_bytes(m->ex, (size_t)e * n_gu);
            ly->w_exp_down[e] = (char *)ly->w_exp_down_all + exec_wt_bytes(m->ex, (size_t)e * n_down);
        }
    }
    for (int64_t e = 0; e < E; e++) {
        snprintf(name, sizeof name, "%sexperts.%d.", pre, (int)e);
        if ((rc = f->moe_mixtral_keys
                      ? load_mlp(m, w, name, "w1", "w3", "w2", Ie, &ly->w_exp_gate_up[e], &ly->w_exp_down[e], err)
                      : load_mlp(m, w, name, "gate_proj", "up_proj", "down_proj", Ie, &ly->w_exp_gate_up[e],
                                 &ly->w_exp_down[e], err)))
            return rc;
    }
    if (f->shared_expert_intermediate_size > 0) {
        snprintf(name, sizeof name, "%sshared_expert.", pre);
        if ((rc = load_mlp(m, w, name, "gate_proj", "up_proj", "down_proj", f->shared_expert_intermediate_size,
                           &ly->w_gate_up, &ly->w_down, err)))
            return rc;
        snprintf(name, sizeof name, "%sshared_expert_gate.weight", pre);
        if (!(ly->w_sgate = load_new(m, w, name, 2, 1, H, EXEC_WT, &rc, err)))
            return rc;
    }
    return PG_OK;
}

static int load_weights(model *m, const st_file *w, pg_error *err)
{
    int rc = PG_OK;
    const int64_t H = m->H, I = m->I, Q = m->Q, KVD = m->KVD, V = m->V;
    char name[224];

    /* a base model saved by sentence-transformers (Qwen3-Embedding-8B's
     * index: "embed_tokens.weight", "layers.0...", no lm_head) has no
     * "model." prefix; vLLM's embedding adapter loads both spellings */
    m->pfx = !st_find(w, "model.embed_tokens.weight") && st_find(w, "embed_tokens.weight") ? "" : "model.";
    snprintf(name, sizeof name, "%sembed_tokens.weight", m->pfx);
    if (!(m->embed = load_new(m, w, name, 2, V, H, EXEC_WT, &rc, err)))
        return rc;
    if (m->cfg->tie_word_embeddings)
        m->lm_head = m->embed;
    else if ((m->pfx[0] || st_find(w, "lm_head.weight")) &&
             !(m->lm_head = load_new(m, w, "lm_head.weight", 2, V, H, EXEC_WT, &rc, err)))
        return rc; /* (headless without lm_head: NULL, embeddings only) */
    snprintf(name, sizeof name, "%snorm.weight", m->pfx);
    if (!(m->final_norm = load_new(m, w, name, 1, H, 0, EXEC_F32, &rc, err)))
        return rc;

    for (int32_t l = 0; l < m->NL; l++) {
        model_layer *ly = &m->layers[l];
#define LAYER_NAME(suffix) (snprintf(name, sizeof name, "%slayers.%d." suffix, m->pfx, (int)l), name)
        if (!(ly->attn_norm = load_new(m, w, LAYER_NAME("input_layernorm.weight"), 1, H, 0,
                                       EXEC_F32, &rc, err)))
            return rc;

        /* fused QKV [Q + 2 KVD][H]: q rows, then k rows, then v rows */
        ly->w_qkv = model_alloc(m, EXEC_WT, (size_t)(Q + 2 * KVD) * (size_t)H,
                                LAYER_NAME("self_attn.qkv (fused)"), &rc, err);
        if (!ly->w_qkv)
            return rc;
        if ((rc = load_tensor(m, w, LAYER_NAME("self_attn.q_proj.weight"), 2, Q, H, ly->w_qkv,
                              EXEC_WT, 0, err)))
            return rc;
        if ((rc = load_tensor(m, w, LAYER_NAME("self_attn.k_proj.weight"), 2, KVD, H, ly->w_qkv,
                              EXEC_WT, (size_t)Q * (size_t)H, err)))
            return rc;
        if ((rc = load_tensor(m, w, LAYER_NAME("self_attn.v_proj.weight"), 2, KVD, H, ly->w_qkv,
                              EXEC_WT, (size_t)(Q + KVD) * (size_t)H, err)))
            return rc;

        if (m->cfg->family.qkv_bias) { /* fused [Q + 2 KVD] f32, as the weight rows */
            ly->b_qkv = model_alloc(m, EXEC_F32, (size_t)(Q + 2 * KVD),
                                    LAYER_NAME("self_attn.qkv bias (fused)"), &rc, err);
            if (!ly->b_qkv)
                return rc;
            if ((rc = load_tensor(m, w, LAYER_NAME("self_attn.q_proj.bias"), 1, Q, 0, ly->b_qkv,
                                  EXEC_F32, 0, err)) ||
                (rc = load_tensor(m, w, LAYER_NAME("self_attn.k_proj.bias"), 1, KVD, 0, ly->b_qkv,
                                  EXEC_F32, (size_t)Q, err)) ||
                (rc = load_tensor(m, w, LAYER_NAME("self_attn.v_proj.bias"), 1, KVD, 0, ly->b_qkv,
                                  EXEC_F32, (size_t)(Q + KVD), err)))
                return rc;
        }
        if (m->cfg->family.qk_norm) {
            if (!(ly->q_norm = load_new(m, w, LAYER_NAME("self_attn.q_norm.weight"), 1, m->hd, 0,
                                        EXEC_F32, &rc, err)) ||
                !(ly->k_norm = load_new(m, w, LAYER_NAME("self_attn.k_norm.weight"), 1, m->hd, 0,
                                        EXEC_F32, &rc, err)))
                return rc;
        }

        if (!(ly->w_o = load_new(m, w, LAYER_NAME("self_attn.o_proj.weight"), 2, H, Q, EXEC_WT,
                                 &rc, err)))
            return rc;
        if (!(ly->mlp_norm = load_new(m, w, LAYER_NAME("post_attention_layernorm.weight"), 1, H,
                                      0, EXEC_F32, &rc, err)))
            return rc;

        if (llama_layer_moe(m->cfg, l)) {
            if ((rc = load_moe(m, w, l, ly, err)))
                return rc;
        } else {
            snprintf(name, sizeof name, "%slayers.%d.mlp.", m->pfx, (int)l);
            if ((rc = load_mlp(m, w, name, "gate_proj", "up_proj", "down_proj", I, &ly->w_gate_up,
                               &ly->w_down, err)))
                return rc;
        }
#undef LAYER_NAME
    }
    return PG_OK;
}

static int alloc_state(model *m, pg_error *err)
{
    int rc = PG_OK;
    const model_params *p = &m->p;
    size_t T = (size_t)p->max_num_batched_tokens, S = (size_t)p->max_num_seqs;
    size_t H = (size_t)m->H, I = (size_t)m->I_mlp;

    /* RoPE table */
    float host_freq[512];
    int32_t half = m->hd / 2;
    float *freq = half <= 512 ? host_freq : malloc((size_t)half * sizeof *freq);
    if (!freq)
        return pg_error_set(err, PG_ENOMEM, "model: out of host memory for the rope table");
    rc = rope_inv_freq(freq, m->hd, m->cfg->rope_theta, &m->cfg->rope_scaling, err);
    if (!rc) {
        m->inv_freq = model_alloc(m, EXEC_F32, (size_t)half, "rope inv_freq", &rc, err);
        if (m->inv_freq) {
            rc = m->ex->op->upload(m->ex, m->inv_freq, EXEC_F32, 0, freq, ST_F32, (size_t)half);
            if (rc)
                pg_error_set(err, rc, "model: uploading rope inv_freq: %s",
                             m->ex->op->last_error(m->ex));
        }
    } else {
        pg_error_wrap(err, rc, "model");
    }
    if (freq != host_freq)
        free(freq);
    if (rc)
        return rc;

    /* KV cache: one buffer of 2*NL planes */
    m->block_elems = (size_t)p->block_size * (size_t)m->nkv * (size_t)m->hd;
    m->plane_elems = (size_t)p->num_kv_blocks * m->block_elems;
    size_t n_planes = 2u * (size_t)m->NL;
    if (m->plane_elems / (size_t)p->num_kv_blocks != m->block_elems ||
        m->plane_elems > SIZE_MAX / n_planes)
        return pg_error_set(err, PG_ENOMEM, "model: kv cache of %d blocks overflows size_t",
                            (int)p->num_kv_blocks);
    char what[160];
    snprintf(what, sizeof what, "the kv cache (%d blocks of %d tokens, %zu bytes per block)",
             (int)p->num_kv_blocks, (int)p->block_size,
             model_kv_bytes_per_block(m->cfg, m->ex, p->block_size));
    m->kv = model_alloc(m, EXEC_KV, n_planes * m->plane_elems, what, &rc, err);
    if (!m->kv)
        return rc;

    /* workspace */
    struct {
        void **dst;
        size_t n;
        const char *what;
    } ws[] = {
        {&m->x, T * H, "workspace x [T][H]"},
        {&m->normed, T * H, "workspace normed [T][H]"},
        {&m->proj, T * H, "workspace proj [T][H]"},
        {&m->qkv, T * (size_t)m->QKV, "workspace qkv [T][QKV]"},
        {&m->attn, T * (size_t)m->Q, "workspace attn [T][nh*hd]"},
        {&m->gate_up, T * 2u * I, "workspace gate_up [T][2I]"},
        {&m->mlp, T * I, "workspace mlp [T][I]"},
        {&m->rows_x, S * H, "workspace rows_x [S][H]"},
        {&m->rows_mlp, S * H, "workspace rows_mlp [S][H]"},
        {&m->rows_out, S * H, "workspace rows_out [S][H]"},
    };
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        *ws[i].dst = model_alloc(m, EXEC_ACT, ws[i].n, ws[i].what, &rc, err);
        if (!*ws[i].dst)
            return rc;
    }
    const llama_family *f = &m->cfg->family;
    if (f->n_experts > 0) {
        const size_t E = (size_t)f->n_experts, k = (size_t)f->n_experts_per_tok;
        if (!(m->router = model_alloc(m, EXEC_ACT, T * E, "workspace router [T][E]", &rc, err)) ||
            !(m->moe_ids = model_alloc(m, EXEC_I32, T * k, "workspace moe ids [T][k]", &rc, err)) ||
            !(m->moe_wts = model_alloc(m, EXEC_F32, T * k, "workspace moe weights [T][k]", &rc, err)))
            return rc;
        if (f->shared_expert_intermediate_size > 0 &&
            (!(m->sgate = model_alloc(m, EXEC_ACT, T, "workspace shared gate [T][1]", &rc, err)) ||
             !(m->shared = model_alloc(m, EXEC_ACT, T * H, "workspace shared expert [T][H]", &rc, err))))
            return rc;
    }
    return PG_OK;
}

int model_create(model **out, executor *ex, const llama_config *cfg, const st_file *weights,
                 const model_params *p, pg_error *err)
{
    *out = NULL;
    int rc = check_config(cfg, p, err);
    if (rc)
        return rc;
    model *m = calloc(1, sizeof *m);
    if (!m)
        return pg_error_set(err, PG_ENOMEM, "model: out of host memory");
    m->ex = ex;
    m->cfg = cfg;
    m->p = *p;
    m->H = cfg->hidden_size;
    m->I = cfg->intermediate_size;
    m->NL = cfg->num_hidden_layers;
    m->nh = cfg->num_attention_heads;
    m->nkv = cfg->num_key_value_heads;
    m->hd = cfg->head_dim;
    m->V = cfg->vocab_size;
    m->Q = m->nh * m->hd;
    m->KVD = m->nkv * m->hd;
    m->QKV = m->Q + 2 * m->KVD;
    m->I_mlp = m->I;
    if (cfg->family.shared_expert_intermediate_size > m->I_mlp)
        m->I_mlp = cfg->family.shared_expert_intermediate_size;
    if (cfg->family.n_experts > 0 &&
        (!ex->op->moe_route || !ex->op->moe_experts || !ex->op->moe_shared_add)) {
        free(m);
        return pg_error_set(err, PG_EUNSUPPORTED, "model: %s is a mixture of experts: the %s executor does not "
                            "run mixture-of-experts layers (the CPU executor does)", cfg->architecture, ex->name);
    }
    m->layers = calloc((size_t)m->NL, sizeof *m->layers);
    if (!m->layers) {
        free(m);
        return pg_error_set(err, PG_ENOMEM, "model: out of host memory");
    }
    if ((rc = load_weights(m, weights, err)) || (rc = alloc_state(m, err))) {
        model_destroy(m);
        return rc;
    }
    *out = m;
    return PG_OK;
}

void model_destroy(model *m)
{
    if (!m)
        return;
    executor *ex = m->ex;
    if (m->lora) {
        for (int32_t i = 0; i < m->NL * LORA_NPROJ; i++) {
            model_lora_proj *lp = &m->lora[i];
            for (int32_t a = 0; a < m->n_lora; a++) {
                ex->op->free(ex, lp->B ? lp->B[a] : NULL);
                ex->op->free(ex, lp->A ? lp->A[a] : NULL);
            }
            free(lp->A);
            free(lp->B);
            free(lp->scale);
            free(lp->rank);
        }
        free(m->lora);
    }
    void *ws[] = {m->shared, m->sgate, m->moe_wts, m->moe_ids, m->router,
                  m->rows_out, m->rows_mlp, m->rows_x, m->mlp, m->gate_up, m->attn,
                  m->qkv, m->proj, m->normed, m->x, m->kv, m->inv_freq};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        ex->op->free(ex, ws[i]);
    if (m->layers) {
        for (int32_t l = m->NL - 1; l >= 0; l--) {
            model_layer *ly = &m->layers[l];
            ex->op->free(ex, ly->w_sgate);
            ex->op->free(ex, ly->w_exp_down_all);
            ex->op->free(ex, ly->w_exp_gate_up_all);
            for (int32_t e = m->cfg->family.n_experts - 1; e >= 0 && !ly->w_exp_gate_up_all; e--) {
                if (ly->w_exp_down)
                    ex->op->free(ex, ly->w_exp_down[e]);
                if (ly->w_exp_gate_up)
                    ex->op->free(ex, ly->w_exp_gate_up[e]);
            }
            free(ly->w_exp_down);
            free(ly->w_exp_gate_up);
            ex->op->free(ex, ly->w_router);
            ex->op->free(ex, ly->w_down);
            ex->op->free(ex, ly->w_gate_up);
            ex->op->free(ex, ly->mlp_norm);
            ex->op->free(ex, ly->w_o);
            ex->op->free(ex, ly->k_norm);
            ex->op->free(ex, ly->q_norm);
            ex->op->free(ex, ly->b_qkv);
            ex->op->free(ex, ly->w_qkv);
            ex->op->free(ex, ly->attn_norm);
        }
    }
    ex->op->free(ex, m->final_norm);
    if (m->lm_head != m->embed)
        ex->op->free(ex, m->lm_head);
    ex->op->free(ex, m->embed);
    free(m->layers);
    free(m);
}

/* ---- LoRA adapters -------------------------------------------------------- */

static int lora_grow(model *m, pg_error *err)
{
    if (!m->lora && !(m->lora = calloc((size_t)m->NL * LORA_NPROJ, sizeof *m->lora)))
        return pg_error_set(err, PG_ENOMEM, "model: out of host memory for LoRA slots");
    if (m->n_lora < m->lora_cap)
        return PG_OK;
    const int32_t cap = m->lora_cap ? 2 * m->lora_cap : 4;
    for (int32_t i = 0; i < m->NL * LORA_NPROJ; i++) {
        model_lora_proj *lp = &m->lora[i];
        void **A = realloc(lp->A, (size_t)cap * sizeof *A);
        if (A) lp->A = A;
        void **B = realloc(lp->B, (size_t)cap * sizeof *B);
        if (B) lp->B = B;
        float *sc = realloc(lp->scale, (size_t)cap * sizeof *sc);
        if (sc) lp->scale = sc;
        int32_t *rk = realloc(lp->rank, (size_t)cap * sizeof *rk);
        if (rk) lp->rank = rk;
        if (!A || !B || !sc || !rk)
            return pg_error_set(err, PG_ENOMEM, "model: out of host memory for LoRA slots");
    }
    m->lora_cap = cap;
    return PG_OK;
}

int model_lora_add(model *m, const lora_adapter *a, const char *name, int32_t *slot, pg_error *err)
{
    executor *ex = m->ex;
    *slot = -1;
    if (!ex->op->lora_add)
        return pg_error_set(err, PG_EUNSUPPORTED, "lora %s: the %s executor has no LoRA op (lora_add): "
                            "run adapters on the cpu", name, ex->name);
    if (a->n_layers != m->NL)
        return pg_error_set(err, PG_EINVAL, "lora %s: %d layers, the model has %d", name, (int)a->n_layers,
                            (int)m->NL);
    for (int32_t l = 0; l < m->NL; l++)
        for (int32_t p = 0; p < LORA_NPROJ; p++) {
            const lora_weights *w = lora_adapter_at(a, l, (lora_proj)p);
            if (w->r == 0)
                continue;
            int32_t in, out;
            lora_proj_dims(m->cfg, (lora_proj)p, &in, &out);
            if (w->in != in || w->out != out || w->r > PG_LORA_MAX_RANK)
                return pg_error_set(err, PG_EINVAL, "lora %s: model.layers.%d.%s.%s: [%d -> %d] rank %d, "
                                    "expected [%d -> %d] rank <= %d", name, (int)l, lora_proj_block((lora_proj)p),
                                    lora_proj_name((lora_proj)p), (int)w->in, (int)w->out, (int)w->r, (int)in,
                                    (int)out, PG_LORA_MAX_RANK);
            if (p >= LORA_GATE && llama_layer_moe(m->cfg, l))
                return pg_error_set(err, PG_EUNSUPPORTED, "lora %s: model.layers.%d.mlp.%s: layer %d is a "
                                    "mixture of experts; LoRA on its MLP (experts, router) is not supported",
                                    name, (int)l, lora_proj_name((lora_proj)p), (int)l);
        }
    int rc = lora_grow(m, err);
    if (rc)
        return rc;
    const int32_t s = m->n_lora;
    for (int32_t i = 0; i < m->NL * LORA_NPROJ; i++) {
        m->lora[i].A[s] = m->lora[i].B[s] = NULL;
        m->lora[i].scale[s] = 0.0f;
        m->lora[i].rank[s] = 0;
    }
    m->n_lora++; /* from here model_lora_drop_last / model_destroy free what is set */
    for (int32_t l = 0; l < m->NL; l++)
        for (int32_t p = 0; p < LORA_NPROJ; p++) {
            const lora_weights *w = lora_adapter_at(a, l, (lora_proj)p);
            if (w->r == 0)
                continue;
            model_lora_proj *lp = &m->lora[(size_t)l * LORA_NPROJ + (size_t)p];
            const size_t na = (size_t)w->r * (size_t)w->in, nb = (size_t)w->out * (size_t)w->r;
            lp->A[s] = ex->op->alloc(ex, EXEC_ACT, na);
            lp->B[s] = ex->op->alloc(ex, EXEC_ACT, nb);
            if (!lp->A[s] || !lp->B[s] ||
                (rc = ex->op->upload(ex, lp->A[s], EXEC_ACT, 0, w->A, ST_F32, na)) ||
                (rc = ex->op->upload(ex, lp->B[s], EXEC_ACT, 0, w->B, ST_F32, nb))) {
                pg_error_set(err, rc ? rc : PG_ENOMEM, "lora %s: model.layers.%d.%s.%s: %s", name, (int)l,
                             lora_proj_block((lora_proj)p), lora_proj_name((lora_proj)p), ex->op->last_error(ex));
                rc = rc ? rc : PG_ENOMEM;
                for (int32_t i = 0; i < m->NL * LORA_NPROJ; i++) {
                    model_lora_proj *q = &m->lora[i];
                    q->n_adapted -= q->rank[s] > 0; /* counted: fully uploaded */
                    ex->op->free(ex, q->B[s]);
                    ex->op->free(ex, q->A[s]);
                    q->A[s] = q->B[s] = NULL;
                }
                m->n_lora--;
                return rc;
            }
            lp->scale[s] = w->scale;
            lp->rank[s] = w->r;
            lp->n_adapted++;
        }
    *slot = s;
    return PG_OK;
}

int32_t model_lora_count(const model *m)
{
    return m->n_lora;
}

/* Adds projection p's deltas of layer l for the step's adapter rows:
 * y [T][ldy] at column offset col (a fused output), x [T][K]. */
static int lora_apply(model *m, int32_t l, lora_proj p, void *y, int32_t ldy, int32_t col, const void *x,
                      int32_t K, int32_t N, const step_batch *b)
{
    if (!b->lora_slots || !m->lora)
        return PG_OK;
    const model_lora_proj *lp = &m->lora[(size_t)l * LORA_NPROJ + (size_t)p];
    if (lp->n_adapted == 0)
        return PG_OK;
    executor *ex = m->ex;
    return ex->op->lora_add(ex, (char *)y + (size_t)col * ex->act_bytes, ldy, x, K, N,
                            (const void *const *)lp->A, (const void *const *)lp->B, lp->scale, lp->rank,
                            m->n_lora, b);
}

/* q, k and v deltas into their columns of qkv */
static int lora_qkv(model *m, int32_t l, const step_batch *b)
{
    int rc;
    if ((rc = lora_apply(m, l, LORA_Q, m->qkv, m->QKV, 0, m->normed, m->H, m->Q, b)) ||
        (rc = lora_apply(m, l, LORA_K, m->qkv, m->QKV, m->Q, m->normed, m->H, m->KVD, b)) ||
        (rc = lora_apply(m, l, LORA_V, m->qkv, m->QKV, m->Q + m->KVD, m->normed, m->H, m->KVD, b)))
        return rc;
    return PG_OK;
}

/* ---- forward -------------------------------------------------------------- */

/* max_logits: num_seqs for model_forward, num_tokens for model_forward_rows. */
static int check_batch(const model *m, const step_batch *b, int32_t max_logits, pg_error *err)
{
    if (b->num_tokens < 1 || b->num_tokens > m->p.max_num_batched_tokens)
        return pg_error_set(err, PG_EINVAL,
                            "model forward: num_tokens %d outside [1, %d] (max_num_batched_tokens)",
                            (int)b->num_tokens, (int)m->p.max_num_batched_tokens);
    if (b->num_seqs < 1 || b->num_seqs > m->p.max_num_seqs)
        return pg_error_set(err, PG_EINVAL,
                            "model forward: num_seqs %d outside [1, %d] (max_num_seqs)",
                            (int)b->num_seqs, (int)m->p.max_num_seqs);
    if (b->num_logits < 0 || b->num_logits > max_logits)
        return pg_error_set(err, PG_EINVAL,
                            "model forward: num_logits %d outside [0, %d]",
                            (int)b->num_logits, (int)max_logits);
    if (b->block_size != m->p.block_size)
        return pg_error_set(err, PG_EINVAL,
                            "model forward: batch block_size %d, the kv cache has %d",
                            (int)b->block_size, (int)m->p.block_size);
    return PG_OK;
}

/* Wraps a failed op's status with the executor's message. */
static int op_failed(model *m, int rc, const char *op, int32_t layer, pg_error *err)
{
    if (rc > 0)
        rc = PG_EDEVICE;
    if (layer >= 0)
        return pg_error_set(err, rc, "model forward: layer %d %s: %s", (int)layer, op,
                            m->ex->op->last_error(m->ex));
    return pg_error_set(err, rc, "model forward: %s: %s", op, m->ex->op->last_error(m->ex));
}

/* --profile-ops (op_profile.h): the clock before an op when profiling
 * (else 0), and its time added to the op's total after it. */
static double prof_begin(const model *m)
{
    return m->prof ? op_profile_now() : 0.0;
}

static void prof_end(model *m, op_profile_op op, double t0)
{
    if (m->prof)
        m->prof->seconds[m->prof_kind][op] += op_profile_now() - t0;
    if (m->op_marks)
        m->ex->op->op_mark(m->ex, (int)op);
}

void model_set_op_profile(model *m, op_profile *p)
{
    m->prof = p;
}

/* Between the qkv projection (timed from *t0 on) and attention: the q|k|v
 * bias (Qwen2), q/k norms (Qwen3), rope and the KV-cache write — one fused
 * call where the executor has it (executor.h rope_kv: the same bits), else
 * the ops one by one. */
static int qkv_to_cache(model *m, int32_t l, const model_layer *ly, const step_batch *b, void *k_plane,
                        void *v_plane, double t0, const char **failed)
{
    executor *ex = m->ex;
    const executor_ops *op = ex->op;
    const int32_t T = b->num_tokens, nh = m->nh, nkv = m->nkv, hd = m->hd;
    const float eps = m->cfg->rms_norm_eps;
    int rc;
    if (op->rope_kv) {
        /* the deltas before rope_kv's bias (PEFT adds them after it: the
         * same up to one rounding of the sum; the CPU, the reference, has
         * no rope_kv) */
        *failed = "qkv lora";
        if ((rc = lora_qkv(m, l, b)))
            return rc;
        prof_end(m, OPP_QKV, t0);
        *failed = "rope_kv";
        t0 = prof_begin(m);
        if ((rc = op->rope_kv(ex, m->qkv, k_plane, v_plane, ly->b_qkv, ly->q_norm, ly->k_norm, eps,
                              m->inv_freq, nh, nkv, hd, b)))
            return rc;
        prof_end(m, OPP_ROPE, t0);
        return PG_OK;
    }
    if (ly->b_qkv) { /* timed with the projection it belongs to */
        *failed = "qkv bias";
        if ((rc = op->add_bias(ex, m->qkv, ly->b_qkv, T, m->QKV)))
            return rc;
    }
    /* PEFT's lora.Linear: base_layer(x) (with its bias), then + the delta */
    *failed = "qkv lora";
    if ((rc = lora_qkv(m, l, b)))
        return rc;
    prof_end(m, OPP_QKV, t0);
    t0 = prof_begin(m);
    if (ly->q_norm) { /* timed with rope: both transform the q and k heads */
        *failed = "q/k norm";
        if ((rc = op->qk_norm(ex, m->qkv, ly->q_norm, ly->k_norm, T, nh, nkv, hd, eps)))
            return rc;
    }
    *failed = "rope";
    if ((rc = op->rope(ex, m->qkv, m->inv_freq, nh, nkv, hd, b)))
        return rc;
    prof_end(m, OPP_ROPE, t0);
    *failed = "kv_write";
    t0 = prof_begin(m);
    if ((rc = op->kv_write(ex, k_plane, v_plane, m->qkv, nh, nkv, hd, b)))
        return rc;
    prof_end(m, OPP_KV_WRITE, t0);
    return PG_OK;
}

int model_set_step_profile(model *m, step_profile *p)
{
    executor *ex = m->ex;
    if (!ex->op->set_step_profile || !ex->op->op_mark) {
        m->op_marks = 0;
        return p ? PG_EUNSUPPORTED : PG_OK;
    }
    ex->op->set_step_profile(ex, p);
    m->op_marks = p != NULL;
    return PG_OK;
}

/* A mixture-of-experts MLP over all T rows (model.c's header; executor.h
 * moe_route / moe_experts / moe_shared_add): h in m->normed, its output
 * (mlp_out) into m->proj. */
static int forward_moe(model *m, const model_layer *ly, int32_t T, const char **failed)
{
    executor *ex = m->ex;
    const executor_ops *op = ex->op;
    const llama_family *f = &m->cfg->family;
    const int32_t H = m->H, E = f->n_experts, k = f->n_experts_per_tok;
    int rc;
    double t0 = prof_begin(m);
    *failed = "router matmul";
    if ((rc = op->matmul(ex, m->router, m->normed, ly->w_router, T, E, H)))
        return rc;
    *failed = "moe route";
    if ((rc = op->moe_route(ex, m->moe_ids, m->moe_wts, m->router, T, E, k, f->norm_topk_prob)))
        return rc;
    prof_end(m, OPP_MOE_ROUTER, t0);
    t0 = prof_begin(m);
    *failed = "moe experts";
    if ((rc = op->moe_experts(ex, m->proj, m->normed, m->moe_ids, m->moe_wts, ly->w_exp_gate_up, ly->w_exp_down,
                              T, H, f->moe_intermediate_size, E, k)))
        return rc;
    if (ly->w_sgate) { /* Qwen2-MoE: the shared expert, a dense MLP, gated */
        const int32_t Is = f->shared_expert_intermediate_size;
        *failed = "shared expert";
        if ((rc = op->matmul(ex, m->gate_up, m->normed, ly->w_gate_up, T, 2 * Is, H)) ||
            (rc = op->silu_mul(ex, m->mlp, m->gate_up, T, Is)) ||
            (rc = op->matmul(ex, m->shared, m->mlp, ly->w_down, T, H, Is)) ||
            (rc = op->matmul(ex, m->sgate, m->normed, ly->w_sgate, T, 1, H)) ||
            (rc = op->moe_shared_add(ex, m->proj, m->shared, m->sgate, T, H)))
            return rc;
    }
    prof_end(m, OPP_MOE_EXPERTS, t0);
    return PG_OK;
}

/* One decoder layer over all T rows. On entry m->x holds the residual
 * stream and, for l > 0, m->proj the previous layer's mlp_out (not yet
 * added); on return the same holds for layer l + 1. *failed names the op
 * that failed. */
static int forward_layer(model *m, int32_t l, const step_batch *b, const char **failed)
{
    executor *ex = m->ex;
    const executor_ops *op = ex->op;
    const model_layer *ly = &m->layers[l];
    const int32_t T = b->num_tokens, H = m->H, I = m->I;
    const int32_t nh = m->nh, nkv = m->nkv, hd = m->hd;
    const float eps = m->cfg->rms_norm_eps;
    /* llama2.c: score /= sqrtf(head_size); HF: scaling = head_dim ** -0.5 */
    const float scale = 1.0f / sqrtf((float)hd);
    char *k_plane = (char *)m->kv + (size_t)(2 * l) * m->plane_elems * ex->kv_bytes;
    char *v_plane = k_plane + m->plane_elems * ex->kv_bytes;
    double t0;
    int rc;

    /* layer 0: normed = rmsnorm(x); later: x += mlp_out (in proj), normed = rmsnorm(x) */
    *failed = "input rmsnorm";
    t0 = prof_begin(m);
    if ((rc = op->rmsnorm(ex, m->normed, l == 0 ? NULL : m->x, l == 0 ? m->x : m->proj,
                          ly->attn_norm, T, H, eps)))
        return rc;
    prof_end(m, OPP_INPUT_NORM, t0);
    *failed = "qkv matmul";
    t0 = prof_begin(m);
    if ((rc = op->matmul(ex, m->qkv, m->normed, ly->w_qkv, T, m->QKV, H)))
        return rc;
    if ((rc = qkv_to_cache(m, l, ly, b, k_plane, v_plane, t0, failed)))
        return rc;
    /* the layer's window (config.h llama_layer_window): the step's own
     * (every layer, the engine frees blocks behind it) or this layer's */
    const int32_t window = llama_layer_window(m->cfg, l);
    step_batch bl;
    const step_batch *ba = b;
    if (window != b->sliding_window) {
        bl = *b;
        bl.sliding_window = window;
        ba = &bl;
    }
    *failed = "attention";
    t0 = prof_begin(m);
    if ((rc = op->attention(ex, m->attn, m->qkv, k_plane, v_plane, nh, nkv, hd, scale, ba)))
        return rc;
    prof_end(m, OPP_ATTENTION, t0);
    *failed = "o matmul";
    t0 = prof_begin(m);
    if ((rc = op->matmul(ex, m->proj, m->attn, ly->w_o, T, H, m->Q)))
        return rc;
    *failed = "o lora";
    if ((rc = lora_apply(m, l, LORA_O, m->proj, H, 0, m->attn, m->Q, H, b)))
        return rc;
    prof_end(m, OPP_O, t0);
    /* x += attn_o; normed = rmsnorm(x) */
    *failed = "post-attention rmsnorm";
    t0 = prof_begin(m);
    if ((rc = op->rmsnorm(ex, m->normed, m->x, m->proj, ly->mlp_norm, T, H, eps)))
        return rc;
    prof_end(m, OPP_POST_NORM, t0);
    if (ly->w_router)
        return forward_moe(m, ly, T, failed);
    *failed = "gate_up matmul";
    t0 = prof_begin(m);
    if ((rc = op->matmul(ex, m->gate_up, m->normed, ly->w_gate_up, T, 2 * I, H)))
        return rc;
    *failed = "gate_up lora";
    if ((rc = lora_apply(m, l, LORA_GATE, m->gate_up, 2 * I, 0, m->normed, H, I, b)) ||
        (rc = lora_apply(m, l, LORA_UP, m->gate_up, 2 * I, I, m->normed, H, I, b)))
        return rc;
    prof_end(m, OPP_GATE_UP, t0);
    *failed = "silu_mul";
    t0 = prof_begin(m);
    if ((rc = op->silu_mul(ex, m->mlp, m->gate_up, T, I)))
        return rc;
    prof_end(m, OPP_SILU_MUL, t0);
    *failed = "down matmul";
    t0 = prof_begin(m);
    if ((rc = op->matmul(ex, m->proj, m->mlp, ly->w_down, T, H, I))) /* mlp_out */
        return rc;
    *failed = "down lora";
    if ((rc = lora_apply(m, l, LORA_DOWN, m->proj, H, 0, m->mlp, I, H, b)))
        return rc;
    prof_end(m, OPP_DOWN, t0);
    return PG_OK;
}

/* The L sampling rows only: gather x and the last mlp_out, then
 * rows_x += rows_mlp; rows_out = rmsnorm(rows_x) * w_final (per row the same
 * arithmetic as adding over all T rows first), then logits on the host. */
static int forward_head(model *m, const step_batch *b, float *logits, const char **failed)
{
    executor *ex = m->ex;
    const executor_ops *op = ex->op;
    int rc;
    *failed = "gather residual rows";
    if ((rc = op->gather_rows(ex, m->rows_x, m->x, m->H, b)))
        return rc;
    *failed = "gather mlp rows";
    if ((rc = op->gather_rows(ex, m->rows_mlp, m->proj, m->H, b)))
        return rc;
    *failed = "final rmsnorm";
    if ((rc = op->rmsnorm(ex, m->rows_out, m->rows_x, m->rows_mlp, m->final_norm, b->num_logits,
                          m->H, m->cfg->rms_norm_eps)))
        return rc;
    *failed = "logits";
    return op->logits(ex, logits, m->rows_out, m->lm_head, b->num_logits, m->V, m->H);
}

/* Where the logits rows of a forward go: all L rows into `logits` (model_forward,
 * L <= max_num_seqs), or (sink != NULL, model_forward_rows) in slices of at
 * most slice_rows rows through buf, each handed to sink. */
typedef struct rows_out {
    float *logits;                /* [L][V] host (no sink) */
    engine_rows_fn sink;          /* NULL: everything into logits */
    void *sink_ctx;
    float *buf;                   /* [slice_rows][V] host */
    int32_t slice_rows;
    pg_error *err;                /* the sink's error */
    int sink_failed;              /* the sink returned an error (err is set) */
} rows_out;

/* The head when L may exceed the gathered-rows workspace (prompt logprobs:
 * up to every token of the step): x += mlp_out and the final rmsnorm over
 * all T rows into m->normed (per row the same arithmetic as forward_head's
 * gathered rows: rmsnorm and the residual add are row-local), then the
 * lm_head product over runs of consecutive logits rows, read in place from
 * m->normed, at most slice_rows rows at a time (a row's logits do not depend
 * on the other rows of the product: executor.h matmul/logits). Host memory
 * stays [slice_rows][V] whatever L is. */
static int forward_head_slices(model *m, const step_batch *b, rows_out *ro, const char **failed)
{
    executor *ex = m->ex;
    const executor_ops *op = ex->op;
    const size_t row_bytes = (size_t)m->H * exec_kind_bytes(ex, EXEC_ACT);
    int rc;
    *failed = "final rmsnorm";
    if ((rc = op->rmsnorm(ex, m->normed, m->x, m->proj, m->final_norm, b->num_tokens, m->H,
                          m->cfg->rms_norm_eps)))
        return rc;
    *failed = "logits";
    for (int32_t r0 = 0; r0 < b->num_logits;) {
        int32_t n = 1;
        while (r0 + n < b->num_logits && n < ro->slice_rows &&
               b->logits_rows[r0 + n] == b->logits_rows[r0] + n)
            n++;
        const char *x = (const char *)m->normed + (size_t)b->logits_rows[r0] * row_bytes;
        if (m->lp_L && (rc = op->logprob_rows(ex, m->lp_rows + r0, n)))
            return rc;
        if ((rc = op->logits(ex, ro->buf, x, m->lm_head, n, m->V, m->H)))
            return rc;
        if ((rc = ro->sink(ro->sink_ctx, r0, n, ro->buf, ro->err))) {
            ro->sink_failed = 1;
            return rc;
        }
        r0 += n;
    }
    return PG_OK;
}

/* The forward over b through the op table (what an executor's run_step
 * may record and replay). */
static int forward_ops(model *m, const step_batch *b, rows_out *ro, pg_error *err)
{
    int rc;
    executor *ex = m->ex;
    const char *failed = "begin_step";
    int32_t layer = -1;
    if (m->prof) {
        m->prof_kind = b->num_tokens > b->num_seqs ? OPP_PREFILL : OPP_DECODE;
        m->prof->steps[m->prof_kind]++;
        m->prof->tokens[m->prof_kind] += b->num_tokens;
    }
    rc = ex->op->begin_step(ex, b);
    if (!rc && m->op_marks) /* after the metadata copy: the ops' device time only */
        ex->op->op_mark(ex, -1);
    if (!rc) {
        failed = "embed";
        const double t0 = prof_begin(m);
        rc = ex->op->embed(ex, m->x, m->embed, m->H, m->V, b);
        prof_end(m, OPP_EMBED, t0);
    }
    for (int32_t l = 0; !rc && l < m->NL; l++) {
        layer = l;
        rc = forward_layer(m, l, b, &failed);
    }
    if (!rc && b->num_logits > 0) { /* L = 0: a step that only fills the cache */
        layer = -1;
        const double t0 = prof_begin(m);
        if (ro->sink) /* more rows than one slice or the gathered workspace */
            rc = forward_head_slices(m, b, ro, &failed);
        else
            rc = forward_head(m, b, ro->logits, &failed);
        prof_end(m, OPP_HEAD, t0);
    }
    if (rc && ro->sink_failed)
        return rc;
    if (rc)
        return op_failed(m, rc, failed, layer, err);
    return PG_OK;
}

/* run_step's callback: the forward over whatever batch the executor passes
 * (the step's, or the step's padded to a captured shape). */
typedef struct forward_call {
    model *m;
    pg_error *err;
    rows_out *ro;
    int failed;                   /* the forward itself failed: err is set */
} forward_call;

static int forward_call_run(void *ctx, const step_batch *b, float *logits)
{
    forward_call *fc = ctx;
    int rc = check_batch(fc->m, b, fc->ro->sink ? b->num_tokens : b->num_seqs, fc->err);
    fc->ro->logits = logits;
    if (!rc)
        rc = forward_ops(fc->m, b, fc->ro, fc->err);
    fc->failed = rc != 0;
    return rc;
}

static int forward_with(model *m, const step_batch *b_in, float *logits, rows_out *ro, pg_error *err)
{
    if (!m->lm_head && b_in->num_logits > 0)
        return pg_error_set(err, PG_EUNSUPPORTED, "model forward: the checkpoint has no lm_head.weight (an "
                            "embedding model): only embedding requests can run");
    /* the config's sliding window (Mistral) is the model's, not the caller's */
    step_batch bw = *b_in;
    bw.sliding_window = m->cfg->sliding_window;
    executor *ex = m->ex;
    ro->logits = logits;
    if (!ex->op->run_step)
        return forward_ops(m, &bw, ro, err);
    forward_call fc = {m, err, ro, 0};
    int rc = ex->op->run_step(ex, &bw, logits, forward_call_run, &fc);
    if (rc && !fc.failed)
        return op_failed(m, rc, "step", -1, err);
    return rc;
}

/* The pending logprob rows (model_logprob_rows) to the executor for a
 * forward whose logits come in one piece (not forward_head_slices, which
 * hands them over per slice). */
static int lp_whole(model *m, const step_batch *b, pg_error *err)
{
    if (!m->lp_L)
        return PG_OK;
    if (m->lp_L != b->num_logits)
        return pg_error_set(err, PG_EINVAL, "model forward: %d logprob rows for %d logits rows",
                            (int)m->lp_L, (int)b->num_logits);
    int rc = m->ex->op->logprob_rows(m->ex, m->lp_rows, m->lp_L);
    return rc ? op_failed(m, rc, "logprob_rows", -1, err) : PG_OK;
}

/* After a forward: nothing pending, here or in the executor. */
static int lp_done(model *m, int rc)
{
    if (m->lp_L) {
        m->lp_L = 0;
        (void)m->ex->op->logprob_rows(m->ex, NULL, 0);
    }
    return rc;
}

int model_forward(model *m, const step_batch *b_in, float *logits, pg_error *err)
{
    int rc = check_batch(m, b_in, b_in->num_seqs, err);
    if (!rc)
        rc = lp_whole(m, b_in, err);
    if (rc)
        return lp_done(m, rc);
    rows_out ro = {.logits = logits};
    return lp_done(m, forward_with(m, b_in, logits, &ro, err));
}

int model_forward_rows(model *m, const step_batch *b, float *buf, int32_t slice_rows,
                       engine_rows_fn sink, void *sink_ctx, pg_error *err)
{
    if (!buf || !sink || slice_rows < 1)
        return pg_error_set(err, PG_EINVAL, "model forward_rows: expected a buffer, a sink and "
                            "slice_rows >= 1, got slice_rows %d", (int)slice_rows);
    int rc = check_batch(m, b, b->num_tokens, err);
    if (!rc && m->lp_L && m->lp_L != b->num_logits)
        rc = pg_error_set(err, PG_EINVAL, "model forward_rows: %d logprob rows for %d logits rows",
                          (int)m->lp_L, (int)b->num_logits);
    if (rc)
        return lp_done(m, rc);
    for (int32_t r = 0; r < b->num_logits; r++)
        if (b->logits_rows[r] < 0 || b->logits_rows[r] >= b->num_tokens ||
            (r > 0 && b->logits_rows[r] <= b->logits_rows[r - 1]))
            return lp_done(m, pg_error_set(err, PG_EINVAL, "model forward_rows: logits_rows[%d] = %d: "
                                           "expected increasing rows in [0, %d)", (int)r,
                                           (int)b->logits_rows[r], (int)b->num_tokens));
    rows_out ro = {.sink = sink, .sink_ctx = sink_ctx, .buf = buf, .slice_rows = slice_rows,
                   .err = err};
    if (b->num_logits <= m->p.max_num_seqs && b->num_logits <= slice_rows) {
        /* as model_forward (the gathered rows: what a decode step or a
         * captured graph computes), then one slice */
        ro.sink = NULL;
        if ((rc = lp_whole(m, b, err)) || (rc = forward_with(m, b, buf, &ro, err)))
            return lp_done(m, rc);
        lp_done(m, 0);
        return b->num_logits > 0 ? sink(sink_ctx, 0, b->num_logits, buf, err) : PG_OK;
    }
    return lp_done(m, forward_with(m, b, buf, &ro, err));
}

int model_greedy_rows(model *m, const uint8_t *greedy, int32_t L, int32_t *ids, pg_error *err)
{
    executor *ex = m->ex;
    if (!ex->op->greedy_rows)
        return pg_error_set(err, PG_EUNSUPPORTED, "model greedy_rows: the %s executor has no "
                            "device-side greedy rows", ex->name);
    if (L < 0 || L > m->p.max_num_seqs)
        return pg_error_set(err, PG_EINVAL, "model greedy_rows: L must be in [0, %d], got %d",
                            (int)m->p.max_num_seqs, (int)L);
    int rc = ex->op->greedy_rows(ex, greedy, L, ids);
    if (rc)
        return op_failed(m, rc, "greedy_rows", -1, err);
    return PG_OK;
}

int model_sample_rows(model *m, const pg_smp_batch *req, pg_error *err)
{
    executor *ex = m->ex;
    if (!ex->op->sample_rows)
        return pg_error_set(err, PG_EUNSUPPORTED, "model sample_rows: the %s executor has no "
                            "device-side sampled rows", ex->name);
    int rc = ex->op->sample_rows(ex, req);
    if (rc)
        return op_failed(m, rc, "sample_rows", -1, err);
    return PG_OK;
}

int model_logprob_rows(model *m, pg_lsm_row *rows, int32_t L, pg_error *err)
{
    if (!m->ex->op->logprob_rows)
        return pg_error_set(err, PG_EUNSUPPORTED, "model logprob_rows: the %s executor has no "
                            "device-side logprob rows", m->ex->name);
    if (L < 0 || (L > 0 && !rows))
        return pg_error_set(err, PG_EINVAL, "model logprob_rows: expected L >= 0 and rows, got L %d",
                            (int)L);
    m->lp_rows = rows;
    m->lp_L = L;
    return PG_OK;
}

int model_copy_blocks(model *m, const int32_t *src_dst, int32_t n_pairs, pg_error *err)
{
    if (n_pairs <= 0)
        return PG_OK;
    for (int32_t k = 0; k < 2 * n_pairs; k++)
        if (src_dst[k] < 0 || src_dst[k] >= m->p.num_kv_blocks)
            return pg_error_set(err, PG_EINVAL,
                                "model copy_blocks: pair %d: block id %d outside [0, %d)",
                                (int)(k / 2), (int)src_dst[k], (int)m->p.num_kv_blocks);
    int rc = m->ex->op->copy_blocks(m->ex, m->kv, 2 * m->NL, m->plane_elems, m->block_elems,
                                    src_dst, n_pairs);
    if (rc)
        return op_failed(m, rc, "copy_blocks", -1, err);
    return PG_OK;
}

/* ---- hidden rows (embeddings) ------------------------------------------- */

/* After the forward, x holds the residual stream before the last layer's
 * mlp_out, which is still in proj (forward_layer's contract). Rows
 * row0 .. row0+n-1 get x += proj and normed = rmsnorm(x) * w_final — per
 * row the arithmetic of forward_head's final rmsnorm, so a row's hidden
 * state is the one its logits would be computed from — and are copied to
 * the host as f32. x is updated in place: each row at most once per
 * forward. */
int model_hidden_rows(model *m, int32_t row0, int32_t n, float *out, pg_error *err)
{
    if (row0 < 0 || n < 1 || row0 > m->p.max_num_batched_tokens - n)
        return pg_error_set(err, PG_EINVAL, "model hidden_rows: rows %d..%d outside [0, %d)",
                            (int)row0, (int)(row0 + n - 1), (int)m->p.max_num_batched_tokens);
    executor *ex = m->ex;
    const size_t off = (size_t)row0 * (size_t)m->H * ex->act_bytes;
    char *x = (char *)m->x + off, *normed = (char *)m->normed + off;
    const char *proj = (const char *)m->proj + off;
    int rc = ex->op->rmsnorm(ex, normed, x, proj, m->final_norm, n, m->H, m->cfg->rms_norm_eps);
    if (rc)
        return op_failed(m, rc, "hidden rows rmsnorm", -1, err);
    rc = ex->op->download_f32(ex, out, normed, EXEC_ACT, (size_t)n * (size_t)m->H);
    if (rc)
        return op_failed(m, rc, "hidden rows download", -1, err);
    return PG_OK;
}

bool model_has_lm_head(const model *m)
{
    return m->lm_head != NULL;
}

/* ---- engine adapter ------------------------------------------------------- */

static int backend_forward(void *ctx, const step_batch *b, float *logits, pg_error *err)
{
    return model_forward(ctx, b, logits, err);
}

static int backend_forward_rows(void *ctx, const step_batch *b, float *buf, int32_t slice_rows,
                                engine_rows_fn sink, void *sink_ctx, pg_error *err)
{
    return model_forward_rows(ctx, b, buf, slice_rows, sink, sink_ctx, err);
}

static int backend_greedy_rows(void *ctx, const uint8_t *greedy, int32_t L, int32_t *ids,
                               pg_error *err)
{
    return model_greedy_rows(ctx, greedy, L, ids, err);
}

static int backend_logprob_rows(void *ctx, pg_lsm_row *rows, int32_t L, pg_error *err)
{
    return model_logprob_rows(ctx, rows, L, err);
}

static int backend_sample_rows(void *ctx, const pg_smp_batch *req, pg_error *err)
{
    return model_sample_rows(ctx, req, err);
}

static int backend_step_defer(void *ctx, pg_error *err)
{
    model *m = ctx;
    int rc = m->ex->op->defer_step(m->ex);
    return rc ? op_failed(m, rc, "defer_step", -1, err) : PG_OK;
}

static int backend_step_wait(void *ctx, pg_error *err)
{
    model *m = ctx;
    int rc = m->ex->op->wait_step(m->ex);
    return rc ? op_failed(m, rc, "wait_step", -1, err) : PG_OK;
}

static int backend_copy_blocks(void *ctx, const int32_t *src_dst, int32_t n_pairs,
                               pg_error *err)
{
    return model_copy_blocks(ctx, src_dst, n_pairs, err);
}

static int backend_hidden_rows(void *ctx, int32_t row0, int32_t n, float *out, pg_error *err)
{
    return model_hidden_rows(ctx, row0, n, out, err);
}

engine_backend model_backend(model *m)
{
    engine_backend be = {
        .ctx = m,
        .vocab_size = m->V,
        .forward = backend_forward,
        .forward_rows = backend_forward_rows,
        .copy_blocks = backend_copy_blocks,
        .hidden_rows = backend_hidden_rows,
        .hidden_size = m->H,
        /* only where the executor takes greedy rows on the device (CUDA) */
        .greedy_rows = m->ex->op->greedy_rows ? backend_greedy_rows : NULL,
        /* likewise logprob rows */
        .logprob_rows = m->ex->op->logprob_rows ? backend_logprob_rows : NULL,
        /* likewise sampled rows */
        .sample_rows = m->ex->op->sample_rows ? backend_sample_rows : NULL,
        /* an asynchronous executor (CUDA): the engine's overlapped loop */
        .step_defer = m->ex->op->defer_step && m->ex->op->wait_step ? backend_step_defer : NULL,
        .step_wait = m->ex->op->defer_step && m->ex->op->wait_step ? backend_step_wait : NULL,
    };
    return be;
}
