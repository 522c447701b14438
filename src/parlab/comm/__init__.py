"""parlab.comm: the collectives, what they exchange, what they cost, and how fast they run (T1).

- ``ops``: op semantics (what size S means, nccl-tests' busbw factors and size
  rounding), dtypes per backend. Analytic. ``patterns``: the exact check patterns.
- ``model``: the alpha-beta cost model (ring, tree, hierarchical) and the
  topology's link peak. Analytic.
- ``calibration``: the alpha-beta fit of a measured sweep, the calibration
  document, and ``load_calibration(path_or_dir)`` for the planner.
- ``bench``: the rank function that checks and times every (op, size); ``case``: one
  (op, size)'s buffers, op closure and check.
- ``nccl_direct``: ``DirectComm``, NCCL called without c10d; ``nccl_library``: its ctypes
  binding and library discovery.
- ``sweep``: the driver (launch through torchrun, progress, Ctrl-C) and the
  sweep document; ``report``: the nccl-tests-style table and the busbw plot.
- ``explain``: the T1 table from ``parlab.ledger.traffic`` and a calibration.
"""
