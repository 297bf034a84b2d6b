//===- Result.h - Errors as values for core -------------------------------===//
//
// Core is used by MLIR code built with -fno-exceptions, so it reports failures
// as values. An Error carries one user-facing message that names the offending
// item the way the user wrote it; callers add location context (a JSON pointer,
// a CLI flag) with Error::within().
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_RESULT_H
#define MESHPLAN_CORE_RESULT_H

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace meshplan {

struct Error {
  std::string message;

  /// Prefixes the message with where the bad item was found, e.g. "--view".
  Error within(const std::string &where) const {
    return Error{where + ": " + message};
  }
};

/// Either a value or an Error. Deliberately tiny: std::expected is C++23.
template <typename T> class [[nodiscard]] Result {
public:
  Result(T value) : storage(std::move(value)) {}
  Result(Error error) : storage(std::move(error)) {}

  bool ok() const { return storage.index() == 0; }
  explicit operator bool() const { return ok(); }

  T &value() & {
    assert(ok() && "value() on an error Result");
    return std::get<0>(storage);
  }
  const T &value() const & {
    assert(ok() && "value() on an error Result");
    return std::get<0>(storage);
  }
  T &&value() && {
    assert(ok() && "value() on an error Result");
    return std::get<0>(std::move(storage));
  }
  T *operator->() { return &value(); }
  const T *operator->() const { return &value(); }
  T &operator*() & { return value(); }
  const T &operator*() const & { return value(); }

  const Error &error() const {
    assert(!ok() && "error() on a success Result");
    return std::get<1>(storage);
  }

private:
  std::variant<T, Error> storage;
};

/// Result of an operation with no value.
template <> class [[nodiscard]] Result<void> {
public:
  Result() = default;
  Result(Error error) : err(std::move(error)), failed(true) {}
  bool ok() const { return !failed; }
  explicit operator bool() const { return ok(); }
  const Error &error() const {
    assert(failed);
    return err;
  }

private:
  Error err;
  bool failed = false;
};

inline Error makeError(std::string message) {
  return Error{std::move(message)};
}

} // namespace meshplan

/// Propagates the error of a Result-returning expression out of the current
/// function, which must itself return some Result.
#define MESHPLAN_TRY(expr)                                                     \
  do {                                                                         \
    auto &&mpTryResult_ = (expr);                                              \
    if (!mpTryResult_.ok())                                                    \
      return mpTryResult_.error();                                             \
  } while (0)

/// Assigns the value of a Result-returning expression to `lhs` (an lvalue
/// declared before), or propagates its error out of the current function,
/// which must itself return some Result.
#define MESHPLAN_ASSIGN(lhs, expr)                                             \
  do {                                                                         \
    auto mpAssignResult_ = (expr);                                             \
    if (!mpAssignResult_.ok())                                                 \
      return mpAssignResult_.error();                                          \
    lhs = std::move(mpAssignResult_.value());                                  \
  } while (0)

#endif // MESHPLAN_CORE_RESULT_H
