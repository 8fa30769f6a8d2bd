"""The stage pipeline and the batch it runs on: the registry and pipeline (``stages``), the per-row
``RolloutBatch`` (``batch``), batch compaction and the dealing of kept rows to optimizer steps, token-budget
micro-batches, the entropy bonus, the trained-batch metrics and per-phase timing.
"""
