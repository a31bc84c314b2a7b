"""Sample jobs of the example project (see tasks.py)."""
