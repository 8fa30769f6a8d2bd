"""How a guard or stage ends a run early: one place for the message, the log record and the final save."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def stop_training(state: Any, control: Any, message: str) -> Any:
    """Stop after this step with ``message`` (a warning, and ``winnow_stop_reason`` in the log history, where
    metrics.jsonl and the tests read it) and save a checkpoint of the step, so the stopped run can be inspected
    or resumed. Returns ``control``."""
    logger.warning(message)
    state.log_history.append({"step": state.global_step, "winnow_stop_reason": message})
    control.should_training_stop = True
    control.should_save = True
    return control
