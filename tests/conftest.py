import pytest

pytest_plugins = ["tests.kafka_broker"]


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    """The tests' XGBoost binary model (tests/models.py), compiled once for the session."""
    import worker
    from tests import models as M

    path = tmp_path_factory.mktemp("model") / "fraud.model"
    worker.compile_model(M.xgboost_models()["xgb-binary-logistic"]).save(path)
    return path
