// main() of the tests that need the real model (label `model`, files real_*_test.cpp): they must
// never pass without running. Such a binary exits with 77, CTest's skip code (SKIP_RETURN_CODE 77
// where it is added: examples/llama, integrations/llama.cpp), when the model file is absent, or when any of its tests
// skipped (e.g. for want of the fetched corpora) and none failed; ctest then reports it skipped.
// With E8KV_REQUIRE_DATA=1 (CI, after scripts/fetch-data.sh) a skip is a failure instead (exit 1),
// so a fetch that went wrong cannot turn the real-model tests into silent skips.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "e8kv/llama/model_config.hpp"

namespace {

constexpr int kSkipExitCode = 77;

/// True when E8KV_REQUIRE_DATA is set to 1: the fetched model and texts must be present.
bool data_required() {
  const char* v = std::getenv("E8KV_REQUIRE_DATA");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

/// The exit status for "could not run": 77 (skipped), or 1 when data is required.
int not_run(const std::string& why) {
  if (data_required()) {
    std::printf("FAILED: %s, and E8KV_REQUIRE_DATA=1 (scripts/fetch-data.sh fetches it)\n", why.c_str());
    return 1;
  }
  std::printf("SKIPPED: %s (scripts/fetch-data.sh fetches it); exit %d = skipped\n", why.c_str(), kSkipExitCode);
  return kSkipExitCode;
}

int model_test_main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string model = e8kv::llama::default_model_path();
  if (!std::ifstream(model)) return not_run("model absent: " + model);
  const int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  const int skipped = ::testing::UnitTest::GetInstance()->skipped_test_count();
  if (skipped > 0) return not_run(std::to_string(skipped) + " test(s) skipped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return model_test_main(argc, argv); }
