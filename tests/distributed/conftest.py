"""One local Ray cluster (2 CPUs, loopback only) shared by the Ray tests of this folder; skipped without Ray."""

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'trace-rl[distributed]')")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()
