#pragma once
// The umbrella header: everything a kiln user needs.
#include "kiln/config.h"
#include "kiln/core/autograd.h"
#include "kiln/core/cuda.h"
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/generator.h"
#include "kiln/core/gradcheck.h"
#include "kiln/core/tensor.h"
#include "kiln/data/data.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"
