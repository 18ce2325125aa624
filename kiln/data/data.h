#pragma once
// kiln::data — datasets, samplers, transforms and the prefetching DataLoader
// (docs/architecture.md, "The DataLoader").
#include "kiln/data/cifar.h"
#include "kiln/data/collate.h"
#include "kiln/data/dataset.h"
#include "kiln/data/file_reader.h"
#include "kiln/data/idx.h"
#include "kiln/data/loader.h"
#include "kiln/data/rng.h"
#include "kiln/data/sampler.h"
#include "kiln/data/staging.h"
#include "kiln/data/tensor_dataset.h"
#include "kiln/data/text.h"
#include "kiln/data/transforms.h"
