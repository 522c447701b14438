"""``parlab doctor``: why is multi-GPU not faster? Answered from the documents.

- ``cases``: the case collection (symptom, evidence fields, detector,
  explanation, what to try), as data.
- ``diagnose``: every detector over a results folder.
- ``reproduce``: small experiments that show a case beside a healthy twin.
- ``timeout_rank``: the rank of the collective-timeout reproduction (torch alone).
"""

from parlab.doctor.cases import BY_ID, CASES, Case, Finding
from parlab.doctor.diagnose import Diagnosis, diagnose

__all__ = ["BY_ID", "CASES", "Case", "Diagnosis", "Finding", "diagnose"]
