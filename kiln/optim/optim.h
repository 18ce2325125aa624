#pragma once
// Umbrella header for kiln::optim: optimizers, LR schedules, the LR finder, gradient clipping, EMA.
#include "kiln/optim/adam.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/clip.h"
#include "kiln/optim/ema.h"
#include "kiln/optim/grad_scaler.h"
#include "kiln/optim/lamb.h"
#include "kiln/optim/lars.h"
#include "kiln/optim/lr_finder.h"
#include "kiln/optim/optimizer.h"
#include "kiln/optim/schedulers.h"
#include "kiln/optim/sgd.h"
