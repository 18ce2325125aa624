#pragma once
// Flush denormal floats to zero on the CPU (PyTorch's torch.set_flush_denormal): sets the x86
// FTZ and DAZ bits (MXCSR) on the calling thread and on every thread of kiln's OpenMP pool, so
// denormal results become 0 and denormal inputs are read as 0.
//
// Why: an arithmetic instruction that meets a denormal takes a microcode assist, ~100x its normal
// cost. Late in training, confidently classified samples give softmax probabilities below
// FLT_MIN (~1e-38); their gradients flow through the backward GEMMs as denormals and kiln-train's
// CNN step slowed from ~5,100 to ~3,700 images/s over its last epoch on a 2-core x86 VM. Values
// that small are below float's normal precision anyway.
//
// Off by default, as in PyTorch. Threads created after the call (by the calling thread) inherit
// the setting; other threads keep theirs. Returns false, changing nothing, where the CPU has no
// such mode (non-x86 builds).
namespace kiln {

bool set_flush_denormal(bool on);
// Whether the calling thread flushes denormals.
bool flush_denormal();

}  // namespace kiln
