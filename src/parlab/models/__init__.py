"""parlab.models: model specs (catalog and Hugging Face configs), FLOPs, the reference model.

``get_spec(name)`` and ``list_specs()`` come from ``parlab.models.catalog``;
``ModelSpec`` from ``parlab.models.spec``; the torch model from
``parlab.models.reference.build_model`` (imported lazily: the analytic side
needs no torch).
"""

from parlab.models.catalog import get_spec, list_specs
from parlab.models.spec import ModelSpec
from parlab.models.variants import MLASpec, MoESpec

__all__ = ["MLASpec", "MoESpec", "ModelSpec", "get_spec", "list_specs"]
