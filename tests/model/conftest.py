"""The model test's Hypothesis profiles (registered again here when only tests/model is collected
with a conftest that does not import them)."""

from tests.model import profiles  # noqa: F401
