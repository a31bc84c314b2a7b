"""Hypothesis profiles of the model test (tests/model/test_model.py), registered by tests/conftest.py
so ``--hypothesis-profile=long`` works for the whole suite as well as for ``pytest tests/model``.

``model-ci`` (used by the model test when no profile is chosen): a fixed seed and a bounded number
of examples and steps. ``long``: many more examples and steps from a random seed (1000 examples, or
``CRON_MODEL_EXAMPLES``). Registering a
profile loads nothing: the model test applies ``model-ci`` to itself alone.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_SLOW_STEPS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "model-ci", derandomize=True, max_examples=100, stateful_step_count=50, deadline=None,
    suppress_health_check=_SLOW_STEPS, print_blob=True, database=None,
)
settings.register_profile(
    "long", max_examples=int(os.environ.get("CRON_MODEL_EXAMPLES", "1000")), stateful_step_count=80,
    deadline=None, suppress_health_check=_SLOW_STEPS, print_blob=True,
)
