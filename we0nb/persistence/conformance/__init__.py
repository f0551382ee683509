"""Store conformance: the persistence port's contract as checks any store runs against itself.

In the spirit of LangGraph's ``checkpoint-conformance``: each check belongs to a capability of
the port (:mod:`we0nb.persistence.base`) and runs only on a store that has it — sessions and
transcripts, the session lease, the batch queue, the frames' column reads, the scores, copies made
in the store (what makes a fork cheap) — so a third-party
store declares what it is by the capabilities it implements, and passes the checks of those.
MemoryPersistence (which has no copies) and SqlPersistence (SQLite inline and through aiosqlite,
PostgreSQL through psycopg and through SQLAlchemy) pass them all (``tests/test_store_conformance.py``).

Run them all at once::

    from we0nb.persistence.conformance import validate

    report = await validate(lambda: MyStore("..."), reset=empty_my_data)   # make: a store on the same data;
    assert report.ok, report                                                 # reset: empty it before each check

or one pytest test per check::

    from we0nb.persistence.conformance import CHECKS, Harness

    @pytest.mark.parametrize("check", CHECKS, ids=str)
    async def test_my_store(check):
        async with Harness(lambda: MyStore("...")) as h:
            if not check.applies(h):
                pytest.skip(check.missing(h))
            await check.run(h)

``make`` returns a store on the test's database — a new instance on the same data each call where
the store has instances (a second process's view: leases must exclude each other across them),
or the same instance. ``expire_lease`` (optional) makes a session's lease look as if its run
stopped renewing it on another host: the checks of takeover and renewal need it (a store whose
leases never expire skips them). Every check starts from empty data and uses its own ids.
"""

from __future__ import annotations

import inspect
import traceback
from typing import Any, Awaitable, Callable, Optional, Union

from . import batch_checks, column_checks, copy_checks, lease_checks, score_checks, session_checks
from .harness import CAPABILITIES, REQUIRED, Check, ExpireLease, Harness, MissingCapability, Report

__all__ = ["Harness", "Check", "CHECKS", "Report", "validate", "CAPABILITIES", "REQUIRED", "MissingCapability"]

#: every check, in the order :func:`validate` runs them
CHECKS: list[Check] = [*session_checks.CHECKS, *lease_checks.CHECKS, *batch_checks.CHECKS, *column_checks.CHECKS,
                       *score_checks.CHECKS, *copy_checks.CHECKS]


async def validate(make: Callable[[], Any], *, expire_lease: Optional[ExpireLease] = None,
                   reset: Optional[Callable[[], Union[None, Awaitable[None]]]] = None) -> Report:
    """Run every check on stores from ``make`` (a fresh harness each); ``reset`` empties the data
    between checks when ``make`` does not give a new, empty database by itself."""
    report = Report()
    for check in CHECKS:
        if reset is not None:
            got = reset()
            if inspect.isawaitable(got):
                await got
        async with Harness(make, expire_lease=expire_lease) as h:
            if not check.applies(h):
                report.results[check.name] = f"skipped: {check.missing(h)}"
                continue
            try:
                await check.run(h)
            except MissingCapability as e:  # (one line: what is missing; no traceback to read)
                report.results[check.name] = f"FAILED: {e}"
            except Exception as e:  # on purpose: a report of every check, not the first failure
                report.results[check.name] = f"FAILED: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
            else:
                report.results[check.name] = "passed"
    return report
