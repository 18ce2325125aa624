// kiln-train's checkpoints (checkpoint.h).
#include "checkpoint.h"

#include <nlohmann/json.hpp>

namespace kiln_train {

namespace optim = kiln::optim;
using kiln::Tensor;

namespace {
nlohmann::json identity(const Options& o) {
  // batch_size is this rank's share: with the world size it names the global batch.
  return {{"model", o.model},
          {"optimizer", o.optimizer},
          {"batch_size", o.batch_size},
          {"schedule", o.schedule},
          {"epochs", o.epochs},
          {"grad_accum", o.grad_accum},
          {"ema", o.ema},
          {"channels_last", o.channels_last},
          {"world_size", o.world_size},
          {"zero", o.zero}};
}

}  // namespace

void save_checkpoint(const std::string& path, const Options& o, kiln::nn::Module& model, optim::Optimizer& opt,
                     optim::LRScheduler* sched, optim::EMA* ema, const Position& pos) {
  kiln::nn::StateDict d;
  for (auto& [k, v] : model.state_dict()) d.insert("model." + k, v);
  for (auto& [k, v] : opt.state_dict().flatten()) d.insert("optim." + k, v);
  if (ema)
    for (auto& [k, v] : ema->state_dict()) d.insert(k, v);
  auto& gen = kiln::default_generator(kiln::Device::cpu());
  nlohmann::json meta = {{"epoch", pos.epoch},
                         {"batch_in_epoch", pos.batch_in_epoch},
                         {"step", pos.step},
                         {"train_seconds", pos.train_seconds},
                         {"samples", pos.samples},
                         {"rng_seed", std::to_string(gen.seed())},
                         {"rng_offset", std::to_string(gen.offset())},
                         {"identity", identity(o)}};
  if (sched) {
    auto s = sched->state_dict();
    meta["scheduler"] = {{"last_step", s.last_step}, {"base_lrs", s.base_lrs}, {"last_lrs", s.last_lrs}};
  }
  kiln::save(d, path, {{"kiln-train", meta.dump()}});
}

Position load_checkpoint(const std::string& path, const Options& o, kiln::nn::Module& model, optim::Optimizer& opt,
                         optim::LRScheduler* sched, optim::EMA* ema) {
  kiln::Metadata meta_raw;
  kiln::nn::StateDict d = kiln::load(path, &meta_raw);
  KILN_CHECK(meta_raw.count("kiln-train"), "--resume: '", path, "' is a safetensors file but not a kiln-train ",
             "checkpoint (no kiln-train metadata)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(meta_raw.at("kiln-train"));
  } catch (const std::exception& e) {
    KILN_FAIL("--resume: '", path, "': the checkpoint's metadata is corrupt: ", e.what());
  }
  auto want = identity(o), have = meta.value("identity", nlohmann::json::object());
  std::string diffs;
  for (auto& [k, v] : want.items()) {
    if (have.contains(k) && have[k] == v) continue;
    diffs += (diffs.empty() ? "" : ", ") + k + "=" + have.value(k, nlohmann::json("?")).dump() +
             " (this run: " + v.dump() + ")";
  }
  KILN_CHECK(diffs.empty(), "--resume: '", path, "' was written with other settings: ", diffs,
             "; resume with the same settings");
  kiln::nn::StateDict model_sd, ema_sd;
  std::vector<std::pair<std::string, Tensor>> optim_items;
  for (auto& [k, v] : d) {
    if (k.rfind("model.", 0) == 0) model_sd.insert(k.substr(6), v);
    else if (k.rfind("optim.", 0) == 0) optim_items.emplace_back(k.substr(6), v);
    else if (k.rfind("ema.", 0) == 0) ema_sd.insert(k, v);
  }
  try {
    model.load_state_dict(model_sd, true);
    opt.load_state_dict(optim::OptimizerStateDict::unflatten(opt.state_dict().optimizer, optim_items));
    if (ema) ema->load_state_dict(ema_sd);
  } catch (const kiln::Error& e) {
    KILN_FAIL("--resume: '", path, "' does not match this model: ", e.what());
  }
  if (sched) {
    KILN_CHECK(meta.contains("scheduler"), "--resume: '", path, "' has no scheduler state");
    optim::SchedulerStateDict s;
    s.last_step = meta["scheduler"]["last_step"].get<int64_t>();
    s.base_lrs = meta["scheduler"]["base_lrs"].get<std::vector<double>>();
    s.last_lrs = meta["scheduler"]["last_lrs"].get<std::vector<double>>();
    sched->load_state_dict(s);
  }
  kiln::default_generator(kiln::Device::cpu())
      .set_state(std::stoull(meta["rng_seed"].get<std::string>()), std::stoull(meta["rng_offset"].get<std::string>()));
  Position p;
  p.epoch = meta["epoch"].get<int64_t>();
  p.batch_in_epoch = meta["batch_in_epoch"].get<int64_t>();
  p.step = meta["step"].get<int64_t>();
  p.train_seconds = meta.value("train_seconds", 0.0);
  p.samples = meta.value("samples", int64_t{0});
  return p;
}

std::string rank_path(const Options& o, const std::string& path) {
  if (!o.zero || o.rank == 0) return path;
  const std::string ext = ".safetensors";
  const bool has_ext = path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  return (has_ext ? path.substr(0, path.size() - ext.size()) : path) + ".rank" + std::to_string(o.rank) + ext;
}

}  // namespace kiln_train
