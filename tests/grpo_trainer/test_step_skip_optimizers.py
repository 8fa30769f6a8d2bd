"""The skipped step outside DeepSpeed (trainer/guards/step_skip.py) drops every gradient before HF Trainer's
``optimizer.step()`` and relies on the optimizer then changing nothing: no weight, moment, step counter or weight
decay. Checked here for every optimizer HF Trainer's ``optim`` names that needs no package beyond torch and
transformers, as HF builds it (``Trainer.get_optimizer_cls_and_kwargs``), after one real step so each has state to
keep. (bitsandbytes', GaLore's, APOLLO's, torchao's, schedule-free's and the other optional optimizers are not
installed here; their ``step`` skips a parameter without ``.grad`` too, by reading, but that is not tested.)"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Trainer, TrainingArguments


def _build(name: str, model: torch.nn.Module, tmp_path) -> torch.optim.Optimizer:
    args = TrainingArguments(output_dir=str(tmp_path), optim=name, use_cpu=True, learning_rate=0.1, weight_decay=0.1,
                             report_to=[])
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    return cls(model.parameters(), **kwargs)


@pytest.mark.parametrize("name", ["adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop"])
def test_a_step_without_gradients_changes_nothing(name, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = _build(name, model, tmp_path)
    model(torch.randn(2, 4)).pow(2).sum().backward()
    optimizer.step()  # one real step: moments and counters exist
    weights = [p.detach().clone() for p in model.parameters()]
    state = copy.deepcopy(optimizer.state_dict())
    optimizer.zero_grad(set_to_none=True)
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters())), f"{name} moved a weight"
    assert str(optimizer.state_dict()) == str(state), f"{name} changed its state"
