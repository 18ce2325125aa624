#pragma once
// Umbrella header for kiln::optim: optimizers, LR schedules and gradient clipping.
#include "kiln/optim/adam.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/clip.h"
#include "kiln/optim/lamb.h"
#include "kiln/optim/lars.h"
#include "kiln/optim/optimizer.h"
#include "kiln/optim/schedulers.h"
#include "kiln/optim/sgd.h"
