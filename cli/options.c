/* options: getopt_long over the two subcommands, help text with defaults. */
#include "options.h"

#include "executor.h" /* PG_LORA_MAX_RANK */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum {
    OPT_TOKENIZER = 256, OPT_INPUT_FORMAT, OPT_DEVICE, OPT_THREADS, OPT_BLOCK_SIZE,
    OPT_KV_MEM, OPT_NUM_KV_BLOCKS, OPT_MAX_NUM_SEQS, OPT_MAX_BATCHED, OPT_MAX_MODEL_LEN,
    OPT_NO_PREFIX, OPT_KEEP_WINDOW, OPT_SEED, OPT_KV_LAYOUT, OPT_CHECK_INV,
    OPT_MAX_TOKENS, OPT_TEMPERATURE, OPT_TOP_P, OPT_TOP_K, OPT_MIN_P, OPT_N, OPT_STOP,
    OPT_IGNORE_EOS, OPT_MIN_TOKENS, OPT_PRESENCE, OPT_FREQUENCY, OPT_REPETITION, OPT_LOGPROBS,
    OPT_INCLUDE_PROMPT, OPT_UNORDERED, OPT_RESUME, OPT_METRICS, OPT_LOG_INTERVAL, OPT_SHARD,
    OPT_NO_SPECIAL, OPT_VERSION,
    OPT_GPU_UTIL, OPT_KV_DTYPE, OPT_DTYPE, OPT_CUDA_DEVICE, OPT_FAST_GEMM, OPT_ENFORCE_EAGER,
    OPT_CHAT_TEMPLATE, OPT_CHAT_DATE,
    OPT_SERVED_MODEL_NAME, OPT_STRICT, OPT_TRUNCATE_MAX_TOKENS,
    OPT_QUANT, OPT_PROFILE_OPS, OPT_PROFILE_STEPS, OPT_POOLING,
    OPT_GENERATION_CONFIG, OPT_REASONING_PARSER,
    OPT_PLP_PER_STEP, OPT_PPL_CTX, OPT_PPL_BATCH, OPT_MATMUL_PRECISION,
    OPT_LORA, OPT_MAX_LORAS, OPT_MAX_LORA_RANK,
};

static const struct option generate_opts[] = {
    {"model", required_argument, NULL, 'm'},
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
    {"input", required_argument, NULL, 'i'},
    {"output", required_argument, NULL, 'o'},
    {"input-format", required_argument, NULL, OPT_INPUT_FORMAT},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"kv-cache-memory", required_argument, NULL, OPT_KV_MEM},
    {"num-kv-blocks", required_argument, NULL, OPT_NUM_KV_BLOCKS},
    {"max-num-seqs", required_argument, NULL, OPT_MAX_NUM_SEQS},
    {"max-num-batched-tokens", required_argument, NULL, OPT_MAX_BATCHED},
    {"max-model-len", required_argument, NULL, OPT_MAX_MODEL_LEN},
    {"no-prefix-caching", no_argument, NULL, OPT_NO_PREFIX},
    {"keep-out-of-window-blocks", no_argument, NULL, OPT_KEEP_WINDOW},
    {"seed", required_argument, NULL, OPT_SEED},
    {"kv-layout", required_argument, NULL, OPT_KV_LAYOUT},
    {"check-invariants", no_argument, NULL, OPT_CHECK_INV},
    {"prompt-logprobs-per-step", no_argument, NULL, OPT_PLP_PER_STEP},
    {"gpu-memory-utilization", required_argument, NULL, OPT_GPU_UTIL},
    {"kv-cache-dtype", required_argument, NULL, OPT_KV_DTYPE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"quantization", required_argument, NULL, OPT_QUANT},
    {"matmul-precision", required_argument, NULL, OPT_MATMUL_PRECISION},
    {"cuda-device", required_argument, NULL, OPT_CUDA_DEVICE},
    {"fast-gemm", no_argument, NULL, OPT_FAST_GEMM},
    {"enforce-eager", no_argument, NULL, OPT_ENFORCE_EAGER},
    {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
    {"chat-template-date", required_argument, NULL, OPT_CHAT_DATE},
    {"reasoning-parser", required_argument, NULL, OPT_REASONING_PARSER},
    {"generation-config", required_argument, NULL, OPT_GENERATION_CONFIG},
    {"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
    {"temperature", required_argument, NULL, OPT_TEMPERATURE},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"top-k", required_argument, NULL, OPT_TOP_K},
    {"min-p", required_argument, NULL, OPT_MIN_P},
    {"n", required_argument, NULL, OPT_N},
    {"stop", required_argument, NULL, OPT_STOP},
    {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
    {"min-tokens", required_argument, NULL, OPT_MIN_TOKENS},
    {"presence-penalty", required_argument, NULL, OPT_PRESENCE},
    {"frequency-penalty", required_argument, NULL, OPT_FREQUENCY},
    {"repetition-penalty", required_argument, NULL, OPT_REPETITION},
    {"logprobs", required_argument, NULL, OPT_LOGPROBS},
    {"include-prompt", no_argument, NULL, OPT_INCLUDE_PROMPT},
    {"unordered", no_argument, NULL, OPT_UNORDERED},
    {"resume", no_argument, NULL, OPT_RESUME},
    {"metrics", no_argument, NULL, OPT_METRICS},
    {"profile-ops", no_argument, NULL, OPT_PROFILE_OPS},
    {"profile-steps", no_argument, NULL, OPT_PROFILE_STEPS},
    {"quiet", no_argument, NULL, 'q'},
    {"log-interval", required_argument, NULL, OPT_LOG_INTERVAL},
    {"shard", required_argument, NULL, OPT_SHARD},
    {"served-model-name", required_argument, NULL, OPT_SERVED_MODEL_NAME},
    {"lora", required_argument, NULL, OPT_LORA},
    {"max-loras", required_argument, NULL, OPT_MAX_LORAS},
    {"max-lora-rank", required_argument, NULL, OPT_MAX_LORA_RANK},
    {"strict", no_argument, NULL, OPT_STRICT},
    {"truncate-max-tokens", no_argument, NULL, OPT_TRUNCATE_MAX_TOKENS},
    {"pooling", required_argument, NULL, OPT_POOLING},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static const struct option tokenize_opts[] = {
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
    {"model", required_argument, NULL, 'm'},
    {"input", required_argument, NULL, 'i'},
    {"output", required_argument, NULL, 'o'},
    {"input-format", required_argument, NULL, OPT_INPUT_FORMAT},
    {"no-special", no_argument, NULL, OPT_NO_SPECIAL},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static const struct option chat_template_opts[] = {
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
    {"model", required_argument, NULL, 'm'},
    {"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
    {"chat-template-date", required_argument, NULL, OPT_CHAT_DATE},
    {"input", required_argument, NULL, 'i'},
    {"output", required_argument, NULL, 'o'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static const struct option merge_opts[] = {
    {"input", required_argument, NULL, 'i'},
    {"output", required_argument, NULL, 'o'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static const struct option perplexity_opts[] = {
    {"model", required_argument, NULL, 'm'},
    {"file", required_argument, NULL, 'f'},
    {"ctx", required_argument, NULL, OPT_PPL_CTX},
    {"batch-size", required_argument, NULL, OPT_PPL_BATCH},
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"kv-cache-memory", required_argument, NULL, OPT_KV_MEM},
    {"num-kv-blocks", required_argument, NULL, OPT_NUM_KV_BLOCKS},
    {"max-num-seqs", required_argument, NULL, OPT_MAX_NUM_SEQS},
    {"check-invariants", no_argument, NULL, OPT_CHECK_INV},
    {"prompt-logprobs-per-step", no_argument, NULL, OPT_PLP_PER_STEP},
    {"gpu-memory-utilization", required_argument, NULL, OPT_GPU_UTIL},
    {"kv-cache-dtype", required_argument, NULL, OPT_KV_DTYPE},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"quantization", required_argument, NULL, OPT_QUANT},
    {"matmul-precision", required_argument, NULL, OPT_MATMUL_PRECISION},
    {"cuda-device", required_argument, NULL, OPT_CUDA_DEVICE},
    {"fast-gemm", no_argument, NULL, OPT_FAST_GEMM},
    {"enforce-eager", no_argument, NULL, OPT_ENFORCE_EAGER},
    {"quiet", no_argument, NULL, 'q'},
    {"log-interval", required_argument, NULL, OPT_LOG_INTERVAL},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static const char *const generate_help[] = {
"usage: pagedgen [generate] -m MODEL_DIR [-i FILE|-] [-o FILE|-] [options]\n"
"\n"
"Runs a LLaMA-family model over a batch of prompts and writes one JSON line\n"
"per request. Reads stdin and writes stdout by default (works as a filter).\n"
"\n"
"Files:\n"
"  -m, --model DIR            model folder (config.json, *.safetensors) [required]\n"
"      --tokenizer DIR        tokenizer.json folder [default: the model folder; prompts\n"
"                             given as prompt_token_ids need none]\n"
"  -i, --input FILE|-         prompts [default: - (stdin)]\n"
"  -o, --output FILE|-        results [default: - (stdout); an existing file is replaced\n"
"                             unless --resume]\n"
"      --input-format F       auto|text|jsonl|openai [default: auto: a first non-blank\n"
"                             line starting with '{' is jsonl, or openai when it has\n"
"                             \"custom_id\"/\"body\"; anything else is text]\n"
"\n"
"Chat (jsonl lines with \"messages\", openai /v1/chat/completions lines):\n"
"      --chat-template FILE   Jinja chat template; always wins [default: the\n"
"                             tokenizer folder's: tokenizer_config.json\n"
"                             \"chat_template\", else chat_template.jinja, else\n"
"                             chat_template.json; none: chat lines get an error]\n"
"      --chat-template-date YYYY-MM-DD  the day strftime_now() sees (12:00 UTC)\n"
"                             [default: $SOURCE_DATE_EPOCH when set, else the clock\n"
"                             (UTC): then a template that prints the date makes the\n"
"                             output depend on the day of the run]\n"
"      --reasoning-parser P   qwen3|deepseek_r1: split the <think>...</think> part of\n"
"                             each chat reply off into the message's \"reasoning\"\n"
"                             (vLLM's --reasoning-parser) [default: none]\n"
"\n"
,
"Engine (vLLM names):\n"
"      --device D             auto|cpu|cuda [default: auto = cuda when built with CUDA\n"
"                             and a device is present, else cpu]; cuda:0,1,... or\n"
"                             cuda:all: one worker per GPU, same output (-i FILE)\n"
"      --threads N            CPU threads [default: 0 = one per online core]\n"
"      --block-size N         tokens per KV block, power of two <= 256 [default: 16]\n"
"      --kv-cache-memory SIZE KV cache size, e.g. 2GiB, 512MiB (KiB/MiB/GiB = 1024^k,\n"
"                             KB/MB/GB = 1000^k) [default: cpu: 40% of MemAvailable;\n"
"                             cuda: from --gpu-memory-utilization; both capped to\n"
"                             max-num-seqs x max-model-len tokens]\n"
"      --num-kv-blocks N      KV pool size in blocks (overrides --kv-cache-memory)\n"
"                             [default: from --kv-cache-memory]\n"
"      --max-num-seqs N       most sequences in one step [default: 256]\n"
"      --max-num-batched-tokens N  token budget of one step [default: 2048]\n"
"      --max-model-len N      context limit, prompt + output [default: config\n"
"                             max_position_embeddings]\n"
"      --no-prefix-caching    do not share cached prompt blocks [default: caching on]\n"
"      --keep-out-of-window-blocks  with a sliding-window model, keep KV blocks no\n"
"                             query reads any more instead of freeing them\n"
"                             (comparisons; outputs are the same) [default: free]\n"
"      --seed N               base seed; a line without \"seed\" gets\n"
"                             hash(seed, request index) [default: 0]\n"
"      --kv-layout L          paged|contiguous [default: paged]\n"
"      --pooling P            embedding lines: last|mean|cls over the final hidden\n"
"                             states [default: the model's sentence-transformers\n"
"                             1_Pooling/config.json, else last (vLLM's default)]\n"
"      --check-invariants     check the block pool after every step (slow; debugging)\n"
"                             [default: off]\n"
"      --prompt-logprobs-per-step  prefill a request with prompt logprobs one token\n"
"                             a step, as before issue 21 (tests and benchmarks;\n"
"                             the same values, slower) [default: in chunks]\n"
"\n"
,
"Precision and CUDA (vLLM names; see cli/README.md):\n"
"      --gpu-memory-utilization X  share of the device's total memory pagedgen may\n"
"                             use, (0, 1]: the KV cache gets X x total minus what is\n"
"                             in use after loading the weights and running one\n"
"                             largest step (measured) minus the buffers still to\n"
"                             grow [default: 0.9; cuda only]\n"
"      --kv-cache-dtype T     auto|bf16|fp16|f32 [default: auto = on cuda the compute\n"
"                             dtype (bf16; f32 with --dtype float32, which f32 on\n"
"                             cuda needs); on the cpu f32 for f32 weights, bf16 for\n"
"                             bf16 and int8 weights]\n"
"      --dtype T              auto|bfloat16|float32: on cuda the compute precision\n"
"                             [default: auto = bfloat16]; on the cpu how the weights\n"
"                             are stored, always computed with in float32 [default:\n"
"                             auto = bfloat16 for a bf16 checkpoint (lossless), else\n"
"                             float32 (an f16 checkpoint stays exact)]\n"
"      --quantization int8    cpu: int8 weights, one f32 scale per 32 (quantized\n"
"                             while loading) [default: none]\n"
"      --matmul-precision P   cpu: exact|bf16|int8, the arithmetic of the matrix\n"
"                             products: exact = f32; bf16 = bf16 activations and\n"
"                             weights, pairs summed in f32 (weights rounded to bf16\n"
"                             at load); int8 = int8 activations (per 32) times int8\n"
"                             weights, summed in int32. Faster, less precise; each\n"
"                             mode still gives the same bits for any batch and\n"
"                             thread count [default: exact]\n"
"      --cuda-device N        CUDA device ordinal [default: 0]\n"
"      --fast-gemm            one cuBLAS call per matmul: faster prefill, but a row's\n"
"                             last bits may depend on the batch, so outputs are no\n"
"                             longer independent of batching [default: off]\n"
"      --enforce-eager        cuda: run every step op by op, no CUDA graphs for\n"
"                             the decode steps [default: off = graphs on]\n"
"\n"
,
"Default sampling (for lines that do not set their own; vLLM semantics):\n"
"      --generation-config G  auto|vllm: auto takes the defaults below from the\n"
"                             model's generation_config.json (temperature, top_p,\n"
"                             top_k, min_p, repetition_penalty, max_new_tokens);\n"
"                             vllm ignores them (its eos ids still count), as vLLM's\n"
"                             --generation-config vllm [default: auto]\n"
"      --max-tokens N         tokens to generate, -1 = until eos or the context is\n"
"                             full [default: 256]\n"
"      --temperature X        0 = greedy [default: generation_config.json's, else 1;\n"
"                             its do_sample is ignored, as in vLLM]\n"
"      --top-p X              (0, 1] [default: generation_config.json's, else 1]\n"
"      --top-k N              -1 = off [default: generation_config.json's, else -1]\n"
"      --min-p X              [0, 1] [default: 0]\n"
"      --n N                  samples per prompt [default: 1]\n"
"      --stop STR             stop string; repeat for several [default: none]\n"
"      --ignore-eos           keep generating past eos [default: off]\n"
"      --min-tokens N         block eos/stop before N tokens [default: 0]\n"
"      --presence-penalty X   [-2, 2] [default: 0]\n"
"      --frequency-penalty X  [-2, 2] [default: 0]\n"
"      --repetition-penalty X > 0, 1 = off [default: 1]\n"
"      --logprobs K           logprob of each sampled token plus the top K\n"
"                             [default: none]\n"
"\n"
,
"Output and run control:\n"
"      --include-prompt       add prompt and prompt_token_ids to each record\n"
"                             [default: off]\n"
"      --unordered            write records as requests finish [default: input order,\n"
"                             through a bounded reorder buffer: when it is full the\n"
"                             reader waits for the oldest request]\n"
"      --resume               keep the records already in -o FILE (answered ids and\n"
"                             error lines are skipped), repair a trailing partial line,\n"
"                             append the rest [default: off]\n"
"      --metrics              add per-request timings and a real \"created\" time\n"
"                             (output is then no longer byte-reproducible) [default: off]\n"
"      --profile-ops          cpu: time every op of the forward and print, after the\n"
"                             summary, each op's share of the prefill and of the\n"
"                             decode steps on stderr [default: off]\n"
"      --profile-steps        time every engine step's phases (schedule, metadata,\n"
"                             h2d copy, launch, next step ahead, wait for device,\n"
"                             d2h copy, sample, output) and, on cuda in eager steps,\n"
"                             each op's device\n"
"                             time (events); print them and the kernel launches per\n"
"                             decode step after the summary on stderr [default: off]\n"
"  -q, --quiet                no progress and no summary on stderr [default: off]\n"
"      --log-interval SEC     progress line period when stderr is not a terminal\n"
"                             [default: 10]\n"
"      --shard K/N|auto[/N]   only requests whose index = K (mod N) [default: 0/1];\n"
"                             auto: K and N from SLURM_ARRAY_TASK_ID/_COUNT,\n"
"                             JOB_COMPLETION_INDEX (with auto/N) or\n"
"                             AWS_BATCH_JOB_ARRAY_INDEX/_SIZE. With -o FILE a finished\n"
"                             shard leaves FILE.done; -o with {shard}, or a directory,\n"
"                             names the file NAME.K-of-N.jsonl (see merge --help)\n"
"      --served-model-name N  the name openai bodies' \"model\" must match (else vLLM's\n"
"                             404 record) and responses carry [default: the -m\n"
"                             folder's name; -m as given is accepted too]\n"
"      --lora NAME=DIR        a PEFT LoRA adapter (adapter_config.json +\n"
"                             adapter_model.safetensors in DIR) that lines whose\n"
"                             \"model\" is NAME run under; repeat for several\n"
"                             [default: none]\n"
"      --max-loras N          most distinct adapters in one step (vLLM's max_loras)\n"
"                             [default: 1]\n"
"      --max-lora-rank N      adapters of a larger rank are refused [default: 16]\n"
"      --strict               unknown fields and loosely typed values (3.0 for an int,\n"
"                             \"0.5\" for a float) are per-line errors [default:\n"
"                             accepted as vLLM does, counted in the summary]\n"
"      --truncate-max-tokens  cut max_tokens to the context left after the prompt\n"
"                             [default: prompt + max_tokens > --max-model-len is a\n"
"                             per-line error, vLLM's 400]\n"
"  -h, --help                 this help\n"
"      --version              print the version\n"
"\n"
,
"Input lines (jsonl): {\"id\": string|integer (default: the request index), \"prompt\": str\n"
"or \"prompt_token_ids\": [int], and optionally max_tokens, min_tokens, temperature,\n"
"top_p, top_k, min_p, seed, n, stop, stop_token_ids, ignore_eos,\n"
"include_stop_str_in_output, skip_special_tokens, presence_penalty,\n"
"frequency_penalty, repetition_penalty, logprobs}. A chat line has \"messages\"\n"
"instead of a prompt, plus add_generation_prompt (default true),\n"
"continue_final_message, chat_template_kwargs, tools, documents,\n"
"max_completion_tokens, logprobs (true/false), top_logprobs, include_reasoning;\n"
"without max_tokens it runs to the end of the context (vLLM's chat default)\n"
"unless --max-tokens is given. openai lines: /v1/completions and\n"
"/v1/chat/completions.\n"
"The request index counts non-blank lines from 0. A bad line gets an error\n"
"record and the run goes on.\n"
"\n"
"Exit codes: 0 success, 1 some lines failed, 2 usage error, 3 model, tokenizer or\n"
"chat template load error (a template that does not parse: its line and column),\n"
"4 I/O error, 130 interrupted (SIGINT/SIGTERM; finished records are flushed,\n"
"--resume completes the run).\n",
    NULL,
};

static const char *const tokenize_help =
"usage: pagedgen tokenize --tokenizer DIR [-i FILE|-] [-o FILE|-] [options]\n"
"\n"
"Writes {\"ids\": [...], \"count\": N} for each input line, in order.\n"
"\n"
"      --tokenizer DIR        folder holding tokenizer.json [required, or -m]\n"
"  -m, --model DIR            use the model folder's tokenizer [default: none]\n"
"  -i, --input FILE|-         input [default: - (stdin)]\n"
"  -o, --output FILE|-        output [default: - (stdout)]\n"
"      --input-format F       auto|text|jsonl [default: auto: jsonl when the first\n"
"                             non-blank line starts with '{'; jsonl lines are\n"
"                             {\"text\": \"...\"}, other fields are ignored]\n"
"      --no-special           do not add special tokens (BOS) [default: add them]\n"
"  -h, --help                 this help\n"
"      --version              print the version\n";

static const char *const chat_template_help =
"usage: pagedgen chat-template --tokenizer DIR [--chat-template FILE]\n"
"                              [--chat-template-date YYYY-MM-DD] [-i FILE|-] [-o FILE|-]\n"
"\n"
"Renders each input line, a chat request {\"messages\": [...],\n"
"\"add_generation_prompt\", \"continue_final_message\", \"tools\", \"documents\",\n"
"\"chat_template_kwargs\"} (other fields are ignored), with the model's chat\n"
"template and writes {\"text\": \"<prompt>\", \"token_ids\": [...]} (tokenized as\n"
"generate does: no BOS added, special tokens in the text are tokens), or\n"
"{\"error\": {\"message\", \"line\"}} (a template's raise_exception message\n"
"included), in order. add_generation_prompt defaults to false here\n"
"(transformers' default; generate's chat lines default to true, as vLLM).\n"
"\n"
"      --tokenizer DIR        folder holding tokenizer.json (and tokenizer_config.json\n"
"                             with the template, bos_token, eos_token) [required, or -m]\n"
"  -m, --model DIR            use the model folder's tokenizer [default: none]\n"
"      --chat-template FILE   Jinja chat template; always wins [default: the\n"
"                             tokenizer folder's]\n"
"      --chat-template-date YYYY-MM-DD  the day strftime_now() sees (12:00 UTC)\n"
"                             [default: $SOURCE_DATE_EPOCH when set, else the clock]\n"
"  -i, --input FILE|-         input [default: - (stdin)]\n"
"  -o, --output FILE|-        output [default: - (stdout)]\n"
"  -h, --help                 this help\n"
"      --version              print the version\n"
"\n"
"Exit codes: 0 success, 1 some lines failed, 2 usage error, 3 tokenizer or\n"
"template load error (a template that does not parse: its line and column),\n"
"4 I/O error.\n";

static const char *const merge_help =
"usage: pagedgen merge -i INPUT [-o OUT|-] SHARD_OUTPUT...\n"
"\n"
"Joins the outputs of `pagedgen --shard K/N -o FILE` runs (each with its\n"
"FILE.done marker) into one file in input order, the bytes a single run\n"
"writes. Streams: one line per shard in memory.\n"
"\n"
"  -i, --input FILE           the input every shard ran over [required]\n"
"  -o, --output FILE|-        the merged file, written only when complete\n"
"                             (FILE.tmp, then renamed) [default: - (stdout)]\n"
"  -h, --help                 this help\n"
"\n"
"Refused (exit 2): shards of another input (size and hash), with other\n"
"output-shaping flags, of different N, or one shard given twice. Exit 1:\n"
"a shard missing or unfinished, a request without its record or with two\n"
"(each listed on stderr with its id and line). 4: I/O error.\n";

static const char *const perplexity_help =
"usage: pagedgen perplexity -m MODEL_DIR -f TEXT [--ctx N] [--batch-size B] [options]\n"
"\n"
"llama.cpp's llama-perplexity: the text is tokenized once (with BOS when the\n"
"tokenizer adds one), cut into consecutive windows of N tokens (the rest is\n"
"dropped; at least 2 windows), each window starts with BOS and scores its second\n"
"half (positions N/2+1 .. N-1: every scored token has N/2 tokens of context).\n"
"Windows run batched through the engine. The running estimate goes to stderr,\n"
"one JSON line to stdout: {\"ppl\", \"ppl_stderr\" (llama.cpp's), \"nll\",\n"
"\"tokens_scored\", \"windows\", \"ctx\", \"tokens_evaluated\", \"seconds\",\n"
"\"tok_per_s\" (evaluated tokens), \"scored_tok_per_s\"}. See cli/README.md.\n"
"\n"
"  -m, --model DIR            Hugging Face model folder [required]\n"
"  -f, --file TEXT            the text file [required]\n"
"      --ctx N                window length in tokens (llama.cpp -c) [default: 512]\n"
"      --batch-size B         tokens per engine step (llama.cpp -b; vLLM's\n"
"                             max-num-batched-tokens) [default: 2048]\n"
"      --tokenizer DIR        tokenizer.json folder [default: the model folder]\n"
"      --device D, --threads N, --dtype T, --kv-cache-dtype T, --quantization Q,\n"
"      --matmul-precision P,\n"
"      --block-size N, --kv-cache-memory S, --num-kv-blocks N, --max-num-seqs N,\n"
"      --gpu-memory-utilization X, --cuda-device N, --fast-gemm, --enforce-eager\n"
"                             as for generate\n"
"  -q, --quiet                no progress on stderr\n"
"      --log-interval S       seconds between progress lines when stderr is not a\n"
"                             terminal [default: 10]\n"
"  -h, --help                 this help\n"
"\n"
"Exit codes: 0 success, 2 usage error (a text shorter than 2 windows), 3 model\n"
"or tokenizer error, 4 I/O error, 130 interrupted.\n";

static const char *const overview_help =
"usage: pagedgen [generate] -m MODEL_DIR [-i FILE|-] [-o FILE|-] [options]\n"
"       pagedgen tokenize --tokenizer DIR [-i FILE|-] [-o FILE|-] [options]\n"
"       pagedgen chat-template --tokenizer DIR [-i FILE|-] [-o FILE|-] [options]\n"
"       pagedgen perplexity -m MODEL_DIR -f TEXT [--ctx N] [--batch-size B]\n"
"       pagedgen --version\n"
"\n"
"Commands:\n"
"  generate        run a model over prompts, write JSONL completions (default)\n"
"  tokenize        write the token ids of each input line\n"
"  chat-template   render chat requests with the chat template (check prompts)\n"
"  perplexity      llama-perplexity's estimate of a model over a text file\n"
"  merge           join --shard outputs into one file in input order, checked\n"
"\n"
"`pagedgen generate --help`, `pagedgen tokenize --help`,\n"
"`pagedgen chat-template --help` and `pagedgen merge --help` list every flag.\n"
"\n";

void cli_options_help(FILE *f, cli_command cmd)
{
    if (cmd == CLI_CMD_TOKENIZE) {
        fputs(tokenize_help, f);
    } else if (cmd == CLI_CMD_CHAT_TEMPLATE) {
        fputs(chat_template_help, f);
    } else if (cmd == CLI_CMD_PERPLEXITY) {
        fputs(perplexity_help, f);
    } else if (cmd == CLI_CMD_MERGE) {
        fputs(merge_help, f);
    } else if (cmd == CLI_CMD_GENERATE) {
        for (size_t k = 0; generate_help[k]; k++)
            fputs(generate_help[k], f);
    } else {
        fputs(overview_help, f);
        for (size_t k = 0; generate_help[k]; k++)
            fputs(generate_help[k], f);
    }
}

const char *const *cli_options_names(cli_command cmd)
{
    static const char *gen_names[sizeof generate_opts / sizeof generate_opts[0]];
    static const char *tok_names[sizeof tokenize_opts / sizeof tokenize_opts[0]];
    static const char *chat_names[sizeof chat_template_opts / sizeof chat_template_opts[0]];
    static const char *ppl_names[sizeof perplexity_opts / sizeof perplexity_opts[0]];
    static const char *merge_names[sizeof merge_opts / sizeof merge_opts[0]];
    const struct option *t = cmd == CLI_CMD_TOKENIZE ? tokenize_opts
                             : cmd == CLI_CMD_CHAT_TEMPLATE ? chat_template_opts
                             : cmd == CLI_CMD_PERPLEXITY ? perplexity_opts
                             : cmd == CLI_CMD_MERGE ? merge_opts : generate_opts;
    const char **names = cmd == CLI_CMD_TOKENIZE ? tok_names
                         : cmd == CLI_CMD_CHAT_TEMPLATE ? chat_names
                         : cmd == CLI_CMD_PERPLEXITY ? ppl_names
                         : cmd == CLI_CMD_MERGE ? merge_names : gen_names;
    size_t k = 0;
    for (; t[k].name; k++)
        names[k] = t[k].name;
    names[k] = NULL;
    return names;
}

void cli_options_init(cli_options *o)
{
    memset(o, 0, sizeof *o);
    o->cmd = CLI_CMD_GENERATE;
    o->input_path = "-";
    o->output_path = "-";
    o->input_format = CLI_FORMAT_AUTO;
    o->device = "auto";
    o->block_size = 16;
    o->max_num_seqs = 256;
    o->max_loras = 1;
    o->max_lora_rank = 16;
    o->max_num_batched_tokens = 2048;
    o->prefix_caching = true;
    o->free_window_blocks = true;
    o->layout = KV_LAYOUT_PAGED;
    o->ppl_ctx = 512;
    o->gpu_memory_utilization = 0.9;
    o->kv_cache_dtype = CLI_KV_DTYPE_AUTO;
    o->dtype = CLI_DTYPE_AUTO;
    o->cuda_device = 0;
    o->sampling = sampling_params_default();
    o->sampling.max_tokens = CLI_DEFAULT_MAX_TOKENS;
    o->log_interval_s = 10.0;
    o->shard_k = 0;
    o->shard_n = 1;
    o->generation_config_defaults = true; /* --generation-config auto */
}

const char *cli_format_name(cli_format f)
{
    switch (f) {
    case CLI_FORMAT_AUTO: return "auto";
    case CLI_FORMAT_TEXT: return "text";
    case CLI_FORMAT_JSONL: return "jsonl";
    case CLI_FORMAT_OPENAI: return "openai";
    }
    return "?";
}

const char *cli_matmul_precision_name(cli_matmul_precision p)
{
    switch (p) {
    case CLI_MATMUL_EXACT: return "exact";
    case CLI_MATMUL_BF16: return "bf16";
    case CLI_MATMUL_INT8: return "int8";
    }
    return "?";
}

const char *cli_kv_dtype_name(cli_kv_dtype d)
{
    switch (d) {
    case CLI_KV_DTYPE_AUTO: return "auto";
    case CLI_KV_DTYPE_BF16: return "bf16";
    case CLI_KV_DTYPE_FP16: return "fp16";
    case CLI_KV_DTYPE_F32: return "f32";
    }
    return "?";
}

const char *cli_dtype_name(cli_dtype d)
{
    switch (d) {
    case CLI_DTYPE_AUTO: return "auto";
    case CLI_DTYPE_BF16: return "bfloat16";
    case CLI_DTYPE_F32: return "float32";
    }
    return "?";
}

int cli_parse_int(const char *s, int64_t lo, int64_t hi, const char *what, int64_t *out,
                  pg_error *err)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < lo || v > hi)
        return pg_error_set(err, PG_EINVAL, "%s: expected an integer in [%lld, %lld], got '%s'",
                            what, (long long)lo, (long long)hi, s);
    *out = v;
    return PG_OK;
}

int cli_parse_double(const char *s, double lo, double hi, const char *what, double *out,
                     pg_error *err)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v) || v < lo || v > hi)
        return pg_error_set(err, PG_EINVAL, "%s: expected a number in [%g, %g], got '%s'",
                            what, lo, hi, s);
    *out = v;
    return PG_OK;
}

int cli_parse_size(const char *s, uint64_t *out, pg_error *err)
{
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1.0}, {"B", 1.0},
        {"K", 1024.0}, {"KiB", 1024.0}, {"KB", 1e3},
        {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},
        {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9},
        {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12},
    };
    char *end = NULL;
    errno = 0;
    if (!s || !*s || *s == '-' || *s == '+')
        goto bad;
    double v = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(v))
        goto bad;
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
        if (strcasecmp(end, units[k].suffix) != 0 || (strlen(end) != strlen(units[k].suffix)))
            continue;
        /* case matters only between KiB-style and KB-style, which differ in
         * spelling anyway; "gib" and "GiB" are the same unit */
        double bytes = v * units[k].mult;
        if (bytes < 1.0 || bytes >= 18446744073709551616.0)
            goto bad;
        *out = (uint64_t)bytes;
        return PG_OK;
    }
bad:
    return pg_error_set(err, PG_EINVAL,
                        "--kv-cache-memory: expected a size like 2GiB, 512MiB or 1000000 (bytes), got '%s'",
                        s ? s : "");
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian; H. Hinnant's
 * days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

int cli_parse_date(const char *s, int64_t *out, pg_error *err)
{
    static const int mdays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int y = 0, m = 0, d = 0;
    if (!s || strlen(s) != 10 || s[4] != '-' || s[7] != '-')
        goto bad;
    for (int k = 0; k < 10; k++)
        if (k != 4 && k != 7 && (s[k] < '0' || s[k] > '9'))
            goto bad;
    y = (s[0] - '0') * 1000 + (s[1] - '0') * 100 + (s[2] - '0') * 10 + (s[3] - '0');
    m = (s[5] - '0') * 10 + (s[6] - '0');
    d = (s[8] - '0') * 10 + (s[9] - '0');
    if (y < 1970 || m < 1 || m > 12 || d < 1)
        goto bad;
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d > mdays[m - 1] + (m == 2 && leap))
        goto bad;
    *out = days_from_civil(y, m, d) * 86400 + 12 * 3600;
    return PG_OK;
bad:
    return pg_error_set(err, PG_EINVAL, "--chat-template-date: expected a day as YYYY-MM-DD, got '%s'",
                        s ? s : "");
}

static int parse_i32(const char *s, int64_t lo, int64_t hi, const char *what, int32_t *out,
                     pg_error *err)
{
    int64_t v;
    int rc = cli_parse_int(s, lo, hi, what, &v, err);
    if (rc == PG_OK)
        *out = (int32_t)v;
    return rc;
}

static int parse_f32(const char *s, double lo, double hi, const char *what, float *out,
                     pg_error *err)
{
    double v;
    int rc = cli_parse_double(s, lo, hi, what, &v, err);
    if (rc == PG_OK)
        *out = (float)v;
    return rc;
}

static int parse_format(const char *s, bool allow_openai, cli_format *out, pg_error *err)
{
    if (strcmp(s, "auto") == 0) *out = CLI_FORMAT_AUTO;
    else if (strcmp(s, "text") == 0) *out = CLI_FORMAT_TEXT;
    else if (strcmp(s, "jsonl") == 0) *out = CLI_FORMAT_JSONL;
    else if (allow_openai && strcmp(s, "openai") == 0) *out = CLI_FORMAT_OPENAI;
    else
        return pg_error_set(err, PG_EINVAL, "--input-format: expected %s, got '%s'",
                            allow_openai ? "auto, text, jsonl or openai" : "auto, text or jsonl", s);
    return PG_OK;
}

static int parse_shard(const char *s, cli_options *o, pg_error *err)
{
    char *end = NULL;
    errno = 0;
    o->shard_given = true;
    o->shard_auto = false;
    if (strncmp(s, "auto", 4) == 0 && (s[4] == '\0' || s[4] == '/')) {
        /* K and N come from the environment (run.c, shard.h) */
        o->shard_auto = true;
        o->shard_auto_n = 0;
        o->shard_k = 0;
        o->shard_n = 1;
        if (s[4] == '\0')
            return PG_OK;
        long b = strtol(s + 5, &end, 10);
        if (end == s + 5 || *end != '\0' || errno || b < 1 || b > 1000000)
            return pg_error_set(err, PG_EINVAL, "--shard: expected auto/N with 1 <= N <= 1000000, got '%s'", s);
        o->shard_auto_n = (int32_t)b;
        return PG_OK;
    }
    int32_t *k = &o->shard_k, *n = &o->shard_n;
    long a = strtol(s, &end, 10);
    if (end == s || *end != '/' || errno)
        goto bad;
    const char *s2 = end + 1;
    long b = strtol(s2, &end, 10);
    if (end == s2 || *end != '\0' || errno || b < 1 || b > 1000000 || a < 0 || a >= b)
        goto bad;
    *k = (int32_t)a;
    *n = (int32_t)b;
    return PG_OK;
bad:
    return pg_error_set(err, PG_EINVAL, "--shard: expected K/N with 0 <= K < N, or auto, or auto/N, got '%s'", s);
}

int cli_options_check_dtypes(const cli_options *o, const char *device, pg_error *err)
{
    bool cpu = strcmp(device, "cpu") == 0, cuda = strcmp(device, "cuda") == 0;
    cli_kv_dtype kv = o->kv_cache_dtype;
    /* errors on every device first, then the ones of a known device */
    if (o->quantization == CLI_QUANT_INT8 && o->dtype != CLI_DTYPE_AUTO)
        return pg_error_set(err, PG_EINVAL,
                            "--quantization int8: the weights are stored as int8 "
                            "(expected --dtype auto, got %s)", cli_dtype_name(o->dtype));
    if (o->matmul_precision == CLI_MATMUL_BF16 && (o->dtype == CLI_DTYPE_F32 || o->quantization == CLI_QUANT_INT8))
        return pg_error_set(err, PG_EINVAL,
                            "--matmul-precision bf16: the weights are stored as bf16 (expected --dtype auto "
                            "or bfloat16 and no --quantization, got --dtype %s%s)", cli_dtype_name(o->dtype),
                            o->quantization == CLI_QUANT_INT8 ? ", --quantization int8" : "");
    if (o->matmul_precision == CLI_MATMUL_INT8 && o->dtype != CLI_DTYPE_AUTO)
        return pg_error_set(err, PG_EINVAL,
                            "--matmul-precision int8: the weights are stored as int8 "
                            "(expected --dtype auto, got %s)", cli_dtype_name(o->dtype));
    if (cuda && o->matmul_precision != CLI_MATMUL_EXACT)
        return pg_error_set(err, PG_EINVAL, "--matmul-precision %s: a cpu arithmetic mode (expected --device cpu; "
                                            "on cuda --dtype sets the precision)",
                            cli_matmul_precision_name(o->matmul_precision));
    if (cuda && o->quantization == CLI_QUANT_INT8)
        return pg_error_set(err, PG_EINVAL, "--quantization int8: only the cpu executor quantizes "
                                            "(expected --device cpu)");
    if (cuda && o->dtype == CLI_DTYPE_F32 && (kv == CLI_KV_DTYPE_BF16 || kv == CLI_KV_DTYPE_FP16))
        return pg_error_set(err, PG_EINVAL,
                            "--kv-cache-dtype %s: on cuda with --dtype float32 the kv cache is f32 "
                            "(expected auto or f32)", cli_kv_dtype_name(kv));
    if (cuda && kv == CLI_KV_DTYPE_F32 && o->dtype != CLI_DTYPE_F32)
        return pg_error_set(err, PG_EINVAL,
                            "--kv-cache-dtype f32: on cuda an f32 kv cache needs --dtype float32 "
                            "(--dtype %s computes in bfloat16)", cli_dtype_name(o->dtype));
    (void)cpu; /* the cpu takes every combination: f32/bf16/int8 weights x f32/bf16/fp16 cache */
    return PG_OK;
}

/* --device cuda:all or cuda:N[,M...]: distinct ordinals in [0, 1023];
 * cuda:N alone is --device cuda --cuda-device N. */
static int parse_device_list(cli_options *o, const char *arg, pg_error *err)
{
    o->device = "cuda";
    const char *p = arg + 5;
    if (strcmp(p, "all") == 0) {
        o->devices_all = true;
        return PG_OK;
    }
    int32_t n = 0;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long v = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1;
        if (v < 0 || errno || v > 1023 || end == p || (*end != ',' && *end != '\0'))
            return pg_error_set(err, PG_EINVAL, "--device %s: expected cuda:all or a list of device ordinals "
                                "(cuda:0,1,2), each 0 .. 1023", arg);
        for (int32_t i = 0; i < n; i++)
            if (o->devices[i] == (int32_t)v)
                return pg_error_set(err, PG_EINVAL, "--device %s: device %ld listed twice (one worker per "
                                    "device)", arg, v);
        if (n == CLI_MAX_DEVICES)
            return pg_error_set(err, PG_EINVAL, "--device %s: more than %d devices", arg, CLI_MAX_DEVICES);
        o->devices[n++] = (int32_t)v;
        if (*end == '\0')
            break;
        p = end + 1;
    }
    if (n == 1) {
        o->cuda_device = o->devices[0];
        n = 0;
    }
    o->n_devices = n;
    return PG_OK;
}

/* One option of either command. */
static int apply(cli_options *o, int c, const char *arg, pg_error *err)
{
    int64_t v64;
    int rc = PG_OK;
    sampling_params *sp = &o->sampling;
    switch (c) {
    case 'm': o->model_dir = arg; break;
    case OPT_TOKENIZER: o->tokenizer_dir = arg; break;
    case 'i': o->input_path = arg; break;
    case 'o': o->output_path = arg; break;
    case OPT_INPUT_FORMAT:
        rc = parse_format(arg, o->cmd != CLI_CMD_TOKENIZE, &o->input_format, err);
        break;
    case OPT_DEVICE:
        o->device_arg = arg;
        o->n_devices = 0;
        o->devices_all = false;
        if (strncmp(arg, "cuda:", 5) == 0) {
            rc = parse_device_list(o, arg, err);
            break;
        }
        if (strcmp(arg, "auto") && strcmp(arg, "cpu") && strcmp(arg, "cuda"))
            return pg_error_set(err, PG_EINVAL, "--device: expected auto, cpu, cuda, cuda:N,M,... or cuda:all, "
                                "got '%s'", arg);
        o->device = arg;
        break;
    case OPT_THREADS: rc = parse_i32(arg, 0, 1024, "--threads", &o->threads, err); break;
    case OPT_BLOCK_SIZE:
        rc = parse_i32(arg, 1, 256, "--block-size", &o->block_size, err);
        if (rc == PG_OK && (o->block_size & (o->block_size - 1)))
            rc = pg_error_set(err, PG_EINVAL, "--block-size: expected a power of two in [1, 256], got %s", arg);
        break;
    case OPT_KV_MEM: rc = cli_parse_size(arg, &o->kv_cache_bytes, err); break;
    case OPT_NUM_KV_BLOCKS: rc = parse_i32(arg, 1, INT32_MAX, "--num-kv-blocks", &o->num_kv_blocks, err); break;
    case OPT_MAX_NUM_SEQS: rc = parse_i32(arg, 1, 1 << 20, "--max-num-seqs", &o->max_num_seqs, err); break;
    case OPT_MAX_BATCHED:
        rc = parse_i32(arg, 1, 1 << 24, "--max-num-batched-tokens", &o->max_num_batched_tokens, err);
        break;
    case OPT_MAX_MODEL_LEN: rc = parse_i32(arg, 1, INT32_MAX, "--max-model-len", &o->max_model_len, err); break;
    case OPT_NO_PREFIX: o->prefix_caching = false; break;
    case OPT_KEEP_WINDOW: o->free_window_blocks = false; break;
    case OPT_POOLING:
        if (strcmp(arg, "last") == 0) o->pooling = CLI_POOLING_LAST;
        else if (strcmp(arg, "mean") == 0) o->pooling = CLI_POOLING_MEAN;
        else if (strcmp(arg, "cls") == 0) o->pooling = CLI_POOLING_CLS;
        else return pg_error_set(err, PG_EINVAL, "--pooling: expected last, mean or cls, got '%s'", arg);
        break;
    case OPT_SEED:
        rc = cli_parse_int(arg, 0, INT64_MAX, "--seed", &v64, err);
        o->seed = (uint64_t)v64;
        break;
    case OPT_KV_LAYOUT:
        if (strcmp(arg, "paged") == 0) o->layout = KV_LAYOUT_PAGED;
        else if (strcmp(arg, "contiguous") == 0) o->layout = KV_LAYOUT_CONTIGUOUS;
        else return pg_error_set(err, PG_EINVAL, "--kv-layout: expected paged or contiguous, got '%s'", arg);
        break;
    case OPT_CHECK_INV: o->check_invariants = true; break;
    case OPT_PLP_PER_STEP: o->prompt_logprobs_per_step = true; break;
    case 'f': o->ppl_file = arg; break;
    case OPT_PPL_CTX: rc = parse_i32(arg, 4, 1 << 24, "--ctx", &o->ppl_ctx, err); break;
    case OPT_PPL_BATCH:
        rc = parse_i32(arg, 1, 1 << 24, "--batch-size", &o->max_num_batched_tokens, err);
        break;
    case OPT_GPU_UTIL:
        rc = cli_parse_double(arg, 0.0, 1.0, "--gpu-memory-utilization", &o->gpu_memory_utilization,
                              err);
        if (rc == PG_OK && o->gpu_memory_utilization <= 0.0)
            rc = pg_error_set(err, PG_EINVAL,
                              "--gpu-memory-utilization: expected a number in (0, 1], got '%s'", arg);
        break;
    case OPT_KV_DTYPE:
        /* vLLM spells them auto, bfloat16, fp16/float16, fp32/float32 in
         * places; take those spellings too */
        if (strcmp(arg, "auto") == 0) o->kv_cache_dtype = CLI_KV_DTYPE_AUTO;
        else if (strcmp(arg, "bf16") == 0 || strcmp(arg, "bfloat16") == 0) o->kv_cache_dtype = CLI_KV_DTYPE_BF16;
        else if (strcmp(arg, "fp16") == 0 || strcmp(arg, "float16") == 0 || strcmp(arg, "f16") == 0)
            o->kv_cache_dtype = CLI_KV_DTYPE_FP16;
        else if (strcmp(arg, "f32") == 0 || strcmp(arg, "fp32") == 0 || strcmp(arg, "float32") == 0)
            o->kv_cache_dtype = CLI_KV_DTYPE_F32;
        else
            return pg_error_set(err, PG_EINVAL, "--kv-cache-dtype: expected auto, bf16, fp16 or f32, got '%s'",
                                arg);
        break;
    case OPT_DTYPE:
        if (strcmp(arg, "auto") == 0) o->dtype = CLI_DTYPE_AUTO;
        else if (strcmp(arg, "bfloat16") == 0 || strcmp(arg, "bf16") == 0) o->dtype = CLI_DTYPE_BF16;
        else if (strcmp(arg, "float32") == 0 || strcmp(arg, "f32") == 0) o->dtype = CLI_DTYPE_F32;
        else
            return pg_error_set(err, PG_EINVAL, "--dtype: expected auto, bfloat16 or float32, got '%s'", arg);
        break;
    case OPT_QUANT:
        if (strcmp(arg, "int8") == 0) o->quantization = CLI_QUANT_INT8;
        else if (strcmp(arg, "none") == 0) o->quantization = CLI_QUANT_NONE;
        else
            return pg_error_set(err, PG_EINVAL, "--quantization: expected int8 or none, got '%s'", arg);
        break;
    case OPT_MATMUL_PRECISION:
        if (strcmp(arg, "exact") == 0) o->matmul_precision = CLI_MATMUL_EXACT;
        else if (strcmp(arg, "bf16") == 0) o->matmul_precision = CLI_MATMUL_BF16;
        else if (strcmp(arg, "int8") == 0) o->matmul_precision = CLI_MATMUL_INT8;
        else
            return pg_error_set(err, PG_EINVAL, "--matmul-precision: expected exact, bf16 or int8, got '%s'", arg);
        break;
    case OPT_CUDA_DEVICE: rc = parse_i32(arg, 0, 1023, "--cuda-device", &o->cuda_device, err); break;
    case OPT_FAST_GEMM: o->fast_gemm = true; break;
    case OPT_ENFORCE_EAGER: o->enforce_eager = true; break;
    case OPT_MAX_TOKENS:
        rc = parse_i32(arg, -1, INT32_MAX, "--max-tokens", &sp->max_tokens, err);
        if (rc == PG_OK && sp->max_tokens == 0)
            rc = pg_error_set(err, PG_EINVAL, "--max-tokens: expected -1 or an integer >= 1, got 0");
        o->sampling_set |= CLI_SET_MAX_TOKENS;
        break;
    case OPT_TEMPERATURE:
        rc = parse_f32(arg, 0.0, 1e6, "--temperature", &sp->temperature, err);
        o->sampling_set |= CLI_SET_TEMPERATURE;
        break;
    case OPT_TOP_P:
        rc = parse_f32(arg, 0.0, 1.0, "--top-p", &sp->top_p, err);
        if (rc == PG_OK && sp->top_p <= 0.0f)
            rc = pg_error_set(err, PG_EINVAL, "--top-p: expected a number in (0, 1], got '%s'", arg);
        o->sampling_set |= CLI_SET_TOP_P;
        break;
    case OPT_TOP_K:
        rc = parse_i32(arg, -1, INT32_MAX, "--top-k", &sp->top_k, err);
        o->sampling_set |= CLI_SET_TOP_K;
        break;
    case OPT_MIN_P:
        rc = parse_f32(arg, 0.0, 1.0, "--min-p", &sp->min_p, err);
        o->sampling_set |= CLI_SET_MIN_P;
        break;
    case OPT_N:
        rc = parse_i32(arg, 1, 1024, "--n", &sp->n, err);
        o->sampling_set |= CLI_SET_N;
        break;
    case OPT_STOP:
        if (o->n_stop >= CLI_MAX_STOP)
            return pg_error_set(err, PG_EINVAL, "--stop: at most %d stop strings", CLI_MAX_STOP);
        if (!*arg)
            return pg_error_set(err, PG_EINVAL, "--stop: expected a non-empty string");
        o->stop[o->n_stop++] = arg;
        break;
    case OPT_IGNORE_EOS: sp->ignore_eos = true; o->sampling_set |= CLI_SET_IGNORE_EOS; break;
    case OPT_MIN_TOKENS:
        rc = parse_i32(arg, 0, INT32_MAX, "--min-tokens", &sp->min_tokens, err);
        o->sampling_set |= CLI_SET_MIN_TOKENS;
        break;
    case OPT_PRESENCE:
        rc = parse_f32(arg, -2.0, 2.0, "--presence-penalty", &sp->presence_penalty, err);
        o->sampling_set |= CLI_SET_PRESENCE;
        break;
    case OPT_FREQUENCY:
        rc = parse_f32(arg, -2.0, 2.0, "--frequency-penalty", &sp->frequency_penalty, err);
        o->sampling_set |= CLI_SET_FREQUENCY;
        break;
    case OPT_REPETITION:
        rc = parse_f32(arg, 1e-6, 1e6, "--repetition-penalty", &sp->repetition_penalty, err);
        o->sampling_set |= CLI_SET_REPETITION;
        break;
    case OPT_LOGPROBS:
        rc = parse_i32(arg, 0, 20, "--logprobs", &sp->logprobs, err);
        o->sampling_set |= CLI_SET_LOGPROBS;
        break;
    case OPT_INCLUDE_PROMPT: o->include_prompt = true; break;
    case OPT_UNORDERED: o->unordered = true; break;
    case OPT_SERVED_MODEL_NAME: o->served_model_name = arg; break;
    case OPT_LORA: {
        const char *eq = strchr(arg, '=');
        if (!eq || eq == arg || !eq[1])
            return pg_error_set(err, PG_EINVAL, "--lora: expected NAME=DIR, got '%s'", arg);
        if (o->n_loras >= CLI_MAX_LORAS)
            return pg_error_set(err, PG_EINVAL, "--lora: at most %d adapters", CLI_MAX_LORAS);
        const int32_t len = (int32_t)(eq - arg);
        for (int32_t i = 0; i < o->n_loras; i++)
            if (o->lora_name_len[i] == len && memcmp(o->lora_name[i], arg, (size_t)len) == 0)
                return pg_error_set(err, PG_EINVAL, "--lora: the name '%.*s' is given twice", (int)len, arg);
        o->lora_name[o->n_loras] = arg;
        o->lora_name_len[o->n_loras] = len;
        o->lora_dir[o->n_loras++] = eq + 1;
        break;
    }
    case OPT_MAX_LORAS: rc = parse_i32(arg, 1, CLI_MAX_LORAS, "--max-loras", &o->max_loras, err); break;
    case OPT_MAX_LORA_RANK: rc = parse_i32(arg, 1, PG_LORA_MAX_RANK, "--max-lora-rank", &o->max_lora_rank, err); break;
    case OPT_STRICT: o->strict = true; break;
    case OPT_TRUNCATE_MAX_TOKENS: o->truncate_max_tokens = true; break;
    case OPT_RESUME: o->resume = true; break;
    case OPT_METRICS: o->metrics = true; break;
    case OPT_PROFILE_OPS: o->profile_ops = true; break;
    case OPT_PROFILE_STEPS: o->profile_steps = true; break;
    case 'q': o->quiet = true; break;
    case OPT_LOG_INTERVAL:
        rc = cli_parse_double(arg, 0.05, 86400.0, "--log-interval", &o->log_interval_s, err);
        break;
    case OPT_SHARD: rc = parse_shard(arg, o, err); break;
    case OPT_NO_SPECIAL: o->no_special = true; break;
    case OPT_REASONING_PARSER: rc = cli_reasoning_parser_parse(arg, &o->reasoning_parser, err); break;
    case OPT_GENERATION_CONFIG:
        if (strcmp(arg, "auto") == 0)
            o->generation_config_defaults = true;
        else if (strcmp(arg, "vllm") == 0)
            o->generation_config_defaults = false;
        else
            return pg_error_set(err, PG_EINVAL, "--generation-config: expected auto or vllm, got '%s'", arg);
        break;
    case OPT_CHAT_TEMPLATE: o->chat_template_path = arg; break;
    case OPT_CHAT_DATE:
        rc = cli_parse_date(arg, &o->chat_date_unix, err);
        o->has_chat_date = rc == PG_OK;
        break;
    default:
        return pg_error_set(err, PG_EINVAL, "internal: unhandled option %d", c);
    }
    return rc;
}

/* Flags documented not to change a record's bytes (cli/README.md "Output":
 * byte-identical across pool sizes, batch caps, token budgets, block sizes,
 * prefix caching, threads), and the run's own files and controls. Every
 * other flag is output-shaping: a flag added later is recorded by default,
 * so merge errs on the side of refusing. */
static bool shapes_output(int c)
{
    switch (c) {
    case 'i': case 'o': case 'q': case OPT_SHARD: case OPT_RESUME: case OPT_LOG_INTERVAL:
    case OPT_THREADS: case OPT_BLOCK_SIZE: case OPT_KV_MEM: case OPT_NUM_KV_BLOCKS: case OPT_MAX_NUM_SEQS:
    case OPT_MAX_BATCHED: case OPT_NO_PREFIX: case OPT_CHECK_INV: case OPT_GPU_UTIL: case OPT_CUDA_DEVICE:
    case OPT_PROFILE_OPS: case OPT_MAX_LORAS:
        return false;
    }
    return true;
}

/* Appends "--name=value\n" to o->shaping for an output-shaping flag (a
 * newline or backslash in the value escaped as \n, \\); -m as its folder's
 * name (the path may differ between machines). */
static int note_shaping(cli_options *o, const struct option *table, int c, const char *arg, pg_error *err)
{
    if (!shapes_output(c))
        return PG_OK;
    const char *name = "?";
    for (size_t k = 0; table[k].name; k++)
        if (table[k].val == c)
            name = table[k].name;
    const char *v = arg;
    size_t vlen = v ? strlen(v) : 0;
    if (c == 'm') {
        while (vlen > 1 && v[vlen - 1] == '/')
            vlen--;
        size_t b = vlen;
        while (b > 0 && v[b - 1] != '/')
            b--;
        v += b;
        vlen -= b;
    }
    char *dst = o->shaping + strlen(o->shaping);
    char *end = o->shaping + sizeof o->shaping - 2; /* room for "\n" and NUL */
    int w = snprintf(dst, (size_t)(end - dst), v ? "--%s=" : "--%s", name);
    if (w < 0 || w >= end - dst)
        goto full;
    dst += w;
    for (size_t k = 0; k < vlen; k++) {
        bool esc = v[k] == '\n' || v[k] == '\\';
        if (dst + 1 + esc >= end)
            goto full;
        if (esc)
            *dst++ = '\\';
        *dst++ = v[k] == '\n' ? 'n' : v[k];
    }
    *dst++ = '\n';
    *dst = '\0';
    return PG_OK;
full:
    return pg_error_set(err, PG_EINVAL, "too many output-shaping flags (over %zu bytes)", sizeof o->shaping);
}

int cli_options_parse(cli_options *o, int argc, char **argv, pg_error *err)
{
    cli_options_init(o);
    int first = 1;
    if (argc > 1 && strcmp(argv[1], "generate") == 0) {
        first = 2;
    } else if (argc > 1 && strcmp(argv[1], "tokenize") == 0) {
        o->cmd = CLI_CMD_TOKENIZE;
        first = 2;
    } else if (argc > 1 && strcmp(argv[1], "chat-template") == 0) {
        o->cmd = CLI_CMD_CHAT_TEMPLATE;
        first = 2;
    } else if (argc > 1 && strcmp(argv[1], "perplexity") == 0) {
        o->cmd = CLI_CMD_PERPLEXITY;
        first = 2;
    } else if (argc > 1 && strcmp(argv[1], "merge") == 0) {
        o->cmd = CLI_CMD_MERGE;
        first = 2;
    } else if (argc > 1 && strcmp(argv[1], "help") == 0) {
        o->cmd = CLI_CMD_HELP;
        o->help_for = CLI_CMD_HELP;
        if (argc > 2 && strcmp(argv[2], "tokenize") == 0)
            o->help_for = CLI_CMD_TOKENIZE;
        else if (argc > 2 && strcmp(argv[2], "chat-template") == 0)
            o->help_for = CLI_CMD_CHAT_TEMPLATE;
        else if (argc > 2 && strcmp(argv[2], "perplexity") == 0)
            o->help_for = CLI_CMD_PERPLEXITY;
        else if (argc > 2 && strcmp(argv[2], "merge") == 0)
            o->help_for = CLI_CMD_MERGE;
        else if (argc > 2 && strcmp(argv[2], "generate") == 0)
            o->help_for = CLI_CMD_GENERATE;
        return PG_OK;
    } else if (argc > 1 && argv[1][0] != '-') {
        return pg_error_set(err, PG_EINVAL,
                            "unknown command '%s' (expected generate, tokenize, chat-template, perplexity or merge; see --help)", argv[1]);
    }
    bool explicit_cmd = first == 2;
    const struct option *table = o->cmd == CLI_CMD_TOKENIZE ? tokenize_opts
                                 : o->cmd == CLI_CMD_CHAT_TEMPLATE ? chat_template_opts
                                 : o->cmd == CLI_CMD_PERPLEXITY ? perplexity_opts
                                 : o->cmd == CLI_CMD_MERGE ? merge_opts : generate_opts;
    const char *shorts = o->cmd == CLI_CMD_GENERATE ? ":m:i:o:qh"
                         : o->cmd == CLI_CMD_PERPLEXITY ? ":m:f:qh"
                         : o->cmd == CLI_CMD_MERGE ? ":i:o:h" : ":m:i:o:h";

    /* getopt_long keeps its state in globals of libc; reset them so that the
     * parser can run more than once in a process (unit tests). */
    optind = 0;
    opterr = 0;
    int sub_argc = argc - (first - 1);
    char **sub_argv = argv + (first - 1);
    for (;;) {
        int idx = -1;
        int c = getopt_long(sub_argc, sub_argv, shorts, table, &idx);
        if (c == -1)
            break;
        if (c == '?') {
            const char *bad = sub_argv[optind - 1];
            if (optopt && optopt < 256)
                return pg_error_set(err, PG_EINVAL, "unknown option '-%c' (see --help)", optopt);
            return pg_error_set(err, PG_EINVAL, "unknown option '%s' (see --help)", bad ? bad : "?");
        }
        if (c == ':')
            return pg_error_set(err, PG_EINVAL, "option '%s' needs a value",
                                sub_argv[optind - 1] ? sub_argv[optind - 1] : "?");
        if (c == 'h') {
            o->help_for = explicit_cmd ? o->cmd : CLI_CMD_HELP;
            o->cmd = CLI_CMD_HELP;
            return PG_OK;
        }
        if (c == OPT_VERSION) {
            o->cmd = CLI_CMD_VERSION;
            return PG_OK;
        }
        int rc = apply(o, c, optarg, err);
        if (rc != PG_OK)
            return rc;
        if (o->cmd == CLI_CMD_GENERATE && (rc = note_shaping(o, table, c, optarg, err)) != PG_OK)
            return rc;
    }
    if (o->cmd == CLI_CMD_MERGE) {
        o->merge_files = sub_argv + optind;
        o->n_merge_files = (int32_t)(sub_argc - optind);
        if (strcmp(o->input_path, "-") == 0)
            return pg_error_set(err, PG_EINVAL, "merge: -i INPUT is required (the file every shard ran over)");
        if (o->n_merge_files == 0)
            return pg_error_set(err, PG_EINVAL, "merge: no shard outputs given (see merge --help)");
        return PG_OK;
    }
    if (optind < sub_argc)
        return pg_error_set(err, PG_EINVAL, "unexpected argument '%s' (see --help)", sub_argv[optind]);

    if (o->cmd == CLI_CMD_GENERATE) {
        if (!o->model_dir)
            return pg_error_set(err, PG_EINVAL, "generate: -m MODEL_DIR is required (see --help)");
        if (o->resume && strcmp(o->output_path, "-") == 0)
            return pg_error_set(err, PG_EINVAL, "--resume needs -o FILE (not stdout)");
        if ((o->n_devices > 1 || o->devices_all) && strcmp(o->input_path, "-") == 0)
            return pg_error_set(err, PG_EINVAL, "--device %s: every device's worker reads the input: give -i FILE "
                                "(not stdin)", o->device_arg);
        if ((o->n_devices > 1 || o->devices_all) && o->shard_given)
            return pg_error_set(err, PG_EINVAL, "--device %s with --shard: not supported (run one device list per "
                                "machine without --shard, or one device per shard)", o->device_arg);
        int rc = cli_options_check_dtypes(o, o->device, err);
        if (rc != PG_OK)
            return rc;
    } else if (o->cmd == CLI_CMD_PERPLEXITY) {
        if (!o->model_dir || !o->ppl_file)
            return pg_error_set(err, PG_EINVAL, "perplexity: -m MODEL_DIR and -f TEXT are required "
                                "(see --help)");
        if (o->n_devices > 1 || o->devices_all)
            return pg_error_set(err, PG_EINVAL, "perplexity: --device %s: one device (cuda:N)", o->device_arg);
        int rc = cli_options_check_dtypes(o, o->device, err);
        if (rc != PG_OK)
            return rc;
    } else if (o->cmd == CLI_CMD_TOKENIZE || o->cmd == CLI_CMD_CHAT_TEMPLATE) {
        if (!o->tokenizer_dir)
            o->tokenizer_dir = o->model_dir;
        if (!o->tokenizer_dir)
            return pg_error_set(err, PG_EINVAL, "%s: --tokenizer DIR is required (see --help)",
                                o->cmd == CLI_CMD_TOKENIZE ? "tokenize" : "chat-template");
    }
    return PG_OK;
}
