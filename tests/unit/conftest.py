"""The unit layer's one fixture: test_purity's fresh interpreters run without coverage.

Those tests start ``python -c "import kapok.x; ..."`` and list what the import loaded; when
build/test.sh measures coverage, ``[run] patch = subprocess`` starts coverage in every
Python process the tests start, and coverage itself loads ``socket`` and ``selectors``
before kapok is imported. Without the variables that carry coverage's configuration, the
interpreter is as fresh as the tests mean it to be (and the few imports go unmeasured).
"""

from __future__ import annotations

import pytest

# The blocking-call detector of the integration layer, here too (see its conftest): a unit
# test whose code under test blocks a running event loop fails.
from tests.integration.conftest import blocking_calls  # noqa: F401


@pytest.fixture(autouse=True)
def _fresh_interpreters_unmeasured(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.path.name == "test_purity.py":
        monkeypatch.delenv("COVERAGE_PROCESS_CONFIG", raising=False)
        monkeypatch.delenv("COVERAGE_PROCESS_START", raising=False)
