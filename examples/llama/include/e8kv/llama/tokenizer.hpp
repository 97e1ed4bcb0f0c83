// Byte-level BPE tokenizer (GPT-2 style) built from a GGUF vocabulary and merge list, with the
// model's pre-tokenization (tokenizer.ggml.pre) implemented by hand.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace e8kv::llama {

class GgufFile;

/// Token kinds as stored in tokenizer.ggml.token_type.
enum class TokenKind : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

/// Pre-tokenizer families (the regex split applied before BPE).
enum class PreTokenizer {
  kGpt2,        // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kDigitsGpt2,  // every \p{N} code point on its own, then the GPT-2 split (smollm, starcoder, ...)
};

class Tokenizer {
 public:
  /// Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos/eos/unknown_token_id}.
  /// Throws e8kv::Error for a model other than "gpt2", an unknown pre-tokenizer, or a merge
  /// that refers to tokens missing from the vocabulary.
  static Tokenizer from_gguf(const GgufFile& file);

  /// Text -> token ids. With parse_special, the text of control / user-defined tokens
  /// (e.g. "<|im_start|>") becomes that token; otherwise such text is tokenized as plain text.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = false) const;
  /// Token ids -> bytes. Control tokens are written as their text unless skip_special.
  /// Throws e8kv::Error for an id outside [0, vocab_size).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  std::string decode_token(int32_t id, bool skip_special = false) const;

  /// The pre-tokenizer's pieces of `text` (exposed for tests and tools).
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  /// Raw vocabulary string of a token (GPT-2 byte-to-unicode form for normal tokens).
  const std::string& token_text(int32_t id) const;
  TokenKind token_kind(int32_t id) const;
  /// Id of a vocabulary string, or -1.
  int32_t find(std::string_view token) const;
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t unknown_id() const { return unk_id_; }
  const std::string& pre_name() const { return pre_name_; }
  PreTokenizer pre() const { return pre_; }
  size_t merge_count() const { return merge_ranks_.size(); }

  /// The prompt for one user turn in the model's chat format (ChatML when the GGUF's
  /// tokenizer.chat_template uses <|im_start|>), ending where the assistant's reply begins.
  /// `system` empty: the template's default system message when it has one.
  std::string chat_prompt(const std::string& user, const std::string& system = "") const;
  bool has_chat_template() const { return !chat_template_.empty(); }

 private:
  void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out,
                    std::unordered_map<std::string, std::vector<int32_t>>& cache) const;

  std::vector<std::string> tokens_;
  std::vector<TokenKind> kinds_;
  std::unordered_map<std::string, int32_t> token_ids_;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_ranks_;
  int32_t byte_token_[256] = {};                           // id of the single-character token of each byte (-1: none)
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest first
  std::string pre_name_;
  PreTokenizer pre_ = PreTokenizer::kGpt2;
  std::string chat_template_;
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
};

/// GPT-2's reversible byte <-> code point map: printable bytes map to themselves, the others to
/// U+0100 and up, so every byte string is a printable unicode string.
uint32_t gpt2_byte_to_codepoint(uint8_t b);
/// -1 when `cp` is not the image of a byte.
int gpt2_codepoint_to_byte(uint32_t cp);

/// Unicode classes used by the pre-tokenizer (general categories L*, N*, and White_Space).
bool is_unicode_letter(uint32_t cp);
bool is_unicode_number(uint32_t cp);
bool is_unicode_space(uint32_t cp);

}  // namespace e8kv::llama
