#pragma once
// kiln-train on several processes (docs/distributed.md, "kiln-train on several processes"): when a
// launcher started this process as one rank of several, kiln-train joins the job, trains its
// shard of each global batch under DistributedDataParallel (or ZeRO-1 with --zero), and rank 0
// alone logs, plots and writes the model.
#include <memory>

#include <kiln/distributed/distributed.h>
#include <kiln/kiln.h>

#include "options.h"

namespace kiln_train {

// Joins the job when the environment says this process is one of several ranks, or the only rank
// of a kiln-run / torchrun job: sets o.distributed, fills
// o.rank / o.world_size / o.cuda_device (LOCAL_RANK) and turns o.batch_size, the global batch,
// into this rank's share. Returns false (and changes nothing) for a single process.
bool init_parallel(Options& o);
void finish_parallel(const Options& o);

// The largest of every rank's `value` (a collective: every rank calls it at the same step). What
// makes all ranks stop at the same step after a signal reached some of them (value: the signal).
int max_over_ranks(const Options& o, int value, const kiln::Device& device);

// Every rank's weights, hashed and gathered at the end of training: under DDP and ZeRO-1 the
// replicas must be bit for bit the same, so a difference is an Error naming the rank (a
// collective: every rank calls it). Rank 0 prints a line saying they are identical.
void check_replicas_identical(const Options& o, kiln::nn::Module& model, const kiln::Device& device);

}  // namespace kiln_train
