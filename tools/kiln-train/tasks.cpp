#include "tasks.h"

#include <cmath>
#include <filesystem>

namespace kiln_train {

namespace F = kiln::nn::functional;
namespace nn = kiln::nn;
namespace data = kiln::data;
using kiln::Tensor;

namespace {

// Fashion-MNIST's pixel mean and standard deviation over the training set (input normalisation,
// docs/guide.md, speed-up 17).
constexpr double kMean = 0.2860, kStd = 0.3530;

std::string dataset_root(const Options& o) {
  std::string root = o.data.empty() ? data::FashionMNIST::kDefaultRoot : o.data;
  KILN_CHECK(std::filesystem::exists(root), "Fashion-MNIST not found in '", root, "': install Debian's ",
             "dataset-fashion-mnist package (apt-get install dataset-fashion-mnist; scripts/setup-deps.sh does) ",
             "or point --data at a folder with train-images-idx3-ubyte(.gz) and friends");
  return root;
}

// uint8 pixels to floats in [0, 1], then (--normalize-inputs, the default) standardised.
data::Compose vision_transform(const Options& o) {
  data::Compose t{data::ToFloat()};
  if (o.normalize_inputs)
    t.add(std::make_shared<data::Normalize>(std::vector<double>{kMean}, std::vector<double>{kStd}));
  if (o.channels_last) t.add(std::make_shared<data::ChannelsLast>());
  return t;
}

class VisionTask : public Task {
 public:
  explicit VisionTask(const Options& o)
      : o_(o),
        train_(dataset_root(o), data::Split::Train),
        test_(dataset_root(o), data::Split::Test),
        loader_(train_, train_loader_options(o, train_.size()).transform(vision_transform(o))) {
    if (o.model == "cnn") {
      cnn_ = std::make_unique<nn::models::FashionCNN>(nn::models::FashionCNNOptions().conv_bias(o.conv_bias));
      model_ = cnn_.get();
    } else if (o.model == "mlp") {
      mlp_ = std::make_unique<nn::models::MLP>(784, std::vector<int64_t>{512, 256}, 10, 0.1);
      model_ = mlp_.get();
    } else {
      resnet_ = nn::models::resnet18(10, 1, nn::models::ResNetStem::CIFAR);
      model_ = resnet_.get();
    }
    model_->to(device_of(o));
    if (o.channels_last) model_->to(kiln::MemoryFormat::ChannelsLast);
    // The CNN's conv -> BN -> ReLU -> pool blocks become nn::ConvBatchNormReLU2d: on the CPU the
    // first one kernel that never writes the conv output, the second conv2d with the BatchNorm's
    // statistics in its epilogue + one BN + ReLU + pool kernel; on CUDA the fused ops run
    // conv2d, batch_norm_relu and max_pool2d, as the chain would. The parameters and the
    // checkpoint keys stay the model's.
    if (o.fuse) nn::fuse(*model_);
  }

  nn::Module& model() override { return *model_; }
  data::DataLoader& train_loader() override { return loader_; }

  // The first 256 training images through the training transform, on the host (no device sync).
  std::optional<std::pair<double, double>> input_stats() override {
    data::DataLoader probe(train_, data::LoaderOptions().batch_size(256).transform(vision_transform(o_)));
    Tensor x = (*probe.begin()).input.to(kiln::DType::F64);
    const double mean = x.mean().item<double>();
    return std::make_pair(mean, std::sqrt((x - mean).pow(2.0).mean().item<double>()));
  }

  Tensor forward(const Tensor& x) {
    if (!o_.checkpoint_activations) return (*model_)(x);
    // Recompute the convolutional blocks in backward (docs/guide.md, speed-up 8): the CNN's 12 layers in 3 segments are
    // its two conv blocks (fused or not) and the head.
    if (cnn_) return kiln::checkpoint_sequential(*cnn_, 3, x);
    if (mlp_) return kiln::checkpoint_sequential(mlp_->layers, 2, x.flatten(1));
    auto& r = *resnet_;
    Tensor h = r.forward_stem(x);
    for (nn::Sequential* stage : {&r.layer1, &r.layer2, &r.layer3, &r.layer4})
      h = kiln::checkpoint([stage](const std::vector<Tensor>& in) { return (*stage)(in[0]); }, {h});
    return r.fc(F::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }

  Tensor loss(const data::Batch& b) override { return F::cross_entropy(forward(b.input), b.target); }

  Evaluation evaluate() override {
    kiln::GradModeGuard grad_mode(!o_.eval_no_grad);  // docs/guide.md, speed-up 16: no graph, no saved activations
    model_->eval();
    data::DataLoader test_loader(test_, data::LoaderOptions()
                                            .batch_size(256)
                                            .workers(o_.workers)
                                            .pin_memory(o_.pin_memory)
                                            .device(device_of(o_))
                                            .transform(vision_transform(o_)));
    int64_t correct = 0, total = 0;
    for (auto& b : test_loader) {
      Tensor pred = (*model_)(b.input).argmax(1);
      correct += (pred == b.target).to(kiln::DType::I64).sum().item<int64_t>();
      total += b.size();
    }
    model_->train();
    return {static_cast<double>(correct) / static_cast<double>(total), total};
  }

 private:
  Options o_;
  data::FashionMNIST train_, test_;
  data::DataLoader loader_;
  std::unique_ptr<nn::models::FashionCNN> cnn_;
  std::unique_ptr<nn::models::MLP> mlp_;
  std::shared_ptr<nn::models::ResNet> resnet_;
  nn::Module* model_ = nullptr;
};

// A contiguous range of another dataset's samples (the train / validation split of one text).
class Range : public data::Dataset {
 public:
  Range(const data::Dataset& base, int64_t begin, int64_t end) : base_(base), begin_(begin), end_(end) {}
  int64_t size() const override { return end_ - begin_; }
  data::Example get(int64_t i) const override { return base_.get(begin_ + i); }
  int64_t length(int64_t i) const override { return base_.length(begin_ + i); }

 private:
  const data::Dataset& base_;
  int64_t begin_, end_;
};

// The GPT's shape: the small char model, or GPT-2 124M's (its 50304-entry padded vocabulary too,
// of which a character corpus uses the first ~100 entries), for GPU throughput against peers.
nn::models::GPTConfig gpt_config(const Options& o) {
  nn::models::GPTConfig c;
  if (o.gpt_size == "124m") return nn::models::GPTConfig::gpt2_124m();
  c.block_size(128).n_layer(4).n_head(4).n_embd(128).dropout(0.1);
  return c;
}

data::CharDataset load_text(const Options& o, int64_t block) {
  if (o.data.empty()) {
    KILN_CHECK(std::filesystem::exists(data::CharDataset::kFortunesDir), "the default text corpus is Debian's ",
               "fortunes package (apt-get install fortunes), missing from ", data::CharDataset::kFortunesDir,
               "; or pass --data FILE");
    return data::CharDataset::fortunes(block);
  }
  if (std::filesystem::is_directory(o.data)) return data::CharDataset::fortunes(block, o.data);
  return data::CharDataset::from_files({o.data}, block);
}

class TextTask : public Task {
 public:
  explicit TextTask(const Options& o)
      : o_(o),
        config_(gpt_config(o)),
        text_(load_text(o, config_.block_size())),
        split_(text_.size() * 9 / 10),
        train_(text_, 0, split_),
        val_(text_, split_ + config_.block_size(), text_.size()),
        loader_(train_, train_loader_options(o, train_.size())),
        gpt_([&] {
          nn::models::GPTConfig c = config_;
          KILN_CHECK(text_.vocab_size() <= c.vocab_size(), "the corpus has ", text_.vocab_size(),
                     " distinct characters, more than the model's vocabulary of ", c.vocab_size());
          if (o.gpt_size == "char") c.vocab_size(text_.vocab_size());
          return c;
        }()) {
    gpt_.to(device_of(o));
  }

  nn::Module& model() override { return gpt_; }
  data::DataLoader& train_loader() override { return loader_; }

  Tensor logits(const Tensor& idx) {
    if (!o_.checkpoint_activations) return gpt_(idx);
    const int64_t T = idx.size(1);
    Tensor pos =
        kiln::arange(static_cast<double>(T), kiln::TensorOptions().dtype(kiln::DType::I64).device(idx.device()));
    Tensor x = gpt_.wte(idx) + gpt_.wpe(pos);
    for (const auto& blk : gpt_.h)
      x = kiln::checkpoint([b = blk.get()](const std::vector<Tensor>& in) { return b->forward(in[0]); }, {x});
    return F::linear(gpt_.ln_f(x), gpt_.wte.weight);
  }

  Tensor loss(const data::Batch& b) override {
    Tensor l = logits(b.input);
    return F::cross_entropy(l.reshape({-1, l.size(-1)}), b.target.reshape({-1}));
  }

  // Next-character accuracy on up to 40 validation batches.
  Evaluation evaluate() override {
    kiln::GradModeGuard grad_mode(!o_.eval_no_grad);
    gpt_.eval();
    data::DataLoader val(val_, data::LoaderOptions().batch_size(64).shuffle(true).seed(1234).device(device_of(o_)));
    int64_t correct = 0, total = 0, n = 0;
    for (auto& b : val) {
      Tensor pred = gpt_(b.input).argmax(-1);
      correct += (pred == b.target).to(kiln::DType::I64).sum().item<int64_t>();
      total += b.target.numel();
      if (++n == 40) break;
    }
    gpt_.train();
    return {static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(total, 1)), total};
  }

  std::string sample() override {
    Tensor prompt = kiln::tensor(text_.encode("\n")).view({1, -1}).to(device_of(o_));  // the model's device
    Tensor out = gpt_.generate(prompt, 300, 0.8, 20);
    return text_.decode(out.reshape({-1}));
  }

  int64_t samples_per_batch(const data::Batch& b) const override { return b.input.numel(); }  // tokens

 private:
  Options o_;
  nn::models::GPTConfig config_;
  data::CharDataset text_;
  int64_t split_;
  Range train_, val_;
  data::DataLoader loader_;
  nn::models::GPT gpt_;
};

}  // namespace

data::LoaderOptions train_loader_options(const Options& o, int64_t n) {
  auto opts = data::LoaderOptions()
                  .batch_size(o.batch_size)
                  .drop_last(true)
                  .workers(o.workers)
                  .pin_memory(o.pin_memory)
                  .device(device_of(o))
                  .seed(o.seed);
  if (o.world_size > 1) {
    // The same permutation on every rank (same seed and epoch), each rank its own slice.
    return opts.sampler(std::make_shared<data::DistributedSampler>(n, o.rank, o.world_size, /*shuffle=*/true, o.seed,
                                                                   /*drop_last=*/true));
  }
  return opts.shuffle(true);
}

std::unique_ptr<Task> make_task(const Options& o) {
  if (o.model == "gpt") return std::make_unique<TextTask>(o);
  return std::make_unique<VisionTask>(o);
}

}  // namespace kiln_train
