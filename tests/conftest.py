"""Shared pytest configuration.

freezegun walks module attributes when it patches the clock and trips over the kubernetes client's lazily
built models, so the kubernetes package is excluded from its patching.

`api` (an empty fake API server, over real HTTP) and `api_client` (a client of it) are shared by every
test module that talks to a cluster; a module that needs the server pre-filled defines its own `api`.
"""

from __future__ import annotations

from collections.abc import Iterator

import freezegun
import pytest
from kubernetes import client

from tests.fake_apiserver import FakeApiServer

freezegun.configure(extend_ignore_list=["kubernetes"])


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api_client(api: FakeApiServer) -> Iterator[client.ApiClient]:
    with api.api_client() as api_client:
        yield api_client
