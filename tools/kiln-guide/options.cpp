#include "options.h"

#include <CLI/CLI.hpp>
#include <kiln/core/build_info.h>

namespace kiln_guide {

Options parse_options(int argc, char** argv) {
  Options o;
  CLI::App app{
      "kiln-guide: reproduces the PyTorch performance guides' training speed-ups on this machine by "
      "running kiln-train with each one off and on, and writes report.md, report.json, report.png and "
      "runs/ to --out (docs/guide.md, \"Measuring it yourself\")"};
  app.set_version_flag("--version", std::string("kiln-guide, kiln ") + kiln::build_commit());
  app.add_option("--label", o.label,
                 "what the report calls this machine beside its CPU model (e.g. \"Zen 5 VM\"); /proc/cpuinfo "
                 "often names only the vendor");
  app.add_option("--device", o.device, "auto (the GPU when kiln-train can use one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  auto* quick = app.add_flag("--quick", o.quick,
                             "one round per side, short runs (the default; about 7 min on a quiet 2-core machine)");
  auto* full =
      app.add_flag("--full", o.full, "3 rounds per side, longer runs (about 35 min on a quiet 2-core machine)");
  quick->excludes(full);
  app.add_option("--only", o.only, "tip numbers or keys, comma-separated (e.g. 2,bf16,checkpointing; --list)");
  app.add_option("--repeats", o.repeats, "rounds per side (overrides the mode's 1 or 3)")->check(CLI::PositiveNumber);
  app.add_option("--out", o.out, "report folder (created): report.md, report.json, report.png, runs/");
  app.add_option("--kiln-train", o.kiln_train, "the kiln-train to run (default: the one next to kiln-guide)");
  app.add_option("--data", o.data,
                 "Fashion-MNIST folder for the cnn and resnet18 runs (kiln-train's default if unset)");
  app.add_option("--gpt-data", o.gpt_data, "text file or folder for the gpt runs (kiln-train's default if unset)");
  app.add_flag("--list", o.list, "print the tips, their models, metrics and flags, and exit");
  app.add_option("--steps", o.steps, "every run trains this many steps instead of the mode's budget (smoke tests)")
      ->check(CLI::PositiveNumber)
      ->group("Advanced");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return o;
}

}  // namespace kiln_guide
