"""Profile a user's own torchrun script, unchanged: ``parlab profile run --nproc N script.py ARGS``.

``parlab profile run`` starts ``python -m torch.distributed.run ... -m
parlab.profile.runner script.py ARGS``. On every rank this module starts a
``Profiler`` (folder, schedule and run id from ``$PARLAB_PROFILE_DIR``,
``$PARLAB_PROFILE_SCHEDULE``, ``$PARLAB_PROFILE_RUN_ID``), registers a global
optimizer step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``)
that steps it after every ``optimizer.step()``, and runs the script as
``__main__`` with its own arguments. The script's collectives are whatever
it issues; the runner adds none. A script with several optimizers steps the
profiler once per optimizer step (use ``maybe_profile`` in the loop instead
for exact step marks).
"""

from __future__ import annotations

import os
import runpy
import sys

from torch.optim.optimizer import register_optimizer_step_post_hook

from parlab.profile.capture import ENV_DIR, ENV_SCHEDULE, Profiler, parse_schedule


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m parlab.profile.runner SCRIPT.py [ARGS...]\n")
        return 2
    out = os.environ.get(ENV_DIR)
    if not out:
        sys.stderr.write(
            f"parlab.profile.runner: ${ENV_DIR} is not set: run it through parlab profile run\n"
        )
        return 2
    wait, warmup, active = parse_schedule(os.environ.get(ENV_SCHEDULE, "1,1,2"))
    script = argv[0]
    prof = Profiler(
        None, out, wait=wait, warmup=warmup, active=active, label=os.path.basename(script)
    )
    handle = register_optimizer_step_post_hook(lambda *_: prof.step())
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    prof.__enter__()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        handle.remove()
        prof.__exit__(None, None, None)
    if not prof.done:
        sys.stderr.write(
            f"[parlab rank {prof.rank}] the script ran {prof.steps} optimizer steps, fewer than "
            f"the profile schedule's {prof.total_steps} (wait+warmup+active): no trace written\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
