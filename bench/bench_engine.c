/* bench_engine: load a model once, run workloads through fresh engines. */
#include "bench_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_machine.h"
#include "kv_pool.h"
#include "cpu_executor.h"
#include "safetensors.h"

void bench_model_free(bench_model *bm)
{
    if (!bm)
        return;
    model_destroy(bm->m);
    if (bm->ex)
        bm->ex->op->destroy(bm->ex);
    memset(bm, 0, sizeof(*bm));
}

int bench_model_load(bench_model *bm, const char *dir, int32_t threads, const model_params *mp,
                     pg_error *err)
{
    cpu_executor_params cp = {.threads = threads};
    return bench_model_load_with(bm, dir, &cp, mp, err);
}

int bench_model_load_with(bench_model *bm, const char *dir, const cpu_executor_params *cp,
                          const model_params *mp, pg_error *err)
{
    const int32_t threads = cp->threads;
    memset(bm, 0, sizeof(*bm));
    snprintf(bm->dir, sizeof(bm->dir), "%s", dir);
    const char *slash = strrchr(dir, '/');
    const char *base = slash && slash[1] ? slash + 1 : dir;
    snprintf(bm->name, sizeof(bm->name), "%s", base);
    bm->name[strcspn(bm->name, "/")] = '\0';
    bm->threads = threads;
    bm->mp = *mp;

    double t0 = bench_now_s();
    int rc = llama_config_load(&bm->cfg, dir, err);
    if (rc != 0)
        return rc;
    st_file *st = NULL;
    rc = st_open(&st, dir, err);
    if (rc != 0)
        return rc;
    rc = cpu_executor_create(&bm->ex, cp, err);
    if (rc == 0)
        rc = model_create(&bm->m, bm->ex, &bm->cfg, st, mp, err);
    st_close(st);
    if (rc != 0) {
        bench_model_free(bm);
        return rc;
    }
    bm->backend = model_backend(bm->m);
    bm->weight_bytes = model_weight_bytes(&bm->cfg, bm->ex);
    bm->kv_bytes_per_block = model_kv_bytes_per_block(&bm->cfg, bm->ex, mp->block_size);
    const llama_config *c = &bm->cfg;
    double H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    double nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    bm->params_layers = (double)c->num_hidden_layers *
                        (H * (nh + 2.0 * nkv) * hd + nh * hd * H + 3.0 * H * I);
    bm->params_total = bm->params_layers + (double)c->vocab_size * H *
                                               (c->tie_word_embeddings ? 1.0 : 2.0);
    bm->load_s = bench_now_s() - t0;
    return 0;
}

int32_t bench_model_ctx(const bench_model *bm) { return bm->cfg.max_position_embeddings; }

bench_run_params bench_run_params_default(const bench_model *bm)
{
    bench_run_params p;
    memset(&p, 0, sizeof(p));
    p.num_blocks = bm->mp.num_kv_blocks;
    p.block_size = bm->mp.block_size;
    p.max_num_seqs = bm->mp.max_num_seqs;
    p.max_num_batched_tokens = bm->mp.max_num_batched_tokens;
    p.max_model_len = 0;
    p.prefix_caching = true;
    p.layout = KV_LAYOUT_PAGED;
    p.n = 1;
    p.temperature = 0.0f;
    p.prompt_logprobs = -1;
    p.seed = 1;
    return p;
}

/* Model FLOPs of a run (counted, not measured):
 *   2 * params_layers per token through the layers
 *       (prompt tokens computed, recomputation included, + every generated
 *        token except each sequence's last, which is never fed back),
 *   2 * V * H per logits row (one per generated token),
 *   4 * n_layers * nh * hd per (query, key) pair of attention (q.k and p.v),
 *       summed analytically over the workload's positions (the prompt once,
 *       the decode part per parallel sample; recomputation not included). */
static double run_flops(const bench_model *bm, const bench_workload *w, int32_t n,
                        const engine_stats *st)
{
    const llama_config *c = &bm->cfg;
    double seqs = (double)w->n * n;
    double layer_tokens = (double)st->prompt_tokens + (double)st->generated_tokens - seqs;
    double f = 2.0 * bm->params_layers * layer_tokens;
    f += 2.0 * (double)c->vocab_size * (double)c->hidden_size * (double)st->generated_tokens;
    double pairs = 0.0;
    for (int32_t i = 0; i < w->n; i++) {
        double P = w->prompt_len[i], G = w->output_len[i];
        pairs += P * (P + 1.0) / 2.0;
        /* positions P .. P+G-2 attend to p+1 keys each */
        pairs += (double)n * ((P + G - 1.0) * (P + G) / 2.0 - P * (P + 1.0) / 2.0);
    }
    f += 4.0 * (double)c->num_hidden_layers * (double)c->num_attention_heads *
         (double)c->head_dim * pairs;
    return f;
}

/* Adds requests [from, to) of w; on error err names the request. */
static int add_requests(engine *e, const bench_workload *w, const bench_run_params *rp,
                        int32_t from, int32_t to, pg_error *err)
{
    for (int32_t i = from; i < to; i++) {
        sampling_params sp = sampling_params_default();
        sp.n = rp->n > 0 ? rp->n : 1;
        sp.max_tokens = w->output_len[i];
        sp.temperature = rp->temperature;
        if (rp->top_p > 0.0f) sp.top_p = rp->top_p;
        sp.seed = rp->seed + (uint64_t)i;
        sp.ignore_eos = true;
        sp.lora = rp->n_loras > 0 ? 1 + i % rp->n_loras : 0;
        if (rp->beam_search) {
            sp.use_beam_search = true;
            sp.temperature = 0.0f;
        }
        sp.prompt_logprobs = rp->prompt_logprobs;
        sp.prompt_logprobs_from = rp->prompt_logprobs_from ? rp->prompt_logprobs_from[i] : 0;
        uint64_t id;
        int rc = engine_add_request(e, w->prompt_ids[i], w->prompt_len[i], &sp,
                                    (void *)(intptr_t)i, &id, err);
        if (rc != 0)
            return pg_error_wrap(err, rc, "bench_run: request %d of '%s' (prompt %d, output %d)",
                                 i, w->name, w->prompt_len[i], w->output_len[i]);
    }
    return 0;
}

int bench_run(bench_model *bm, const bench_workload *w, const bench_run_params *rp,
              bench_result *out, pg_error *err)
{
    memset(out, 0, sizeof(*out));
    if (rp->block_size != bm->mp.block_size || rp->num_blocks > bm->mp.num_kv_blocks ||
        rp->max_num_seqs > bm->mp.max_num_seqs ||
        rp->max_num_batched_tokens > bm->mp.max_num_batched_tokens)
        return pg_error_set(err, PG_EINVAL, "bench_run: run needs block_size %d, <= %d blocks, "
                            "<= %d seqs, <= %d tokens per step (the model's sizes); got %d, %d, "
                            "%d, %d", bm->mp.block_size, bm->mp.num_kv_blocks,
                            bm->mp.max_num_seqs, bm->mp.max_num_batched_tokens, rp->block_size,
                            rp->num_blocks, rp->max_num_seqs, rp->max_num_batched_tokens);
    engine_params ep = engine_params_default();
    ep.block_size = rp->block_size;
    ep.num_blocks = rp->num_blocks;
    ep.max_num_seqs = rp->max_num_seqs;
    ep.max_num_batched_tokens = rp->max_num_batched_tokens;
    ep.max_model_len = rp->max_model_len > 0 ? rp->max_model_len : bench_model_ctx(bm);
    ep.prefix_caching = rp->prefix_caching;
    ep.layout = rp->layout;
    ep.check_invariants = false;
    ep.fan_out_always = rp->fan_out_always;
    ep.beam_copy_blocks = rp->beam_copy_blocks;
    ep.prompt_logprobs_per_step = rp->prompt_logprobs_per_step;
    ep.sliding_window = rp->keep_window_blocks ? 0 : bm->cfg.sliding_window;
    ep.n_loras = rp->n_loras;
    ep.max_loras = rp->n_loras;
    ep.eos_token_ids = bm->cfg.eos_token_ids;
    ep.n_eos_token_ids = bm->cfg.n_eos_token_ids;

    engine *e = NULL;
    int rc = engine_create(&e, &ep, &bm->backend, NULL, err);
    if (rc != 0)
        return rc;

    int32_t n = rp->n > 0 ? rp->n : 1;
    int32_t n_added = rp->first_ahead ? 1 : w->n;
    rc = add_requests(e, w, rp, 0, n_added, err);
    engine_stats before, after;
    engine_get_stats(e, &before);
    double occ_sum = 0.0, run_sum = 0.0;
    uint64_t steps = 0;
    int32_t bad = 0, first_bad = -1, bad_got = 0;
    double t_start = bench_now_s();
    while (rc == 0 && (engine_has_unfinished(e) || n_added < w->n)) {
        if (n_added < w->n && (before.prompt_tokens >= (uint64_t)w->prompt_len[0] ||
                               !engine_has_unfinished(e))) {
            /* first_ahead: request 0's prompt is computed (and cached) now */
            rc = add_requests(e, w, rp, n_added, w->n, err);
            n_added = w->n;
            if (rc != 0)
                break;
        }
        double t0 = bench_now_s();
        rc = engine_step(e, err);
        double dt = bench_now_s() - t0;
        if (rc != 0) {
            pg_error_wrap(err, rc, "bench_run: step %llu of '%s'", (unsigned long long)steps,
                          w->name);
            break;
        }
        engine_get_stats(e, &after);
        if (after.prompt_tokens > before.prompt_tokens) {
            out->prefill_s += dt;
        } else {
            out->decode_s += dt;
            out->decode_generated += after.generated_tokens - before.generated_tokens;
        }
        occ_sum += (double)after.blocks_in_use / (double)(after.num_blocks > 0 ? after.num_blocks : 1);
        int64_t entries = kv_pool_table_entries(engine_kv_pool(e));
        out->kv_shared_sum += (double)after.blocks_in_use;
        out->kv_unshared_sum += (double)entries;
        if (after.blocks_in_use > out->kv_shared_peak) out->kv_shared_peak = after.blocks_in_use;
        if (entries > out->kv_unshared_peak) out->kv_unshared_peak = entries;
        run_sum += (double)after.running;
        steps++;
        before = after;
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            int32_t i = (int32_t)(intptr_t)o->user;
            for (int32_t k = 0; k < o->n_outputs; k++)
                if (o->outputs[k].n_tokens != w->output_len[i] && bad++ == 0) {
                    first_bad = i;
                    bad_got = o->outputs[k].n_tokens;
                }
            if (o->n_outputs != n && bad++ == 0) {
                first_bad = i;
                bad_got = -o->n_outputs;
            }
            out->requests++;
            out->seqs += o->n_outputs;
            request_output_free(o);
        }
    }
    out->wall_s = bench_now_s() - t_start;
    engine_get_stats(e, &out->stats);
    engine_destroy(e);
    if (rc != 0)
        return rc;

    if (bad > 0 || out->requests != w->n)
        return pg_error_set(err, PG_EFORMAT, "bench_run: '%s': %d sequences did not generate "
                            "their fixed output length (first: request %d, expected %d tokens "
                            "x %d samples, got %d); %d of %d requests finished", w->name, bad,
                            first_bad, first_bad >= 0 ? w->output_len[first_bad] : 0, n, bad_got,
                            out->requests, w->n);
    const engine_stats *s = &out->stats;
    double wall = out->wall_s > 0.0 ? out->wall_s : 1e-9;
    out->req_per_s = (double)out->requests / wall;
    out->gen_tok_s = (double)s->generated_tokens / wall;
    out->prompt_tok_s = out->prefill_s > 0.0 ? (double)s->prompt_tokens / out->prefill_s : 0.0;
    out->decode_tok_s = out->decode_s > 0.0 ? (double)out->decode_generated / out->decode_s : 0.0;
    out->flops = run_flops(bm, w, n, s);
    out->gflops = out->flops / wall * 1e-9;
    out->occupancy_mean = steps ? occ_sum / (double)steps : 0.0;
    out->running_mean = steps ? run_sum / (double)steps : 0.0;
    return 0;
}
