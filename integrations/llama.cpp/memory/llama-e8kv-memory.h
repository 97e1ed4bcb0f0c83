// e8kv as llama.cpp's KV memory: the five entry points that e8kv's patch to llama.cpp calls
// (integrations/llama.cpp/patches/llama-e8kv-memory.patch). Compiled into libllama from e8kv's
// tree (e8kv-memory.cmake); everything else of the adapter stays behind these functions.
//
// What the memory does (the README's "llama.cpp" section and docs/llama-cpp-memory.md):
//   - a sequence's prompt is the tokens of the first llama_decode call that finds the sequence
//     empty: attended densely, like any prefill (fp16 keys and values, causal), then compressed
//     at once by e8kv::KVCompressor::compress when the call ends (observation queries: the last
//     32 query rows of each layer), so presets with scorers, eviction, tiers and budgets apply;
//   - every later token is appended to the compressed cache (KVCompressor::append) and its query
//     attends the codes right after (e8kv::attend): a batch of n tokens gives exactly the logits
//     of n single-token calls, because each token sees its predecessors in the form the cache
//     holds them when decoding one token at a time.
#pragma once

#include <memory>

struct ggml_context;
struct ggml_tensor;
struct llama_model;
struct llama_cparams;
struct llama_hparams;
struct llama_memory_i;
struct llama_memory_context_i;
class llm_graph_input_attn_kv;

/// The memory of a context created with an e8kv spec (llama_context_params::kv_e8kv). Throws
/// std::runtime_error naming what it cannot represent (architecture, sliding-window or
/// recurrent layers, head_dim, RoPE scaling, GPU layers, a bad spec: the key named).
llama_memory_i * llama_e8kv_memory_create(const llama_model & model, const llama_cparams & cparams, const char * spec);

/// The attention input of a graph whose memory context is e8kv's, or null for any other memory.
std::unique_ptr<llm_graph_input_attn_kv> llama_e8kv_graph_input(const llama_memory_context_i * mctx,
                                                                const llama_hparams & hparams,
                                                                const llama_cparams & cparams);

/// Attention of layer il through e8kv (one ggml custom op reading the codes), [n_embd_head·n_head,
/// n_tokens] before the output projection; null when `inp` is not e8kv's.
ggml_tensor * llama_e8kv_build_attn(ggml_context * ctx, llm_graph_input_attn_kv * inp, ggml_tensor * q,
                                    ggml_tensor * k, ggml_tensor * v, ggml_tensor * kq_b, ggml_tensor * sinks,
                                    float kq_scale, int il);

/// After a ubatch's graph ran: false (the error logged) when e8kv's attention failed in it.
bool llama_e8kv_ubatch_computed(llama_memory_context_i * mctx);

/// At the end of a successful llama_decode call: compresses the prompts the call staged. False
/// (logged; those sequences refuse further decoding until removed) when compression failed.
/// True for other memories. (A failed call needs nothing: llama.cpp removes the failed ubatch's
/// positions with seq_rm, and a staged prompt is cut there and completed by the next call.)
bool llama_e8kv_decode_finished(llama_memory_i * memory);
