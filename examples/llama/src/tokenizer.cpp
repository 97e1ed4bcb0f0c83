// Byte-level BPE: UTF-8 decode -> pre-tokenizer split (hand-written state machine equal to the
// GPT-2 regex) -> bytes mapped to GPT-2 code points -> lowest-rank-first merges (heap).
#include "e8kv/llama/tokenizer.hpp"

#include <algorithm>
#include <queue>

#include "e8kv/error.hpp"
#include "e8kv/llama/gguf.hpp"

namespace e8kv::llama {

namespace detail {
struct CodepointRange {
  uint32_t first, last;
};
#include "unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodepointRange (&table)[N], uint32_t cp) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid].last < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < N && table[lo].first <= cp;
}
}  // namespace detail

namespace {

constexpr uint32_t kInvalidCodepoint = 0xFFFFFFFFu;  // a byte that is not valid UTF-8

struct Codepoint {
  uint32_t cp;
  uint32_t offset;  // byte offset of its first byte
};

// Decodes UTF-8; each byte of an invalid sequence becomes one kInvalidCodepoint unit so that
// its bytes still reach BPE (and decode(encode(x)) == x for any byte string).
std::vector<Codepoint> decode_utf8(std::string_view s) {
  std::vector<Codepoint> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    uint32_t cp = kInvalidCodepoint;
    size_t len = 1;
    if (c < 0x80) {
      cp = c;
    } else {
      size_t need = 0;
      uint32_t min = 0;
      if ((c & 0xE0) == 0xC0) {
        need = 1;
        cp = c & 0x1F;
        min = 0x80;
      } else if ((c & 0xF0) == 0xE0) {
        need = 2;
        cp = c & 0x0F;
        min = 0x800;
      } else if ((c & 0xF8) == 0xF0) {
        need = 3;
        cp = c & 0x07;
        min = 0x10000;
      }
      bool ok = need > 0 && i + need < n;
      for (size_t k = 1; ok && k <= need; ++k) {
        if ((p[i + k] & 0xC0) != 0x80)
          ok = false;
        else
          cp = (cp << 6) | (p[i + k] & 0x3F);
      }
      if (ok && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
      if (ok)
        len = need + 1;
      else
        cp = kInvalidCodepoint;
    }
    out.push_back({cp, static_cast<uint32_t>(i)});
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

struct ByteMap {
  uint32_t to_cp[256];
  int16_t from_cp[324];  // images are < 256 + 68
  ByteMap() {
    std::fill(std::begin(from_cp), std::end(from_cp), int16_t{-1});
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : 256 + extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

enum class CharClass { kLetter, kNumber, kSpace, kOther };
CharClass classify(uint32_t cp) {
  if (cp == kInvalidCodepoint) return CharClass::kOther;
  if (cp < 0x80) {  // fast path for ASCII
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::kSpace;
    return CharClass::kOther;
  }
  if (is_unicode_space(cp)) return CharClass::kSpace;
  if (is_unicode_letter(cp)) return CharClass::kLetter;
  if (is_unicode_number(cp)) return CharClass::kNumber;
  return CharClass::kOther;
}

// GPT-2 split of cps[b, e) into piece boundaries; `emit(begin, end)` gets code point indices.
// Mirrors the regex alternatives in order: contractions, ` ?\p{L}+`, ` ?\p{N}+`,
// ` ?[^\s\p{L}\p{N}]+`, `\s+(?!\S)`, `\s+`.
template <class Emit>
void gpt2_split(const std::vector<Codepoint>& cps, const std::vector<CharClass>& cls, size_t b, size_t e, Emit&& emit) {
  size_t i = b;
  while (i < e) {
    const uint32_t c = cps[i].cp;
    if (c == '\'' && i + 1 < e) {
      const uint32_t c1 = cps[i + 1].cp;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < e) {
        const uint32_t c2 = cps[i + 2].cp;
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          emit(i, i + 3);
          i += 3;
          continue;
        }
      }
    }
    // Optional leading ' ' (U+0020 only) before a letter / number / other run.
    const size_t start = (c == ' ' && i + 1 < e) ? i + 1 : i;
    const CharClass head = cls[start];
    if (head != CharClass::kSpace) {
      size_t k = start + 1;
      while (k < e && cls[k] == head) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // Whitespace run: all of it at the end of the piece; otherwise all but the last code point
    // (which then prefixes the next piece), or the single code point when the run has one.
    size_t k = i;
    while (k < e && cls[k] == CharClass::kSpace) ++k;
    if (k < e && k - i >= 2) k -= 1;
    emit(i, k);
    i = k;
  }
}

}  // namespace

uint32_t gpt2_byte_to_codepoint(uint8_t b) { return byte_map().to_cp[b]; }

int gpt2_codepoint_to_byte(uint32_t cp) { return cp < 324 ? byte_map().from_cp[cp] : -1; }

bool is_unicode_letter(uint32_t cp) { return detail::in_ranges(detail::kLetterRanges, cp); }
bool is_unicode_number(uint32_t cp) { return detail::in_ranges(detail::kNumberRanges, cp); }
bool is_unicode_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  Tokenizer t;
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (!(model == "gpt2"))
    throw Error("tokenizer model '" + model + "' is not supported (this engine implements byte-level BPE: 'gpt2')");
  t.pre_name_ = f.get_string("tokenizer.ggml.pre", "default");
  const std::string& p = t.pre_name_;
  if (p == "smollm" || p == "starcoder" || p == "refact" || p == "command-r" || p == "codeshell" || p == "exaone" ||
      p == "minerva-7b") {
    t.pre_ = PreTokenizer::kDigitsGpt2;
  } else if (p == "gpt-2" || p == "gpt2" || p == "default" || p == "mpt" || p == "olmo" || p == "jais") {
    t.pre_ = PreTokenizer::kGpt2;
  } else {
    throw Error("pre-tokenizer '" + p +
                "' (tokenizer.ggml.pre) is not supported (supported: smollm, starcoder, refact, "
                "command-r, codeshell, exaone, minerva-7b, gpt-2, default, mpt, olmo, jais)");
  }

  t.tokens_ = f.get_string_array("tokenizer.ggml.tokens");
  if (!(!t.tokens_.empty() && t.tokens_.size() < (1u << 30)))
    throw Error("tokenizer.ggml.tokens must hold 1..2^30 tokens");
  const int32_t n = static_cast<int32_t>(t.tokens_.size());
  t.kinds_.assign(t.tokens_.size(), TokenKind::kNormal);
  if (f.has("tokenizer.ggml.token_type")) {
    const auto& types = f.get_int_array("tokenizer.ggml.token_type");
    if (!(types.size() == t.tokens_.size()))
      throw Error("tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " +
                  std::to_string(n) + " tokens");
    for (size_t k = 0; k < types.size(); ++k) {
      if (!(types[k] >= 1 && types[k] <= 6))
        throw Error("tokenizer.ggml.token_type[" + std::to_string(k) + "] = " + std::to_string(types[k]) +
                    " (accepted: 1..6)");
      t.kinds_[k] = static_cast<TokenKind>(types[k]);
    }
  }
  t.token_ids_.reserve(t.tokens_.size() * 2);
  for (int32_t id = 0; id < n; ++id) t.token_ids_.emplace(t.tokens_[id], id);  // first id wins on duplicates

  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, gpt2_byte_to_codepoint(static_cast<uint8_t>(b)));
    t.byte_token_[b] = t.find(s);
  }

  if (f.has("tokenizer.ggml.merges")) {
    const auto& merges = f.get_string_array("tokenizer.ggml.merges");
    t.merge_ranks_.reserve(merges.size() * 2);
    for (size_t r = 0; r < merges.size(); ++r) {
      const std::string& m = merges[r];
      const size_t sp = m.find(' ', 1);  // a part is never empty; the first space after it splits
      if (!(sp != std::string::npos && sp + 1 < m.size()))
        throw Error("tokenizer merge #" + std::to_string(r) + " '" + m + "' is not two space-separated parts");
      const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
      const int32_t l = t.find(left), rr = t.find(right), merged = t.find(left + right);
      if (!(l >= 0 && rr >= 0 && merged >= 0))
        throw Error("tokenizer merge #" + std::to_string(r) + " '" + m +
                    "' refers to a token missing from the vocabulary");
      const uint64_t key = (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(rr);
      t.merge_ranks_.emplace(key, std::make_pair(static_cast<int32_t>(r), merged));  // first (lowest) rank wins
    }
  }

  auto id_or = [&](const char* key, int32_t fallback) {
    if (!f.has(key)) return fallback;
    const uint64_t v = f.get_uint(key);
    if (!(v < static_cast<uint64_t>(n)))
      throw Error(std::string(key) + " = " + std::to_string(v) + " is not a token id");
    return static_cast<int32_t>(v);
  };
  t.bos_id_ = id_or("tokenizer.ggml.bos_token_id", -1);
  t.eos_id_ = id_or("tokenizer.ggml.eos_token_id", -1);
  t.unk_id_ = id_or("tokenizer.ggml.unknown_token_id", -1);

  for (int32_t id = 0; id < n; ++id)
    if ((t.kinds_[id] == TokenKind::kControl || t.kinds_[id] == TokenKind::kUserDefined) && !t.tokens_[id].empty())
      t.specials_.emplace_back(t.tokens_[id], id);
  std::stable_sort(t.specials_.begin(), t.specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  t.chat_template_ = f.get_string("tokenizer.chat_template", "");
  return t;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (!(id >= 0 && id < vocab_size()))
    throw Error("token id " + std::to_string(id) + " is outside [0, " + std::to_string(vocab_size()) + ")");
  return tokens_[id];
}

TokenKind Tokenizer::token_kind(int32_t id) const {
  token_text(id);  // range check
  return kinds_[id];
}

int32_t Tokenizer::find(std::string_view token) const {
  auto it = token_ids_.find(std::string(token));
  return it == token_ids_.end() ? -1 : it->second;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  const auto cps = decode_utf8(text);
  std::vector<CharClass> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = classify(cps[i].cp);
  auto byte_at = [&](size_t i) { return i < cps.size() ? cps[i].offset : static_cast<uint32_t>(text.size()); };
  auto emit = [&](size_t b, size_t e) { out.emplace_back(text.substr(byte_at(b), byte_at(e) - byte_at(b))); };
  if (pre_ == PreTokenizer::kDigitsGpt2) {
    // Every number code point is its own piece; the GPT-2 split runs inside the pieces between.
    size_t piece = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (i == cps.size() || cls[i] == CharClass::kNumber) {
        gpt2_split(cps, cls, piece, i, emit);
        if (i < cps.size()) emit(i, i + 1);
        piece = i + 1;
      }
    }
  } else {
    gpt2_split(cps, cls, 0, cps.size(), emit);
  }
  return out;
}

void Tokenizer::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    int32_t id = byte_token_[static_cast<uint8_t>(word[i])];
    if (id < 0) {
      if (!(unk_id_ >= 0))
        throw Error("byte " + std::to_string(static_cast<uint8_t>(word[i])) +
                    " has no token in the vocabulary and there is no unknown token");
      id = unk_id_;
    }
    sym.push_back({id, static_cast<int32_t>(i) - 1, i + 1 < word.size() ? static_cast<int32_t>(i + 1) : -1});
  }
  if (sym.empty()) return;

  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t nx = sym[pos].next;
    if (nx < 0) return;
    const uint64_t key = (static_cast<uint64_t>(sym[pos].id) << 32) | static_cast<uint32_t>(sym[nx].id);
    auto it = merge_ranks_.find(key);
    if (it != merge_ranks_.end()) heap.push({it->second.first, pos, sym[pos].id, sym[nx].id});
  };
  for (int32_t i = 0; i < static_cast<int32_t>(sym.size()); ++i) consider(i);
  std::vector<bool> alive(sym.size(), true);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Skip stale candidates: one side was merged away or changed since it was queued.
    if (!alive[c.pos] || sym[c.pos].id != c.left) continue;
    const int32_t nx = sym[c.pos].next;
    if (nx < 0 || sym[nx].id != c.right) continue;
    const uint64_t key = (static_cast<uint64_t>(c.left) << 32) | static_cast<uint32_t>(c.right);
    sym[c.pos].id = merge_ranks_.find(key)->second.second;
    alive[nx] = false;
    sym[c.pos].next = sym[nx].next;
    if (sym[nx].next >= 0) sym[sym[nx].next].prev = c.pos;
    consider(sym[c.pos].prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out,
                             std::unordered_map<std::string, std::vector<int32_t>>& cache) const {
  for (const std::string& piece : pre_tokenize(text)) {
    auto it = cache.find(piece);
    if (it == cache.end()) {
      std::vector<int32_t> ids;
      bpe_word(piece, ids);
      it = cache.emplace(piece, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  if (!parse_special || specials_.empty()) {
    encode_plain(text, out, cache);
    return out;
  }
  bool first_byte[256] = {};
  for (const auto& s : specials_) first_byte[static_cast<uint8_t>(s.first[0])] = true;
  size_t plain_begin = 0;
  size_t i = 0;
  while (i < text.size()) {
    int32_t hit = -1;
    size_t hit_len = 0;
    if (first_byte[static_cast<uint8_t>(text[i])]) {
      for (const auto& s : specials_) {
        if (text.compare(i, s.first.size(), s.first) == 0) {
          hit = s.second;
          hit_len = s.first.size();
          break;  // longest first
        }
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    encode_plain(text.substr(plain_begin, i - plain_begin), out, cache);
    out.push_back(hit);
    i += hit_len;
    plain_begin = i;
  }
  encode_plain(text.substr(plain_begin), out, cache);
  return out;
}

std::string Tokenizer::decode_token(int32_t id, bool skip_special) const {
  const std::string& s = token_text(id);
  switch (kinds_[id]) {
    case TokenKind::kControl:
    case TokenKind::kUnknown:
    case TokenKind::kUnused:
      return skip_special ? std::string() : s;
    case TokenKind::kUserDefined:
      return s;
    case TokenKind::kByte: {
      // "<0xAB>" style byte tokens (SentencePiece vocabularies); anything else is kept as text.
      auto hex = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
      };
      if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' && hex(s[3]) >= 0 && hex(s[4]) >= 0)
        return std::string(1, static_cast<char>(hex(s[3]) * 16 + hex(s[4])));
      return s;
    }
    case TokenKind::kNormal:
      break;
  }
  std::string out;
  out.reserve(s.size());
  for (const Codepoint& c : decode_utf8(s)) {
    const int b = c.cp == kInvalidCodepoint ? -1 : gpt2_codepoint_to_byte(c.cp);
    if (b >= 0)
      out += static_cast<char>(b);
    else if (c.cp != kInvalidCodepoint)
      append_utf8(out, c.cp);  // not a byte image: keep as text
    else
      out += s[c.offset];
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) out += decode_token(id, skip_special);
  return out;
}

std::string Tokenizer::chat_prompt(const std::string& user, const std::string& system) const {
  if (!(!chat_template_.empty())) throw Error("this model has no chat template (tokenizer.chat_template)");
  if (!(chat_template_.find("<|im_start|>") != std::string::npos))
    throw Error("only ChatML chat templates (<|im_start|> ... <|im_end|>) are supported");
  std::string sys = system;
  if (sys.empty()) {
    const std::string open = "<|im_start|>system\n";
    const size_t at = chat_template_.find(open);
    if (at != std::string::npos) {
      const size_t end = chat_template_.find("<|im_end|>", at + open.size());
      if (end != std::string::npos) sys = chat_template_.substr(at + open.size(), end - at - open.size());
    }
  }
  std::string out;
  if (!sys.empty()) out += "<|im_start|>system\n" + sys + "<|im_end|>\n";
  out += "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
  return out;
}

}  // namespace e8kv::llama
