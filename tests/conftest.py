import os

# OpenMP threads (XGBoost's, LightGBM's, our kernels') sleep when idle instead of spinning:
# with several test processes on two cores, spinning threads take the CPU from the tests that
# have work (measured: the XGBoost categorical tests 31.8 s wall alone, 15.1 s with this).
# Set before anything loads an OpenMP runtime; child processes inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

pytest_plugins = ["tests.kafka_broker"]


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    """The tests' XGBoost binary model (tests/models.py), compiled once for the session."""
    import worker
    from tests import models as M

    path = tmp_path_factory.mktemp("model") / "fraud.model"
    worker.compile_model(M.xgboost_models()["xgb-binary-logistic"]).save(path)
    return path


# Parallel runs (tests/run.sh: pytest-xdist, --dist loadgroup): the tests that share one
# broker-side resource they change run in one worker process, in order: the secured brokers'
# users and ACLs are changed by their tests. Everything else on the single broker uses
# topics, groups and transactional ids of its own and runs anywhere.
# The three-node cluster's tests run in the serial phase, alone: under the parallel phase's
# load a node restarted after its kill failed to register with the controller quorum in time,
# and the group coordinator's recovery after a whole-cluster restart outlasted the test's
# wait (clean-clone runs, 2026-12-04).
_GROUPS = {"test_security.py": "security"}
_SERIAL = {"test_cluster.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _GROUPS.get(item.path.name)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if item.path.name in _SERIAL:
            item.add_marker(pytest.mark.serial)
