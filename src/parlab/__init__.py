"""parlab: a lab for multi-GPU parallelism and communication.

It answers three questions with evidence -- can it fit, can it be faster, is
the cost acceptable -- by measuring real collectives, training and serving,
modelling them, and writing every answer as a ``distributed-benchmark/v1``
contract document.
"""

__version__ = "0.1.0"
