// kiln-train's checkpoints (checkpoint.h).
#include "checkpoint.h"

#include <cerrno>
#include <cstdlib>
#include <optional>

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

namespace {

// What a checkpoint's metadata holds besides the identity, read before anything is loaded so a
// corrupt checkpoint changes nothing.
struct SavedProgress {
  Position position;
  std::optional<optim::SchedulerStateDict> scheduler;
  uint64_t rng_seed = 0, rng_offset = 0;
};

uint64_t decimal_u64(const nlohmann::json& v) {
  const std::string s = v.get<std::string>();
  KILN_CHECK(!s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos, "'", s,
             "' is not a decimal number");
  errno = 0;
  const unsigned long long x = std::strtoull(s.c_str(), nullptr, 10);
  KILN_CHECK(errno == 0, "'", s, "' does not fit in 64 bits");
  return x;
}

SavedProgress read_progress(const nlohmann::json& meta, bool with_scheduler) {
  SavedProgress p;
  if (with_scheduler) {
    KILN_CHECK(meta.contains("scheduler"), "it has no scheduler state");
    const auto& s = meta.at("scheduler");
    p.scheduler.emplace();
    p.scheduler->last_step = s.at("last_step").get<int64_t>();
    p.scheduler->base_lrs = s.at("base_lrs").get<std::vector<double>>();
    p.scheduler->last_lrs = s.at("last_lrs").get<std::vector<double>>();
  }
  p.rng_seed = decimal_u64(meta.at("rng_seed"));
  p.rng_offset = decimal_u64(meta.at("rng_offset"));
  p.position.epoch = meta.at("epoch").get<int64_t>();
  p.position.batch_in_epoch = meta.at("batch_in_epoch").get<int64_t>();
  p.position.step = meta.at("step").get<int64_t>();
  p.position.train_seconds = meta.value("train_seconds", 0.0);
  p.position.samples = meta.value("samples", int64_t{0});
  KILN_CHECK(p.position.epoch >= 0 && p.position.batch_in_epoch >= 0 && p.position.step >= 0, "its position (epoch ",
             p.position.epoch, ", batch ", p.position.batch_in_epoch, ", step ", p.position.step, ") is negative");
  return p;
}

}  // namespace

Position load_checkpoint(const std::string& path, const Options& o, kiln::nn::Module& model, optim::Optimizer& opt,
                         optim::LRScheduler* sched, optim::EMA* ema) {
  kiln::Metadata meta_raw;
  kiln::nn::StateDict d = kiln::load(path, &meta_raw);
  KILN_CHECK(meta_raw.count("kiln-train"), "--resume: '", path, "' is a safetensors file but not a kiln-train ",
             "checkpoint (no kiln-train metadata)");
  nlohmann::json meta;
  SavedProgress saved;
  try {
    meta = nlohmann::json::parse(meta_raw.at("kiln-train"));
    KILN_CHECK(meta.is_object(), "it is not a JSON object");
    auto want = identity(o), have = meta.value("identity", nlohmann::json::object());
    KILN_CHECK(have.is_object(), "its identity is not a JSON object");
    std::string diffs;
    for (auto& [k, v] : want.items()) {
      if (have.contains(k) && have[k] == v) continue;
      diffs += (diffs.empty() ? "" : ", ") + k + "=" + have.value(k, nlohmann::json("?")).dump() +
               " (this run: " + v.dump() + ")";
    }
    KILN_CHECK(diffs.empty(), "--resume: '", path, "' was written with other settings: ", diffs,
               "; resume with the same settings");
    saved = read_progress(meta, sched != nullptr);
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("--resume: '", path, "': the checkpoint's metadata is corrupt: ", e.what());
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    if (msg.find(path) != std::string::npos) throw;
    KILN_FAIL("--resume: '", path, "': the checkpoint's metadata is corrupt: ", msg);
  }
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
    try {
      sched->load_state_dict(*saved.scheduler);
    } catch (const kiln::Error& e) {
      KILN_FAIL("--resume: '", path, "': its scheduler state does not fit this run: ", e.what());
    }
  }
  kiln::default_generator(kiln::Device::cpu()).set_state(saved.rng_seed, saved.rng_offset);
  return saved.position;
}

std::string rank_path(const Options& o, const std::string& path) {
  if (!o.zero || o.rank == 0) return path;
  const std::string ext = ".safetensors";
  const bool has_ext = path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  return (has_ext ? path.substr(0, path.size() - ext.size()) : path) + ".rank" + std::to_string(o.rank) + ext;
}

}  // namespace kiln_train
