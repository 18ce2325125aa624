#pragma once
// kiln::utils: the logging side of a training run (what kiln-train writes besides checkpoints).
//   SummaryWriter  TensorBoard event files (scalars), no protobuf dependency   tensorboard.h
//   CsvWriter      a metrics table, one flushed row at a time                  csv.h
//   Progress       a per-epoch progress bar, or periodic lines off a terminal  progress.h
//   write_line_plot_png  stacked line-plot panels as a PNG                     plot.h
//   write_memory_timeline / _trace  the caching allocator's history            memory_timeline.h
#include "kiln/utils/csv.h"
#include "kiln/utils/memory_timeline.h"
#include "kiln/utils/plot.h"
#include "kiln/utils/progress.h"
#include "kiln/utils/tensorboard.h"
