"""A fourth method from outside the package, for tests/methods/test_method_from_outside.py: RLOO's leave-one-out
advantage (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
Feedback in LLMs", Sec. 3.2: A_i = R_i - mean of the other G - 1 rewards of the group), as a user would add it -- its
folder (fields, stage, this file) and one line, ``catalog.add(METHOD)``, with no file of trainer/ edited."""

from rloo_method import stage
from rloo_method.fields import RLOOFields
from trainer.methods.method import Method

METHOD = Method("test_outside_rloo", fields=RLOOFields, registers=(stage,))
