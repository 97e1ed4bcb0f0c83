// make-slot: a real llama.cpp slot file of the first N tokens of a text (prefill, then
// llama_state_seq_save_file: the file llama-server's /slots?action=save writes), for the fleet
// measurements when no llama-server is at hand. Not built by CMake (links a libllama):
//   g++ -O2 -std=c++17 -I$LLAMA_SRC/include -I$LLAMA_SRC/ggml/include make_slot.cpp -L$LIBDIR -lllama \
//       -lggml -lggml-base -Wl,-rpath,$LIBDIR -o make-slot
//   make-slot MODEL.gguf TEXT_FILE N_TOKENS OUT_SLOT [flash_attn 0|1 (default 1)]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: make-slot MODEL.gguf TEXT_FILE N_TOKENS OUT_SLOT [flash_attn 0|1]\n");
    return 2;
  }
  const int n_want = std::atoi(argv[3]);
  const bool fa = argc < 6 || std::atoi(argv[5]) != 0;
  std::ifstream f(argv[2]);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!model) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::vector<llama_token> tok(text.size() + 8);
  const int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tok.data(),
                               static_cast<int32_t>(tok.size()), true, false);
  if (n < n_want) {
    std::fprintf(stderr, "the text has %d tokens, fewer than %d\n", n, n_want);
    return 1;
  }
  tok.resize(n_want);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n_want + 64);
  cp.n_batch = cp.n_ubatch = 512;
  cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  for (int i = 0; i < n_want; i += 512) {
    const int m = std::min(512, n_want - i);
    if (llama_decode(ctx, llama_batch_get_one(tok.data() + i, m)) != 0) return 1;
  }
  const size_t bytes = llama_state_seq_save_file(ctx, argv[4], 0, tok.data(), tok.size());
  std::printf("%s: %d tokens, %zu bytes (flash attention %s)\n", argv[4], n_want, bytes, fa ? "on" : "off");
  llama_free(ctx);
  llama_model_free(model);
  return bytes ? 0 : 1;
}
