"""parlab.comm: the collectives, what they exchange, what they cost, and how fast they run (T1).

- ``ops``: op semantics (what size S means, nccl-tests' busbw factors and size
  rounding), dtypes per backend, exact check patterns. Analytic.
- ``model``: the alpha-beta cost model (ring, tree, hierarchical) and the
  topology's link peak. Analytic.
- ``calibration``: the alpha-beta fit of a measured sweep, the calibration
  document, and ``load_calibration(path_or_dir)`` for the planner.
- ``bench``: the rank function that checks and times every (op, size).
- ``sweep``: the driver (launch through torchrun, progress, Ctrl-C) and the
  sweep document; ``report``: the nccl-tests-style table and the busbw plot.
- ``explain``: the T1 table from ``parlab.ledger.traffic`` and a calibration.
"""
