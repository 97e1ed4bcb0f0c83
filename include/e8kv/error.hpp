// Error reporting: host APIs throw e8kv::Error; kernel launchers return a [[nodiscard]] Status.
#pragma once

#include <stdexcept>
#include <string>

namespace e8kv {

/// Thrown by every host API on invalid arguments, unsupported shapes or corrupt input.
/// The message names the offending argument and, where it applies, the accepted values.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error("e8kv: " + what) {}
};

/// Result of a kernel launcher. Launchers never throw; glue code converts with check().
enum class [[nodiscard]] Status : int {
  kSuccess = 0,
  kInvalidArgument = 1,
  kUnsupportedHeadDim = 2,
  kUnsupportedBits = 3,
  kUnsupportedDtype = 4,
  kCudaError = 5,
  kNoDevice = 6,
  kMisaligned = 7,   ///< a pool or workspace not 16-byte aligned (CUDA launchers)
  kBeyondPlan = 8,   ///< a sequence longer than its launch was planned for (device status word)
};

inline const char* to_string(Status s) {
  switch (s) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kUnsupportedHeadDim: return "unsupported head_dim";
    case Status::kUnsupportedBits: return "unsupported bit rate";
    case Status::kUnsupportedDtype: return "unsupported dtype";
    case Status::kCudaError: return "CUDA error";
    case Status::kNoDevice: return "no CUDA device";
    case Status::kMisaligned: return "buffer not 16-byte aligned";
    case Status::kBeyondPlan: return "sequence longer than the launch was planned for";
  }
  return "unknown status";
}

/// Converts a launcher status into an exception at the outer API boundary.
inline void check(Status s, const char* where) {
  if (s != Status::kSuccess) throw Error(std::string(where) + ": " + to_string(s));
}

/// Throws e8kv::Error with `message` when `condition` is false. The message is built by the
/// caller even when the check passes, so per-element hot paths test first and build the message
/// only on failure (`if (!ok) throw Error(...)`), or pass a literal (the overload below).
inline void require(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

/// Same, for a literal message: no std::string is constructed unless the check fails.
inline void require(bool condition, const char* message) {
  if (!condition) throw Error(message);
}

}  // namespace e8kv
