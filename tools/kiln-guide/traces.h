#pragma once
// The profile of each model the report measures (the guides' first advice: profile before you
// tune): kiln-train --profile on the CNN and the char GPT (ResNet-18 too in --full), a Chrome
// trace and a top-ops table per model under OUT/traces/, linked from report.md.
#include <string>
#include <vector>

#include "session.h"

namespace kiln_guide {

struct ModelTrace {
  std::string model;
  bool ok = false;
  std::string trace, table;      // paths relative to OUT (ok), or the failure's reason
  std::vector<std::string> top;  // the table's first rows
};

std::vector<ModelTrace> profile_models(const SessionOptions& s);

// Appends a "Where a step's time goes" section to OUT/report.md.
void append_traces(const std::string& out, const std::vector<ModelTrace>& traces);

}  // namespace kiln_guide
