"""The steady-state rate of the PyTorch peers, measured as kiln-train measures its own.

kiln-train's JSON summary has two rates (docs/guide.md, "Whole-run and steady-state rates"):
samples_per_second over the whole run, set-up steps included, and steady_samples_per_second over
the steps after a warm-up (--warmup-steps: 5, but never more than a fifth of the run's steps, at
least 1). The peers import this module to report the same fields by the same rule, so that a
kiln run and a peer run of equal step counts compare. Standard library only (the peers' --list
runs without torch).
"""
import sys

DEFAULT_WARMUP = 5  # kiln-train's kSteadyWarmup (tools/kiln-train/options.h)


def add_argument(parser):
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="steps left out of the steady-state rate (default: 5, or a fifth of the steps when "
                             "that is fewer, at least 1; kiln-train's rule)")


def warmup_steps(steps, requested=None, at_least=0):
    """The warm-up of a run of `steps` steps: `requested`, or kiln-train's rule; never below `at_least`
    (the steps a compiled peer spends compiling)."""
    w = requested if requested is not None and requested >= 0 else max(1, min(DEFAULT_WARMUP, steps // 5))
    return max(w, at_least)


class SteadyWindow:
    """The window from the end of the warm-up's last step to the end of the run.

    `clock()` reads the run's training seconds so far; `sync()` (torch.cuda.synchronize on a GPU)
    runs before the clock is read at the window's start, so the warm-up's queued work stays out of
    it. The caller synchronises before taking the end time it passes to fields().
    """

    def __init__(self, warmup, clock, sync=None):
        self.warmup, self.clock, self.sync, self.start = warmup, clock, sync, None

    def step_done(self, steps_done, samples):
        """After each step (and with steps_done 0 before the first): opens the window at the warm-up's end."""
        if self.start is None and steps_done == self.warmup:
            if self.sync:
                self.sync()
            self.start = (self.clock(), samples)

    def fields(self, steps_done, samples, end_seconds):
        """The summary's warmup_steps, steady_steps, steady_seconds and steady_samples_per_second
        (None, and a note why on stderr, when no step followed the warm-up)."""
        seconds = end_seconds - self.start[0] if self.start else 0
        if steps_done <= self.warmup or seconds <= 0:
            print(f"no steady-state rate: the run took {steps_done} steps, none after its {self.warmup} warm-up "
                  "steps (--warmup-steps)", file=sys.stderr)
            return {"warmup_steps": self.warmup, "steady_steps": None, "steady_seconds": None,
                    "steady_samples_per_second": None}
        return {"warmup_steps": self.warmup, "steady_steps": steps_done - self.warmup, "steady_seconds": seconds,
                "steady_samples_per_second": (samples - self.start[1]) / seconds}
