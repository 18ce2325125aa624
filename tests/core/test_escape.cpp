// The JSON and HTML escaping of the hand-written traces and timelines (kiln/core/escape.h).
#include <catch2/catch.hpp>

#include <string>

#include "kiln/core/escape.h"

using kiln::detail::html_escape;
using kiln::detail::json_escape;

TEST_CASE("json_escape escapes quotes, backslashes and control characters", "[escape]") {
  CHECK(json_escape("plain text, 1.5 ms") == "plain text, 1.5 ms");
  CHECK(json_escape("say \"hi\"") == "say \\\"hi\\\"");
  CHECK(json_escape("C:\\path") == "C:\\\\path");
  CHECK(json_escape("a\nb\tc") == "a\\nb\\tc");
  CHECK(json_escape(std::string("x\x01y\x1f", 4)) == "x\\u0001y\\u001f");
  CHECK(json_escape("<&>") == "<&>");
  CHECK(json_escape("caf\xc3\xa9") == "caf\xc3\xa9");  // UTF-8 bytes pass through
}

TEST_CASE("html_escape escapes markup characters only", "[escape]") {
  CHECK(html_escape("conv2d [128, 32, 28, 28]") == "conv2d [128, 32, 28, 28]");
  CHECK(html_escape("a < b && c > \"d\"") == "a &lt; b &amp;&amp; c &gt; &quot;d&quot;");
  CHECK(html_escape("back\\slash\n") == "back\\slash\n");
}
