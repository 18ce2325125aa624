#pragma once
// Which kiln this is, so that a measurement can be traced to its code: kiln-train's JSON summary
// and kiln-guide's reports name it.

namespace kiln {

// The commit kiln was built from: `git describe --always --dirty` at build time (a commit hash,
// with "-dirty" when the tree had uncommitted changes), or "unknown" when built outside a git
// checkout.
const char* build_commit();

}  // namespace kiln
