# The public headers: <kiln/kiln.h> and every header it includes, directly or not, paths relative
# to kiln/. Only these are installed; the others (kernels, CUDA plumbing) stay inside the build.
#
# The test "public headers: closure of kiln.h" (cmake/check_public_headers.cmake) asks the
# compiler which headers kiln.h pulls in, with the CUDA backend on and off, and fails when this
# list and that closure differ, so a public header cannot include an uninstalled one.
set(KILN_PUBLIC_HEADERS
  kiln.h
  core/arg.h
  core/autocast.h
  core/autograd.h
  core/caching_allocator.h
  core/cpu_conv.h
  core/cuda.h
  core/cuda_graph.h
  core/cuda_stream.h
  core/cudnn.h
  core/debug.h
  core/denormal.h
  core/determinism.h
  core/device.h
  core/dtype.h
  core/error.h
  core/generator.h
  core/gradcheck.h
  core/half.h
  core/macros.h
  core/memory_format.h
  core/philox.h
  core/storage.h
  core/sync_debug.h
  core/tensor.h
  data/cifar.h
  data/collate.h
  data/data.h
  data/dataset.h
  data/file_reader.h
  data/idx.h
  data/loader.h
  data/rng.h
  data/sampler.h
  data/staging.h
  data/tensor_dataset.h
  data/text.h
  data/transforms.h
  nn/activation.h
  nn/attention.h
  nn/checkpoint.h
  nn/container.h
  nn/conv_batch_norm_relu.h
  nn/conv.h
  nn/embedding.h
  nn/functional.h
  nn/fuse.h
  nn/init.h
  nn/linear.h
  nn/linear_gelu.h
  nn/loss.h
  nn/models/models.h
  nn/module.h
  nn/nn.h
  nn/normalization.h
  nn/options.h
  nn/serialize.h
  optim/adam.h
  optim/adamw.h
  optim/clip.h
  optim/ema.h
  optim/grad_scaler.h
  optim/lamb.h
  optim/lars.h
  optim/lr_finder.h
  optim/optim.h
  optim/optimizer.h
  optim/schedulers.h
  optim/sgd.h
  utils/csv.h
  utils/plot.h
  utils/progress.h
  utils/tensorboard.h
  utils/utils.h)

# Internal headers that a public header still includes (none): the check accepts these and no
# other header under kernels/.
set(KILN_PUBLIC_HEADERS_INTERNAL_EXCEPTIONS)
