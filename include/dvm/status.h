// Status and StatusOr: the error channel for everything a caller can cause.
//
// No exception crosses the DVM core. Functions that can fail on user input return Status or
// StatusOr<T>; broken internal invariants use DVM_CHECK (which aborts with a message).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace dvm {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // bad shapes, dtypes, arguments
  kOutOfRange,       // overflow, out-of-bounds access
  kUnimplemented,    // valid request that DVM does not support (yet)
  kFailedPrecondition,
  kInternal,  // a bug in DVM
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: <message>"; "OK" when ok.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}
inline Status out_of_range(std::string msg) {
  return Status(StatusCode::kOutOfRange, std::move(msg));
}
inline Status unimplemented(std::string msg) {
  return Status(StatusCode::kUnimplemented, std::move(msg));
}
inline Status internal_error(std::string msg) {
  return Status(StatusCode::kInternal, std::move(msg));
}

// Holds either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : data_(std::move(value)) {}        // NOLINT: implicit by design
  StatusOr(Status status) : data_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(data_).is_ok()) {
      data_ = Status(StatusCode::kInternal, "StatusOr constructed from an ok Status");
    }
  }
  bool is_ok() const { return std::holds_alternative<T>(data_); }
  Status status() const { return is_ok() ? Status() : std::get<Status>(data_); }
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> data_;
};

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);
}  // namespace detail

}  // namespace dvm

#define DVM_CONCAT_INNER(a, b) a##b
#define DVM_CONCAT(a, b) DVM_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` is not ok.
#define DVM_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::dvm::Status dvm_status_ = (expr);           \
    if (!dvm_status_.is_ok()) return dvm_status_; \
  } while (0)

#define DVM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.is_ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

// `DVM_ASSIGN_OR_RETURN(auto x, f());` binds the value or returns the error.
#define DVM_ASSIGN_OR_RETURN(lhs, expr) \
  DVM_ASSIGN_OR_RETURN_IMPL(DVM_CONCAT(dvm_statusor_, __LINE__), lhs, expr)

// Internal invariant; aborts with a message. Never for conditions a user can cause.
#define DVM_CHECK(cond)                                                      \
  do {                                                                       \
    if (!(cond)) ::dvm::detail::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define DVM_CHECK_MSG(cond, msg)                                                \
  do {                                                                          \
    if (!(cond)) ::dvm::detail::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
