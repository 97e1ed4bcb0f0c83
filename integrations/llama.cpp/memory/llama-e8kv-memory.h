// e8kv as llama.cpp's KV memory: the entry points that e8kv's patch to llama.cpp calls
// (integrations/llama.cpp/patches/llama-e8kv-memory.patch). Compiled into libllama from e8kv's
// tree (e8kv-memory.cmake); everything else of the adapter stays behind these functions.
//
// What the memory does (docs/llama-cpp.md):
//   - a sequence's prompt is the tokens of the first llama_decode call that finds the sequence
//     empty, staged one ubatch at a time: each ubatch's keys and values (fp16) are attended
//     densely and causally, beside the codes of the ubatches before it, then compressed
//     (e8kv::KVCompressor::compress, then extend; observation queries: the chunk's last query
//     rows), so the stage never exceeds one ubatch and presets with scorers, eviction, tiers
//     and budgets apply per chunk;
//   - every later token is appended to the compressed cache (KVCompressor::append) and attends
//     the codes (e8kv::attend_batch, each token bounded by its own position, in segments that
//     end before an append that flushes): a batch of n tokens gives exactly the logits of n
//     single-token calls;
//   - layers with a sliding window (Gemma-3) attend their window and drop what left it; layers
//     with another RoPE (Gemma-3's local layers) keep a cache of their own (e8kv_layers.hpp).
#pragma once

#include <cstddef>
#include <memory>

struct ggml_context;
struct ggml_tensor;
struct llama_model;
struct llama_cparams;
struct llama_hparams;
struct llama_memory_i;
struct llama_memory_context_i;
class llm_graph_input_i;
class llm_graph_input_attn_kv;
class llm_graph_input_attn_kv_iswa;

/// The memory of a context created with an e8kv spec (llama_context_params::kv_e8kv). Throws
/// std::runtime_error naming what it cannot represent (architecture, window type, head sizes,
/// RoPE type, GPU layers, a bad spec: the key named).
llama_memory_i * llama_e8kv_memory_create(const llama_model & model, const llama_cparams & cparams, const char * spec);

/// The attention input of a graph whose memory context is e8kv's, or null for any other memory:
/// for builders that take llama.cpp's KV input, and for those that take its iSWA input.
std::unique_ptr<llm_graph_input_attn_kv> llama_e8kv_graph_input(const llama_memory_context_i * mctx,
                                                                const llama_hparams & hparams,
                                                                const llama_cparams & cparams);
std::unique_ptr<llm_graph_input_attn_kv_iswa> llama_e8kv_graph_input_iswa(const llama_memory_context_i * mctx,
                                                                          const llama_hparams & hparams,
                                                                          const llama_cparams & cparams);

/// Attention of layer il through e8kv (one ggml custom op reading the codes), [n_embd_head·n_head,
/// n_tokens] before the output projection; null when `inp` is not e8kv's.
ggml_tensor * llama_e8kv_build_attn(ggml_context * ctx, llm_graph_input_i * inp, ggml_tensor * q,
                                    ggml_tensor * k, ggml_tensor * v, ggml_tensor * kq_b, ggml_tensor * sinks,
                                    float kq_scale, int il);

/// After a ubatch's graph ran: compresses its prompt chunks; false (the error logged) when e8kv's
/// attention failed in it or a chunk could not be compressed.
bool llama_e8kv_ubatch_computed(llama_memory_context_i * mctx);

/// At the end of a successful llama_decode call: the call's prompts become compressed sequences.
/// True for other memories. (A failed call needs nothing: llama.cpp removes the failed ubatch's
/// positions with seq_rm, and the chunks before it stay compressed.)
bool llama_e8kv_decode_finished(llama_memory_i * memory);

/// The largest prompt stage (bytes) a sequence of e8kv's memory held: at most one ubatch's keys,
/// values and observation rows. 0 for other memories.
size_t llama_e8kv_memory_staged_peak(const llama_memory_i * memory);
