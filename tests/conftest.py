"""Shared pytest configuration.

freezegun walks module attributes when it patches the clock and trips over the kubernetes client's lazily
built models, so the kubernetes package is excluded from its patching.

`api` (an empty fake API server, over real HTTP) and `api_client` (a client of it) are shared by every
test module that talks to a cluster; a module that needs the server pre-filled defines its own `api`.
`scale_population` is bench/scale_population.py, the scale benchmark's cluster generator, loaded as a
module. `frozen_heap` is for tests that time a lease's margins in fractions of a second: late in a whole
run the heap is large, and a full collection in the middle of the timed window (not what is being
tested) would eat the margin.

Every exposition document any test reads in-process, and that the exposition reader reads itself instead
of handing it to prometheus_client, is also read by prometheus_client and the two compared
(tests/exposition_differential.py): a difference fails the test that read it.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import freezegun
import pytest
from kubernetes import client

from rebalancer.telemetry import exposition, exposition_documents
from tests.exposition_differential import checking_documents
from tests.fake_apiserver import FakeApiServer

freezegun.configure(extend_ignore_list=["kubernetes"])


@pytest.fixture(autouse=True, scope="session")
def _expositions_read_as_prometheus_client_reads_them() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(exposition, "documents", checking_documents(exposition_documents.documents))
        yield


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api_client(api: FakeApiServer) -> Iterator[client.ApiClient]:
    with api.api_client() as api_client:
        yield api_client


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """The heap so far collected once and frozen (as the one-shot commands do), so that collections during
    the test only visit what it allocates; unfrozen after."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture(scope="session")
def scale_population() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "bench" / "scale_population.py"
    spec = importlib.util.spec_from_file_location("bench_scale_population", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module
