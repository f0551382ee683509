"""Who holds a lease: ``host:pid:run_id``, the host and pid asked of the system once per process."""

import os
import socket

import pytest

from forkkit import in_forked_child
from we0nb.persistence.base import lease_owner


def test_owner_names_this_host_and_process_and_the_run() -> None:
    assert lease_owner("run_1") == f"{socket.gethostname()}:{os.getpid()}:run_1"
    assert lease_owner("") == f"{socket.gethostname()}:{os.getpid()}:"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_names_its_own_pid() -> None:
    lease_owner("run_1")  # (the parent's host and pid are known before the fork)
    # the child's leases must not look like its parent's (a live owner's)
    child, owner = in_forked_child(lambda: f"{os.getpid()} {lease_owner('run_2')}").split(" ", 1)
    assert owner == f"{socket.gethostname()}:{child}:run_2" and int(child) != os.getpid()
