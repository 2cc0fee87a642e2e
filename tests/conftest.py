import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_keras_state():
    """Each test starts from the float32 policy, a fixed seed and fresh layer names."""
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session()
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
