// Byte-level BPE tokenizer: GPT-2 byte map facts, pre-tokenizer splits derived by hand from the
// regex, BPE against a naive reference on random merge tables, round trips of arbitrary bytes,
// special tokens and errors (the real model's vocabulary: real_tokenizer_test.cpp).
#include "e8kv/llama/tokenizer.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/llama/gguf.hpp"
#include "e8kv/llama/testing.hpp"
#include "testing/test_util.hpp"

namespace {

using e8kv::llama::GgufFile;
using e8kv::llama::GgufWriter;
using e8kv::llama::Tokenizer;
using Pieces = std::vector<std::string>;

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The GPT-2 image (as UTF-8) of a byte string.
std::string image(const std::string& bytes) {
  std::string s;
  for (unsigned char c : bytes) s += utf8(e8kv::llama::gpt2_byte_to_codepoint(c));
  return s;
}

Tokenizer tiny_tokenizer(const std::string& pre = "smollm") {
  e8kv::llama::TinyLlamaSpec spec;
  spec.pre = pre;
  return Tokenizer::from_gguf(GgufFile::parse(e8kv::llama::make_tiny_llama_gguf(spec)));
}

// A vocabulary-only GGUF: byte tokens, then merged tokens for `merges`, plus extra metadata.
std::vector<uint8_t> vocab_image(const std::vector<std::string>& merges, const std::string& model = "gpt2",
                                 const std::string& pre = "gpt2", bool add_merged_tokens = true) {
  std::vector<std::string> tokens = {"<|endoftext|>"};
  std::vector<int32_t> types = {3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(utf8(e8kv::llama::gpt2_byte_to_codepoint(static_cast<uint8_t>(b))));
    types.push_back(1);
  }
  std::set<std::string> have(tokens.begin(), tokens.end());
  for (const auto& m : merges) {
    const std::string merged = m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1);
    if (add_merged_tokens && have.insert(merged).second) {
      tokens.push_back(merged);
      types.push_back(1);
    }
  }
  GgufWriter w;
  w.add_string("tokenizer.ggml.model", model);
  w.add_string("tokenizer.ggml.pre", pre);
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_int32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", merges);
  return w.bytes();
}

// Textbook BPE: repeatedly merge the adjacent pair with the lowest rank (leftmost on ties).
std::vector<std::string> naive_bpe(const std::string& word_image,
                                   const std::map<std::pair<std::string, std::string>, int>& rank) {
  std::vector<std::string> sym;
  for (size_t i = 0; i < word_image.size();) {  // split the image into code points
    const unsigned char c = static_cast<unsigned char>(word_image[i]);
    const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    sym.push_back(word_image.substr(i, len));
    i += len;
  }
  for (;;) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = rank.find({sym[i], sym[i + 1]});
      if (it != rank.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) return sym;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
}

TEST(ByteMap, Gpt2Facts) {
  // Printable Latin-1 bytes map to themselves; space -> U+0120 'Ġ', newline -> U+010A 'Ċ'.
  EXPECT_EQ(e8kv::llama::gpt2_byte_to_codepoint('A'), static_cast<uint32_t>('A'));
  EXPECT_EQ(e8kv::llama::gpt2_byte_to_codepoint(0xE9), 0xE9u);
  EXPECT_EQ(e8kv::llama::gpt2_byte_to_codepoint(' '), 0x120u);
  EXPECT_EQ(e8kv::llama::gpt2_byte_to_codepoint('\n'), 0x10Au);
  EXPECT_EQ(e8kv::llama::gpt2_byte_to_codepoint(0), 0x100u);
  EXPECT_EQ(e8kv::llama::gpt2_byte_to_codepoint(0xAD), 0x143u);  // the last non-printable byte
  std::set<uint32_t> images;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = e8kv::llama::gpt2_byte_to_codepoint(static_cast<uint8_t>(b));
    images.insert(cp);
    EXPECT_EQ(e8kv::llama::gpt2_codepoint_to_byte(cp), b);
  }
  EXPECT_EQ(images.size(), 256u);
  EXPECT_EQ(e8kv::llama::gpt2_codepoint_to_byte(0x41 + 0x1000), -1);
}

TEST(UnicodeClasses, KnownCodepoints) {
  using e8kv::llama::is_unicode_letter;
  using e8kv::llama::is_unicode_number;
  using e8kv::llama::is_unicode_space;
  for (uint32_t cp : {0x41u, 0x7Au, 0xE9u, 0x3B1u, 0x416u, 0x65E5u, 0xD55Cu, 0x5D0u, 0x1D400u})
    EXPECT_TRUE(is_unicode_letter(cp)) << cp;
  for (uint32_t cp : {0x30u, 0x39u, 0x663u, 0x216Bu, 0xBDu, 0xFF10u}) EXPECT_TRUE(is_unicode_number(cp)) << cp;
  for (uint32_t cp : {0x20u, 0x09u, 0x0Au, 0x0Du, 0xA0u, 0x2003u, 0x3000u, 0x85u})
    EXPECT_TRUE(is_unicode_space(cp)) << cp;
  for (uint32_t cp : {0x21u, 0x2Du, 0x1F600u, 0x2192u, 0xA9u}) {
    EXPECT_FALSE(is_unicode_letter(cp)) << cp;
    EXPECT_FALSE(is_unicode_number(cp)) << cp;
    EXPECT_FALSE(is_unicode_space(cp)) << cp;
  }
  EXPECT_FALSE(is_unicode_letter(0x110000));
}

TEST(PreTokenizer, Gpt2RegexSplits) {
  const Tokenizer t = tiny_tokenizer("gpt2");
  EXPECT_EQ(t.pre_tokenize("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(t.pre_tokenize("it's don't we'll I'M"), (Pieces{"it", "'s", " don", "'t", " we", "'ll", " I", "'", "M"}));
  EXPECT_EQ(t.pre_tokenize("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(t.pre_tokenize("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(t.pre_tokenize("x\n\ny"), (Pieces{"x", "\n", "\n", "y"}));
  EXPECT_EQ(t.pre_tokenize("x\n y"), (Pieces{"x", "\n", " y"}));
  EXPECT_EQ(t.pre_tokenize("x \ny"), (Pieces{"x", " ", "\n", "y"}));
  EXPECT_EQ(t.pre_tokenize("hi  "), (Pieces{"hi", "  "}));
  EXPECT_EQ(t.pre_tokenize("  hi"), (Pieces{" ", " hi"}));
  EXPECT_EQ(t.pre_tokenize("!!! ?x"), (Pieces{"!!!", " ?", "x"}));
  EXPECT_EQ(t.pre_tokenize("abc 123 4x"), (Pieces{"abc", " 123", " 4", "x"}));
  EXPECT_EQ(t.pre_tokenize("'s's"), (Pieces{"'s", "'s"}));
  EXPECT_EQ(t.pre_tokenize("' s"), (Pieces{"'", " s"}));
  EXPECT_EQ(t.pre_tokenize("café naïve"), (Pieces{"café", " naïve"}));
  EXPECT_EQ(t.pre_tokenize("x\xC2\xA0y"), (Pieces{"x", "\xC2\xA0", "y"}));    // NBSP is whitespace
  EXPECT_EQ(t.pre_tokenize("a\xFF\xFE b"), (Pieces{"a", "\xFF\xFE", " b"}));  // invalid UTF-8: "other"
  EXPECT_EQ(t.pre_tokenize(""), Pieces{});
  EXPECT_EQ(t.pre_tokenize(" "), Pieces{" "});
  EXPECT_EQ(t.pre_tokenize("\t\t"), Pieces{"\t\t"});
}

TEST(PreTokenizer, SmolLmSplitsEveryDigit) {
  const Tokenizer t = tiny_tokenizer("smollm");
  EXPECT_EQ(t.pre(), e8kv::llama::PreTokenizer::kDigitsGpt2);
  EXPECT_EQ(t.pre_tokenize("abc 123 4x"), (Pieces{"abc", " ", "1", "2", "3", " ", "4", "x"}));
  EXPECT_EQ(t.pre_tokenize("3.14"), (Pieces{"3", ".", "1", "4"}));
  EXPECT_EQ(t.pre_tokenize("x\xD9\xA3y"), (Pieces{"x", "\xD9\xA3", "y"}));  // Arabic-Indic digit three
  EXPECT_EQ(t.pre_tokenize("Hello world"), (Pieces{"Hello", " world"}));
}

TEST(Bpe, HandDerivedMerges) {
  const Tokenizer t = tiny_tokenizer();
  auto id = [&](const std::string& text) {
    const int32_t i = t.find(image(text));
    EXPECT_GE(i, 0) << text;
    return i;
  };
  // " the": Ġ t -> Ġt, h e -> he, Ġt he -> Ġthe.
  EXPECT_EQ(t.encode(" the"), (std::vector<int32_t>{id(" the")}));
  // "thing": i n -> in, in g -> ing; t and h stay single (no "t h" merge).
  EXPECT_EQ(t.encode("thing"), (std::vector<int32_t>{id("t"), id("h"), id("ing")}));
  // Three spaces before a word: "   " then " x"; Ġ Ġ merges the leftmost pair, no "ĠĠ Ġ" merge.
  EXPECT_EQ(t.encode("hi    x"), (std::vector<int32_t>{id("h"), id("i"), id("  "), id(" "), id(" "), id("x")}));
  // Four: Ġ Ġ twice (leftmost first), then ĠĠ ĠĠ.
  EXPECT_EQ(t.encode("hi     x"), (std::vector<int32_t>{id("h"), id("i"), id("    "), id(" "), id("x")}));
  EXPECT_EQ(t.encode(" of"), (std::vector<int32_t>{id(" of")}));
  EXPECT_EQ(t.decode(t.encode(" the thing and of")), " the thing and of");
}

TEST(Bpe, MatchesNaiveReferenceOnRandomMergeTables) {
  auto rng = e8kv::test::seeded_rng(77);
  const std::string alphabet = "abcde ";
  for (int table = 0; table < 5; ++table) {
    // Random merges built bottom-up over a small alphabet, so long chains and rank ties occur.
    std::vector<std::string> pieces;
    for (char c : alphabet) pieces.push_back(image(std::string(1, c)));
    std::vector<std::string> merges;
    std::map<std::pair<std::string, std::string>, int> rank;
    std::uniform_int_distribution<size_t> pick(0, 1000000);
    while (merges.size() < 60) {
      const std::string a = pieces[pick(rng) % pieces.size()], b = pieces[pick(rng) % pieces.size()];
      if (rank.count({a, b})) continue;
      rank[{a, b}] = static_cast<int>(merges.size());
      merges.push_back(a + " " + b);
      pieces.push_back(a + b);
    }
    const Tokenizer t = Tokenizer::from_gguf(GgufFile::parse(vocab_image(merges, "gpt2", "gpt2")));
    std::uniform_int_distribution<int> ch(0, static_cast<int>(alphabet.size()) - 2), len(1, 40);
    for (int trial = 0; trial < 300; ++trial) {
      std::string word(static_cast<size_t>(len(rng)), 'a');
      for (auto& c : word) c = alphabet[static_cast<size_t>(ch(rng))];
      if (trial % 3 == 0) word = " " + word;  // with the leading-space form
      ASSERT_EQ(t.pre_tokenize(word).size(), 1u);
      std::vector<int32_t> expect;
      for (const auto& s : naive_bpe(image(word), rank)) expect.push_back(t.find(s));
      ASSERT_EQ(t.encode(word), expect) << "table " << table << " word '" << word << "'";
    }
  }
}

TEST(Tokenizer, RoundTripsArbitraryBytes) {
  const Tokenizer t = tiny_tokenizer();
  auto rng = e8kv::test::seeded_rng(5);
  std::uniform_int_distribution<int> byte(0, 255), len(0, 200);
  const std::vector<std::string> samples = {"",
                                            " ",
                                            "Hello, world! It's 2024.\n\n  Done.",
                                            "\xF0\x9F\x98\x80 emoji",
                                            "\xE2\x82",
                                            "\xC0\xAF overlong",
                                            "\xED\xA0\x80 surrogate",
                                            "<|im_start|>user\nhi<|im_end|>",
                                            std::string("nul\0byte", 8)};
  for (const auto& s : samples) EXPECT_EQ(t.decode(t.encode(s)), s);
  for (int trial = 0; trial < 500; ++trial) {
    std::string s(static_cast<size_t>(len(rng)), '\0');
    for (auto& c : s) c = static_cast<char>(trial % 2 ? byte(rng) : 32 + byte(rng) % 95);
    ASSERT_EQ(t.decode(t.encode(s)), s) << "trial " << trial;
    ASSERT_EQ(t.decode(t.encode(s, true)), s) << "trial " << trial;
  }
}

TEST(Tokenizer, SpecialTokens) {
  const Tokenizer t = tiny_tokenizer();
  const int32_t start = t.find("<|im_start|>"), end = t.find("<|im_end|>");
  ASSERT_EQ(start, 1);
  ASSERT_EQ(end, 2);
  EXPECT_EQ(t.token_kind(start), e8kv::llama::TokenKind::kControl);
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const auto with = t.encode(text, true);
  ASSERT_GE(with.size(), 3u);
  EXPECT_EQ(with.front(), start);
  EXPECT_EQ(with.back(), end);
  const auto without = t.encode(text, false);
  for (int32_t id : without) EXPECT_NE(t.token_kind(id), e8kv::llama::TokenKind::kControl);
  EXPECT_EQ(t.decode(with), text);
  EXPECT_EQ(t.decode(with, true), "user\nhi");
  EXPECT_EQ(t.encode("<|im_end|><|im_end|>", true), (std::vector<int32_t>{end, end}));
  EXPECT_EQ(t.encode("<|im_", true), t.encode("<|im_", false));  // a prefix is not a special token
}

TEST(Tokenizer, ChatPromptUsesTheTemplateDefaultSystem) {
  const Tokenizer t = tiny_tokenizer();
  EXPECT_EQ(t.chat_prompt("hi"),
            "<|im_start|>system\nYou are a tiny test model<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(t.chat_prompt("hi", "Be brief"),
            "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Tokenizer, ErrorsAreNamed) {
  auto expect_error = [](const std::vector<uint8_t>& img, const std::string& needle) {
    try {
      Tokenizer::from_gguf(GgufFile::parse(img));
      ADD_FAILURE() << "accepted; expected '" << needle << "'";
    } catch (const e8kv::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(vocab_image({"a b"}, "llama"), "tokenizer model 'llama'");
  expect_error(vocab_image({"a b"}, "gpt2", "weird-pre"), "pre-tokenizer 'weird-pre'");
  expect_error(vocab_image({"a b"}, "gpt2", "gpt2", false), "merge #0 'a b' refers to a token missing");
  expect_error(vocab_image({"ab"}, "gpt2", "gpt2", false), "not two space-separated parts");
  const Tokenizer t = tiny_tokenizer();
  EXPECT_THROW(t.decode({t.vocab_size()}), e8kv::Error);
  EXPECT_THROW(t.decode({-1}), e8kv::Error);
  EXPECT_THROW(t.token_text(1 << 20), e8kv::Error);
}

TEST(Tokenizer, ByteTokensDecodeToTheirByte) {
  GgufWriter w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string_array("tokenizer.ggml.tokens", {"<0x41>", "<0xfF>", "<0xZZ>", "ab"});
  w.add_int32_array("tokenizer.ggml.token_type", {6, 6, 6, 1});
  const Tokenizer t = Tokenizer::from_gguf(GgufFile::parse(w.bytes()));
  EXPECT_EQ(t.pre_name(), "default");
  EXPECT_EQ(t.decode({0, 1, 2, 3}), "A\xFF<0xZZ>ab");
}

}  // namespace
