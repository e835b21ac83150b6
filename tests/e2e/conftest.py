"""E2E tests reuse the real-server fixture of tests/serve."""

from tests.serve.conftest import served  # noqa: F401
