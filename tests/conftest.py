"""Suite-wide settings shared by the unit and end-to-end tests.

Hypothesis: one profile for the whole suite. Generated inputs here are wide (annotation maps, extender bodies)
and the CI machine is small and often busy, so timing must never decide a result: no per-example deadline, no
"input generation is slow" or "too slow" health checks, and a bounded number of examples so a run's length is
predictable. ``HYPOTHESIS_PROFILE=thorough`` runs many more examples for a local deep check.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_NOT_ABOUT_CORRECTNESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]

for _name, _examples in (("suite", 100), ("thorough", 2000)):
    settings.register_profile(
        _name,
        deadline=None,
        max_examples=_examples,
        suppress_health_check=_NOT_ABOUT_CORRECTNESS,
        print_blob=True,
    )
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))
