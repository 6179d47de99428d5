"""Hypothesis profiles of the suite; tests/conftest.py calls :func:`load` before any test module is imported.

``ci`` (CI, and the whole suite of ``bash scripts/test.sh``): 100 examples per property unless the test asks
for another count through :func:`examples`, which is that count under ``ci``. ``dev`` (``bash scripts/test.sh
--fast``, and a bare ``pytest`` outside CI): a tenth, at least 5, for the edit loop; the example database
is kept so a failure found once is tried first next time. The profile is ``SERVELAB_HYPOTHESIS_PROFILE``
when set, else ``ci`` when ``CI=true``, else ``dev``.

A test that names its own count writes ``@settings(max_examples=examples(400), deadline=None)`` (a bare
``max_examples=400`` would override the profile and run 400 in the edit loop too).
"""

from __future__ import annotations

import os

from hypothesis import settings

CI_EXAMPLES = 100  # hypothesis's own default
DEV_DIVISOR = 10


def profile_name() -> str:
    """The profile this run uses (see the module doc)."""
    chosen = os.environ.get("SERVELAB_HYPOTHESIS_PROFILE")
    if chosen:
        return chosen
    return "ci" if os.environ.get("CI") == "true" else "dev"


def load() -> str:
    """Register both profiles and load the chosen one; returns its name."""
    settings.register_profile("ci", max_examples=CI_EXAMPLES, deadline=None, database=None, print_blob=True)
    settings.register_profile("dev", max_examples=max(5, CI_EXAMPLES // DEV_DIVISOR), deadline=None)
    name = profile_name()
    settings.load_profile(name)
    return name


def examples(ci: int) -> int:
    """``ci`` examples under the ci profile, scaled by the loaded profile otherwise (at least 5, or ``ci`` if
    smaller)."""
    scaled = round(ci * settings.default.max_examples / CI_EXAMPLES)
    return max(min(ci, 5), scaled)
