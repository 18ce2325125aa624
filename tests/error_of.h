#pragma once
// error_of: the message of the kiln::Error a piece of code throws. Free of Catch, so the rank
// programs of tests/distributed/worker share it with the test binaries (tests/test_util.h).
#include <functional>
#include <string>

#include <kiln/core/error.h>

namespace kiln_test {

// The message of the kiln::Error `fn` throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kiln_test
